//! Report aggregation, free of I/O (docs/architecture.md, "Report rules"). The
//! same [`build`] makes the final report and the partial one served while a
//! job runs. Each file judges one thing, in the order `build` calls them:
//!
//! - [`ranks`]: each rank's own result (pass, fail, incomplete and why);
//! - [`digests`]: silent data corruption, by majority vote of digests;
//! - [`shards`]: fsdp shards against what every rank gathered of them;
//! - [`collectives`]: wrong elements fail ranks; one bandwidth table;
//! - the checks of [`super::checks`], each in its folder: performance
//!   figures ([`perf`](super::checks::perf)), node pairs
//!   ([`links`](super::checks::links)), GPU pairs ([`p2p`](super::checks::p2p)),
//!   the workers' searches ([`bisect`](super::checks::bisect),
//!   [`search`](super::checks::search)), the GPU telemetry checks (through
//!   the telemetry summary) and preflight ([`preflight`](super::checks::preflight));
//! - [`onto`]: their answers placed on ranks and nodes (a failing GPU fails
//!   its ranks, or its node; a slow figure or pair its rank);
//! - [`findings`]: everything that failed or warned, in one list, made into
//!   the wire's findings once;
//! - [`nodes`]: node verdicts from their ranks, GPUs and findings;
//! - [`notes`]: library versions the ranks ran with;
//! - [`verdict`]: the job's verdict and reason;
//! - the rank blamed when the job hung is decided by the job's timing rules
//!   ([`crate::jobs::hang`]), applied by [`ranks`], with where every rank was.
//!
//! A job that failed for its request (`gpuctl_core::request`) judges no
//! node: its ranks and nodes are not judged (unspecified) unless their own
//! GPUs or figures failed, and one job finding says what the request was.
//!
//! Judges only ever fail a rank further, so a reason added early stays first.

use crate::jobs::hang;

mod collectives;
mod digests;
mod findings;
mod loader;
mod nodes;
mod notes;
mod onto;
mod plausible;
mod ranks;
mod shards;
#[cfg(test)]
mod tests;
mod verdict;

use std::collections::BTreeMap;

use gpuctl_proto::pb::{Job, Plan, RankProgress, RankResult, Report, Verdict, WorkerExited};

use super::checks::health::HealthRules;
use super::checks::perf::rules::PerfRules;
use super::checks::{bisect, idle, links, nvlink, p2p, perf, preflight, search};
use super::figures::Figures;
use super::telemetry::Telemetry;

pub use collectives::{aggregate_collectives, algbw_gbps, busbw_factor};
pub use nodes::unreached;
pub use ranks::{exit_text, rank_label, undelivered};
pub use verdict::ranks_verdict;

/// From this many GPUs on, their telemetry is summarised on a thread of
/// its own while the ranks are judged.
const SUMMARY_BESIDE_GPUS: usize = 1_024;

/// What a report is built from.
pub struct Inputs<'a> {
    pub job: &'a Job,
    pub results: &'a BTreeMap<u32, RankResult>,
    /// Worker exits seen while the coordinator ran (not stored: they only
    /// explain incomplete ranks).
    pub exits: &'a BTreeMap<u32, WorkerExited>,
    /// Each rank's last progress report (kept in memory while the
    /// coordinator runs, like `exits`).
    pub progress: &'a BTreeMap<u32, RankProgress>,
    /// Progress clocks, process states and the hung rank, if any.
    pub watch: &'a hang::Watch,
    pub telemetry: &'a Telemetry,
    pub rules: &'a HealthRules,
    pub perf: &'a PerfRules,
    pub now_ms: u64,
}

/// Builds the report of a job from whatever results exist, all but
/// `telemetry_bytes`, which its caller knows or measures.
pub fn build(inp: &Inputs) -> Report {
    assemble(inp, true).0
}

/// As [`build`], with every rank's `result` left empty for [`attach`] to
/// move in (a report of 32,768 ranks would otherwise hold a second copy of
/// a hundred MB of results), and the figures it was judged with.
pub fn build_bare(inp: &Inputs) -> (Report, Figures) {
    assemble(inp, false)
}

/// Moves each rank's result into a report made by [`build_bare`].
pub fn attach(report: &mut Report, mut results: BTreeMap<u32, RankResult>) {
    for r in report.nodes.iter_mut().flat_map(|n| &mut n.ranks) {
        r.result = results.remove(&r.rank).map(Box::new);
    }
}

fn assemble(inp: &Inputs, with_results: bool) -> (Report, Figures) {
    // A rank stopped before its end may have sent what it measured until
    // then (`RankResult.partial`): evidence for its links, never a rank's
    // result. Copied only when there is one (a 32,768-rank map otherwise).
    let whole: BTreeMap<u32, RankResult>;
    let all = inp.results;
    let trimmed;
    let inp = if all.values().any(|r| r.partial) {
        whole = all
            .iter()
            .filter(|(_, r)| !r.partial)
            .map(|(k, r)| (*k, r.clone()))
            .collect();
        trimmed = Inputs {
            results: &whole,
            ..*inp
        };
        &trimmed
    } else {
        inp
    };
    let job = inp.job;
    let spec = job.spec.clone().unwrap_or_default();
    // Borrowed: a 4,096-node job's plan has 32,768 placements.
    let no_plan = Plan::default();
    let plan = job.plan.as_ref().unwrap_or(&no_plan);

    let request = request_failure(job, inp.results);
    let windows = idle::measured_windows(&spec.workload, plan, inp.results);
    let (mut states, sdc_note, mut notes, (mut telemetry, mut health)) = std::thread::scope(|s| {
        // At 32,768 GPUs the telemetry summary is a third of judging, and
        // needs nothing the ranks' own checks make: it is made beside them.
        let beside = (inp.telemetry.gpus() >= SUMMARY_BESIDE_GPUS)
            .then(|| s.spawn(|| inp.telemetry.summarise(inp.rules, &windows)));
        let mut states = ranks::from_results(
            job,
            plan,
            inp.results,
            inp.exits,
            &inp.watch.hung,
            request.is_some(),
        );
        let sdc_note = digests::stress(inp.results, &mut states);
        plausible::stress(inp.results, &mut states);
        let notes: Vec<String> = digests::params(inp.results, &spec, &mut states)
            .into_iter()
            .chain(shards::check(inp.results, &spec, &mut states))
            .collect();
        let summary = match beside {
            Some(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
            None => inp.telemetry.summarise(inp.rules, &windows),
        };
        (states, sdc_note, notes, summary)
    });
    collectives::fail_wrong_elements(inp.results, &mut states);
    let table = aggregate_collectives(inp.results.values());
    if !table.is_empty() {
        notes.push(format!(
            "busbw at the sizes judged ({} and up, or the largest) is the median of {} timed runs of --iters operations each; other sizes are one run, as nccl-tests",
            gpuctl_core::units::format_bytes(gpuctl_core::catalogue::BUSBW_MIN_BYTES),
            gpuctl_core::catalogue::JUDGED_RUNS
        ));
    }
    let mut found = findings::of_ranks(plan, &states);
    let rules = perf::job::rules(inp.perf, &spec, &mut notes);
    let perf = perf::job::judge(job, inp.results, &spec, plan, &table, &rules);
    onto::performance(&perf.findings, &mut states);
    let links = links::judge(all, &plan.nodes, rules.link_slow_ratio);
    let pairs = p2p::judge(inp.results, plan, rules.p2p);
    onto::pairs(&pairs.findings, &mut states);
    // A link down fails its GPU only where the job's own bandwidth agrees.
    nvlink::confirm_nvlink(
        &mut health,
        perf.findings
            .iter()
            .chain(&links.findings)
            .chain(&pairs.findings),
        &plan.nodes,
        inp.rules,
    );
    onto::fail_summaries(&health, &mut telemetry);
    let gpu_faults = onto::health(&health, plan, &mut states);
    found.extend(perf.findings);
    found.extend(links.findings);
    found.extend(pairs.findings);
    // `--pattern search` reports its rounds as bisect does, and more.
    let bisect = if spec.params.get("pattern").map(String::as_str) == Some("search") {
        search::judge(inp.results, plan, &search::Size::of(&spec, plan))
    } else {
        bisect::judge(inp.results, plan)
    };
    found.extend(bisect.findings);
    found.extend(findings::fired(&health));
    found.extend(findings::fired(&preflight::checks(job)));
    found.extend(request.as_deref().map(findings::of_request));
    findings::sort(&mut found);
    let found: Vec<_> = found.iter().map(findings::finding).collect();
    let health = health.iter().map(findings::health).collect();
    // A partial result is shown on its rank: what it measured, and why it stopped.
    let attached = with_results.then_some(all);
    let mut nodes = nodes::verdicts(plan, &states, attached, gpu_faults, &found);
    if request.is_some() {
        nodes::not_judged(&mut nodes);
    }
    ranks::fill_where(&mut nodes, inp.progress, inp.watch);
    notes.extend(notes::mixed_torch(inp.results));
    notes.extend(perf.notes);
    notes.extend(links.notes);
    notes.extend(pairs.notes);
    notes.extend(bisect.notes);

    let hang_timeout_ms = crate::jobs::timing::hang_timeout(Some(&spec));
    let mut report = Report {
        job_id: job.id.clone(),
        workload: spec.workload.clone(),
        state: job.state,
        verdict: Verdict::Unspecified as i32,
        reason: String::new(),
        duration_ms: duration_ms(job, inp.now_ms),
        started_unix_ms: job.started_unix_ms,
        finished_unix_ms: job.finished_unix_ms,
        nodes,
        collectives: table,
        env: plan.env.clone(),
        sdc_note,
        spec: Some(spec),
        world_size: plan.world_size,
        backend: collectives::backend(inp.results),
        nccl_version: notes::nccl_version(inp.results),
        notes,
        telemetry,
        health,
        preflight: preflight::of_job(job),
        findings: found,
        links: links.links.into_iter().chain(bisect.links).collect(),
        gpu_pairs: pairs.pairs,
        bisect: bisect.rounds,
        hang_timeout_ms,
        // Measured where the series are encoded for the store (at a job's
        // end that runs beside the build): 32,768 series take ~30 ms more.
        telemetry_bytes: 0,
        attempt: job.attempt,
        loader_gpu: loader::gpu_windows(plan, inp.results, inp.telemetry),
    };
    verdict::judge_job(&mut report, job, inp.results.len());
    (report, perf.figures)
}

/// Why the job could not run, when it failed for its request: its message
/// says so once it ended for it, a rank's result as soon as it is in.
fn request_failure(job: &Job, results: &BTreeMap<u32, RankResult>) -> Option<String> {
    use gpuctl_core::request;
    if request::is_job_message(&job.message) {
        return Some(job.message.clone());
    }
    results
        .values()
        .filter(|r| !r.ok)
        .find_map(|r| request::of_rank(&r.error))
        .map(|why| request::job_message(why, ""))
}

/// From start to finish, or to `now` while the job runs; 0 before it starts.
fn duration_ms(job: &Job, now_ms: u64) -> u64 {
    if job.started_unix_ms == 0 {
        return 0;
    }
    let end = if job.finished_unix_ms > 0 {
        job.finished_unix_ms
    } else {
        now_ms
    };
    end.saturating_sub(job.started_unix_ms)
}

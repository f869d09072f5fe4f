//! Report aggregation, free of I/O (docs/architecture.md, "Report rules"). The
//! same [`build`] makes the final report and the partial one served while a
//! job runs. Each file judges one thing, in the order `build` calls them:
//!
//! - [`ranks`]: each rank's own result (pass, fail, incomplete and why);
//! - [`digests`]: silent data corruption, by majority vote of digests;
//! - [`shards`]: fsdp shards against what every rank gathered of them;
//! - [`gpu_health`]: failing GPUs fail their ranks, or their node;
//! - [`collectives`]: wrong elements fail ranks; one bandwidth table;
//! - [`performance`]: figures against the fleet, a baseline and the floors;
//! - [`links`](super::links): node pairs' bandwidth against the median link;
//! - [`bisect`](super::bisect): the node the workers' search isolated, or
//!   [`search`](super::search): every node and link `--pattern search` blamed;
//! - [`p2p`](super::p2p): GPU pairs inside nodes against the job's other pairs;
//! - [`findings`]: everything that failed or warned, in one list;
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
mod gpu_health;
mod loader;
mod nodes;
mod notes;
mod performance;
mod plausible;
mod ranks;
mod shards;
#[cfg(test)]
mod tests;
mod verdict;

use std::collections::BTreeMap;

use gpuctl_proto::pb::{
    Job, Plan, PreflightCheck, RankProgress, RankResult, Report, Verdict, WorkerExited,
};

use super::figures::Figures;
use super::health::HealthRules;
use super::rules::PerfRules;
use super::telemetry::Telemetry;
use super::{bisect, links, p2p, search};

pub use collectives::{aggregate_collectives, algbw_gbps, busbw_factor};
pub use ranks::{exit_text, rank_label};
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
        r.result = results.remove(&r.rank);
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
    let windows = gpu_health::measured_windows(&spec.workload, plan, inp.results);
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
    let rules = performance::rules(inp.perf, &spec, &mut notes);
    let perf = performance::judge(inp, &spec, plan, &table, &rules, &mut states);
    let links = links::judge(all, &plan.nodes, rules.link_slow_ratio);
    let pairs = p2p::judge(inp.results, plan, rules.p2p);
    // A pair finding that names a rank (a culprit GPU, a slow direction's
    // sender) fails it, and so its node, as performance findings do.
    for f in pairs.findings.iter().filter(|f| f.level() == Verdict::Fail) {
        if let Some(st) = f.rank.and_then(|r| states.get_mut(&r)) {
            st.fail_from(ranks::Source::Performance, f.detail.clone());
        }
    }
    // A link down fails its GPU only where the job's own bandwidth agrees.
    gpu_health::confirm_nvlink(
        &mut health,
        perf.findings
            .iter()
            .chain(&links.findings)
            .chain(&pairs.findings),
        &plan.nodes,
        inp.rules,
    );
    gpu_health::fail_summaries(&health, &mut telemetry);
    let gpu_faults = gpu_health::apply(&health, plan, &mut states);
    found.extend(perf.findings);
    found.extend(links.findings);
    found.extend(pairs.findings);
    // `--pattern search` reports its rounds as bisect does, and more.
    let bisect = if spec.params.get("pattern").map(String::as_str) == Some("search") {
        search::judge(inp.results, &plan.nodes, &search::Size::of(&spec, plan))
    } else {
        bisect::judge(inp.results, &plan.nodes)
    };
    found.extend(bisect.findings);
    found.extend(findings::of_health(&health));
    let preflight = start_checks(job);
    found.extend(findings::of_preflight(&preflight));
    found.extend(request.as_deref().map(findings::of_request));
    findings::sort(&mut found);
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
        preflight,
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

/// The preflight checks of the job: the plan's, with each node's replaced by
/// those its agent ran when the assignment arrived.
fn start_checks(job: &Job) -> Vec<PreflightCheck> {
    let plan = job.plan.as_ref();
    let fresh: std::collections::BTreeSet<&str> =
        job.start_checks.iter().map(|c| c.node.as_str()).collect();
    let mut out: Vec<PreflightCheck> = plan
        .map(|p| p.checks.as_slice())
        .unwrap_or_default()
        .iter()
        .filter(|c| c.node.is_empty() || !fresh.contains(c.node.as_str()))
        .cloned()
        .collect();
    out.extend(job.start_checks.iter().cloned());
    out
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

//! Report aggregation, free of I/O (docs/architecture.md, "Report rules"): a
//! verdict per rank and per node, the silent-data-corruption comparison of
//! stress digests, and collective bandwidth tables recomputed across ranks the
//! way nccl-tests defines them. The same function builds the final report and the
//! partial one served while a job runs.

use std::collections::{BTreeMap, HashMap};

use super::health::HealthRules;
use super::telemetry::Telemetry;
use gpuctl_proto::pb::{
    rank_result::Detail, CollectiveRow, Job, JobState, NodeReport, RankPlacement, RankReport,
    RankResult, Report, Verdict, WorkerExited,
};

/// What a report is built from.
pub struct Inputs<'a> {
    pub job: &'a Job,
    pub results: &'a BTreeMap<u32, RankResult>,
    /// Worker exits seen while the coordinator ran (not stored: they only
    /// explain incomplete ranks).
    pub exits: &'a BTreeMap<u32, WorkerExited>,
    pub telemetry: &'a Telemetry,
    pub rules: &'a HealthRules,
    pub now_ms: u64,
}

/// nccl-tests' bus bandwidth factor: what each rank must move relative to the
/// buffer size, so numbers compare across rank counts.
pub fn busbw_factor(op: &str, nranks: u32) -> f64 {
    let n = nranks.max(1) as f64;
    match op {
        "all_reduce" => 2.0 * (n - 1.0) / n,
        "all_gather" | "reduce_scatter" | "alltoall" => (n - 1.0) / n,
        _ => 1.0,
    }
}

/// GB/s from bytes and microseconds (1 GB = 1e9 bytes, as nccl-tests prints).
pub fn algbw_gbps(bytes: u64, time_us: f64) -> f64 {
    if time_us > 0.0 {
        bytes as f64 / (time_us * 1e3)
    } else {
        0.0
    }
}

/// "rank 3 on node agent-1 (cuda:3)", how every failure names a rank.
pub fn rank_label(p: &RankPlacement) -> String {
    format!("rank {} on node {} ({})", p.rank, p.node, p.device_label())
}

/// How a worker ended, for messages: "exited with code 1: <last stderr line>".
pub fn exit_text(ex: &WorkerExited) -> String {
    let how = if !ex.killed_by.is_empty() {
        format!("was stopped by its agent ({})", ex.killed_by)
    } else if !ex.signal.is_empty() {
        format!("was killed by signal {}", ex.signal)
    } else {
        format!("exited with code {}", ex.exit_code)
    };
    match ex
        .stderr_tail
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
    {
        Some(line) => format!("{how}: {line}"),
        None => how,
    }
}

/// Rows across ranks grouped by (op, bytes, dtype) in first-seen order: the
/// slowest rank's time, bandwidths recomputed from it, `#wrong` summed.
pub fn aggregate_collectives<'a>(
    results: impl IntoIterator<Item = &'a RankResult>,
) -> Vec<CollectiveRow> {
    let mut rows: Vec<CollectiveRow> = Vec::new();
    let mut index: HashMap<(String, u64, String), usize> = HashMap::new();
    let mut world = 0u32;
    let mut contributors = 0u32;
    for r in results {
        let Some(Detail::Collectives(c)) = &r.detail else {
            continue;
        };
        world = world.max(c.world_size);
        contributors += 1;
        for row in &c.rows {
            let key = (row.op.clone(), row.bytes, row.dtype.clone());
            match index.get(&key) {
                Some(&i) => {
                    let agg = &mut rows[i];
                    agg.time_us = agg.time_us.max(row.time_us);
                    agg.time_us_ip = agg.time_us_ip.max(row.time_us_ip);
                    agg.wrong += row.wrong;
                    agg.wrong_ip += row.wrong_ip;
                }
                None => {
                    index.insert(key, rows.len());
                    rows.push(row.clone());
                }
            }
        }
    }
    let n = if world > 0 { world } else { contributors };
    for row in &mut rows {
        let f = busbw_factor(&row.op, n);
        row.algbw_gbps = algbw_gbps(row.bytes, row.time_us);
        row.busbw_gbps = row.algbw_gbps * f;
        row.algbw_gbps_ip = algbw_gbps(row.bytes, row.time_us_ip);
        row.busbw_gbps_ip = row.algbw_gbps_ip * f;
    }
    rows
}

/// Per-rank verdict being worked out.
struct RankState {
    verdict: Verdict,
    reasons: Vec<String>,
}

impl RankState {
    fn fail(&mut self, why: String) {
        self.verdict = Verdict::Fail;
        self.reasons.push(why);
    }
}

fn short(digest: &str) -> &str {
    &digest[..digest.len().min(16)]
}

/// Majority vote of digests within groups. Returns, per group, a sentence for
/// the report; fails the ranks that disagree.
fn vote(
    groups: BTreeMap<String, Vec<(u32, String)>>,
    states: &mut BTreeMap<u32, RankState>,
    what: &str,
) -> Vec<String> {
    let mut notes = Vec::new();
    for (class, members) in groups {
        let label = if class.is_empty() {
            "unclassified".to_string()
        } else {
            class
        };
        let n = members.len();
        if n < 2 {
            notes.push(format!("`{label}`: 1 rank, nothing to compare against"));
            continue;
        }
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, d) in &members {
            *counts.entry(d.as_str()).or_default() += 1;
        }
        let best = counts.values().copied().max().unwrap_or(0);
        let leaders: Vec<&str> = counts
            .iter()
            .filter(|(_, c)| **c == best)
            .map(|(d, _)| *d)
            .collect();
        if leaders.len() == 1 {
            let winner = leaders[0];
            let odd: Vec<&(u32, String)> = members.iter().filter(|(_, d)| d != winner).collect();
            for (rank, d) in &odd {
                if let Some(s) = states.get_mut(rank) {
                    s.fail(format!(
                        "silent data corruption: {what} {} differs from {} shared by {best} of {n} ranks in class `{label}`",
                        short(d),
                        short(winner)
                    ));
                }
            }
            notes.push(if odd.is_empty() {
                format!("`{label}`: {n} ranks agree")
            } else {
                format!(
                    "`{label}`: {} of {n} ranks differ from the majority",
                    odd.len()
                )
            });
        } else {
            for (rank, d) in &members {
                if let Some(s) = states.get_mut(rank) {
                    s.fail(format!(
                        "{what}s disagree with no majority in class `{label}` (this rank: {}); rerun on more GPUs to find the odd one",
                        short(d)
                    ));
                }
            }
            notes.push(format!("`{label}`: {n} ranks, no majority"));
        }
    }
    notes
}

/// Builds the report of a job from whatever results exist.
pub fn build(inp: &Inputs) -> Report {
    let job = inp.job;
    let spec = job.spec.clone().unwrap_or_default();
    let plan = job.plan.clone().unwrap_or_default();
    let state = job.state();

    let mut states: BTreeMap<u32, RankState> = BTreeMap::new();
    for p in &plan.ranks {
        let st = match inp.results.get(&p.rank) {
            Some(r) if r.ok => RankState {
                verdict: Verdict::Pass,
                reasons: vec![],
            },
            Some(r) => RankState {
                verdict: Verdict::Fail,
                reasons: vec![if r.error.is_empty() {
                    "the worker reported a failure".into()
                } else {
                    r.error.clone()
                }],
            },
            None => {
                let why = match inp.exits.get(&p.rank) {
                    Some(ex) => format!("no result: the worker {}", exit_text(ex)),
                    None => match state {
                        JobState::Pending | JobState::Unspecified => "not started".into(),
                        JobState::Running => "running, no result yet".into(),
                        _ if job.message.is_empty() => "no result".into(),
                        _ => format!("no result: {}", job.message),
                    },
                };
                RankState {
                    verdict: Verdict::Incomplete,
                    reasons: vec![why],
                }
            }
        };
        states.insert(p.rank, st);
    }

    // Stress: digests compared only within a device class (cuBLAS promises
    // bit-identical products only for one architecture, SM count and library).
    let mut notes = Vec::new();
    let mut sdc_note = String::new();
    let mut stress_groups: BTreeMap<String, Vec<(u32, String)>> = BTreeMap::new();
    for (rank, r) in inp.results {
        if let Some(Detail::Stress(s)) = &r.detail {
            if s.self_mismatches > 0 {
                if let Some(st) = states.get_mut(rank) {
                    st.fail(format!(
                        "silent data corruption: the result digest changed during the run ({} of {} checks differed from the first)",
                        s.self_mismatches, s.checks
                    ));
                }
            }
            if !s.digest.is_empty() {
                stress_groups
                    .entry(s.device_class.clone())
                    .or_default()
                    .push((*rank, s.digest.clone()));
            }
        }
    }
    if !stress_groups.is_empty() {
        let classes = stress_groups.len();
        let parts = vote(stress_groups, &mut states, "result digest");
        sdc_note = format!(
            "stress digests compared bit for bit within {} device class{}: {}. cuBLAS promises identical results only for the same GPU model, SM count and library version, so ranks are compared only within a class.",
            classes,
            if classes == 1 { "" } else { "es" },
            parts.join("; ")
        );
    }

    // DDP: every rank applies the same averaged gradients, so parameters must end
    // identical; compared per device model.
    let mut train_groups: BTreeMap<String, Vec<(u32, String)>> = BTreeMap::new();
    for (rank, r) in inp.results {
        if let Some(Detail::Train(t)) = &r.detail {
            let ddp = t.mode == "ddp" || (t.mode.is_empty() && spec.workload == "ddp");
            if ddp && !t.param_digest.is_empty() {
                train_groups
                    .entry(r.device_name.clone())
                    .or_default()
                    .push((*rank, t.param_digest.clone()));
            }
        }
    }
    if !train_groups.is_empty() {
        let parts = vote(train_groups, &mut states, "parameter digest");
        notes.push(format!(
            "DDP parameters after training compared across ranks: {}",
            parts.join("; ")
        ));
    }

    // GPU health: a failing GPU fails the ranks on it and its node. Ranks are
    // matched by UUID, else by NVML index; a failing GPU that no
    // rank ran on still fails its node.
    let (telemetry, health) = inp.telemetry.summarise(inp.rules);
    let mut node_faults: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in health.iter().filter(|f| f.verdict() == Verdict::Fail) {
        let why = format!("GPU {} health `{}`: {}", f.gpu_index, f.rule, f.detail);
        let on_gpu: Vec<u32> = plan
            .ranks
            .iter()
            .filter(|p| {
                p.node == f.node
                    && if !f.uuid.is_empty() && !p.gpu_uuid.is_empty() {
                        p.gpu_uuid == f.uuid
                    } else {
                        p.gpu_index == Some(f.gpu_index)
                    }
            })
            .map(|p| p.rank)
            .collect();
        for rank in &on_gpu {
            if let Some(st) = states.get_mut(rank) {
                st.fail(why.clone());
            }
        }
        if on_gpu.is_empty() {
            node_faults.entry(f.node.clone()).or_default().push(why);
        }
    }

    // A collective that produced wrong elements fails its rank even if the
    // worker called it ok.
    for (rank, r) in inp.results {
        if let Some(Detail::Collectives(c)) = &r.detail {
            let bad: Vec<String> = c
                .rows
                .iter()
                .filter(|row| row.wrong + row.wrong_ip > 0)
                .take(3)
                .map(|row| {
                    format!(
                        "{} {} B {}: {} wrong",
                        row.op,
                        row.bytes,
                        row.dtype,
                        row.wrong + row.wrong_ip
                    )
                })
                .collect();
            if !bad.is_empty() {
                if let Some(st) = states.get_mut(rank) {
                    if st.verdict == Verdict::Pass {
                        st.fail(format!("wrong elements in collectives: {}", bad.join(", ")));
                    }
                }
            }
        }
    }

    let mut nodes = Vec::new();
    for name in &plan.nodes {
        let mut ranks = Vec::new();
        for p in plan.ranks.iter().filter(|p| &p.node == name) {
            let st = &states[&p.rank];
            ranks.push(RankReport {
                rank: p.rank,
                local_rank: p.local_rank,
                device: p.device_label(),
                device_name: p.device_name.clone(),
                gpu_uuid: p.gpu_uuid.clone(),
                verdict: st.verdict as i32,
                reason: st.reasons.join("; "),
                result: inp.results.get(&p.rank).cloned(),
            });
        }
        let failed: Vec<String> = ranks
            .iter()
            .filter(|r| r.verdict() == Verdict::Fail)
            .map(|r| r.rank.to_string())
            .collect();
        let incomplete: Vec<String> = ranks
            .iter()
            .filter(|r| r.verdict() == Verdict::Incomplete)
            .map(|r| r.rank.to_string())
            .collect();
        let faults = node_faults.remove(name).unwrap_or_default();
        let (verdict, reason) = if !failed.is_empty() || !faults.is_empty() {
            let mut why = faults;
            if !failed.is_empty() {
                why.insert(0, format!("{} failed", ranks_word(&failed)));
            }
            (Verdict::Fail, why.join("; "))
        } else if !incomplete.is_empty() {
            (
                Verdict::Incomplete,
                format!("{} incomplete", ranks_word(&incomplete)),
            )
        } else {
            (Verdict::Pass, String::new())
        };
        nodes.push(NodeReport {
            name: name.clone(),
            verdict: verdict as i32,
            reason,
            ranks,
        });
    }

    let collectives = aggregate_collectives(inp.results.values());
    let backend = inp
        .results
        .values()
        .find_map(|r| match &r.detail {
            Some(Detail::Collectives(c)) if !c.backend.is_empty() => Some(c.backend.clone()),
            _ => None,
        })
        .unwrap_or_default();
    let nccl_version = inp
        .results
        .values()
        .map(|r| r.nccl_version.clone())
        .find(|v| !v.is_empty())
        .unwrap_or_default();
    let mut torch: Vec<&str> = inp
        .results
        .values()
        .map(|r| r.torch_version.as_str())
        .filter(|v| !v.is_empty())
        .collect();
    torch.sort();
    torch.dedup();
    if torch.len() > 1 {
        notes.push(format!(
            "ranks ran different libtorch versions: {}",
            torch.join(", ")
        ));
    }

    let mut report = Report {
        job_id: job.id.clone(),
        workload: spec.workload.clone(),
        state: job.state,
        verdict: Verdict::Unspecified as i32,
        reason: String::new(),
        duration_ms: if job.started_unix_ms > 0 {
            let end = if job.finished_unix_ms > 0 {
                job.finished_unix_ms
            } else {
                inp.now_ms
            };
            end.saturating_sub(job.started_unix_ms)
        } else {
            0
        },
        started_unix_ms: job.started_unix_ms,
        finished_unix_ms: job.finished_unix_ms,
        nodes,
        collectives,
        env: plan.env.clone(),
        sdc_note,
        spec: Some(spec),
        world_size: plan.world_size,
        backend,
        nccl_version,
        notes,
        telemetry,
        health,
        preflight: plan.checks.clone(),
    };

    let (ranks_verdict, ranks_reason) = ranks_verdict(&report);
    let (verdict, reason) = match state {
        JobState::Succeeded => (ranks_verdict, ranks_reason),
        JobState::Failed => {
            let why = if ranks_verdict == Verdict::Fail && job.message.is_empty() {
                ranks_reason
            } else {
                job.message.clone()
            };
            (Verdict::Fail, why)
        }
        JobState::Cancelled => {
            let v = if ranks_verdict == Verdict::Fail {
                Verdict::Fail
            } else {
                Verdict::Incomplete
            };
            let msg = if job.message.is_empty() {
                "cancelled".to_string()
            } else {
                job.message.clone()
            };
            (v, msg)
        }
        JobState::Running | JobState::Pending | JobState::Unspecified => {
            let done = inp.results.len();
            report.notes.push(format!(
                "partial report: the job is {}, {done} of {} ranks reported",
                state.label(),
                plan.world_size
            ));
            if ranks_verdict == Verdict::Fail {
                (Verdict::Fail, ranks_reason)
            } else {
                (
                    Verdict::Incomplete,
                    format!(
                        "job {}; {done} of {} ranks reported",
                        state.label(),
                        plan.world_size
                    ),
                )
            }
        }
    };
    report.verdict = verdict as i32;
    report.reason = reason;
    report
}

fn ranks_word(ranks: &[String]) -> String {
    if ranks.len() == 1 {
        format!("rank {}", ranks[0])
    } else {
        format!("ranks {}", ranks.join(", "))
    }
}

/// The verdict of the ranks alone: fail names the failed ranks, node and
/// device; incomplete if any rank has no result; else pass.
pub fn ranks_verdict(report: &Report) -> (Verdict, String) {
    let all: Vec<(&NodeReport, &RankReport)> = report
        .nodes
        .iter()
        .flat_map(|n| n.ranks.iter().map(move |r| (n, r)))
        .collect();
    if all.is_empty() {
        return (Verdict::Incomplete, "no ranks were planned".into());
    }
    let failed: Vec<String> = all
        .iter()
        .filter(|(_, r)| r.verdict() == Verdict::Fail)
        .map(|(n, r)| {
            format!(
                "rank {} on node {} ({}): {}",
                r.rank, n.name, r.device, r.reason
            )
        })
        .collect();
    // A node failed by a GPU that no rank ran on.
    let node_only: Vec<String> = report
        .nodes
        .iter()
        .filter(|n| {
            n.verdict() == Verdict::Fail && n.ranks.iter().all(|r| r.verdict() != Verdict::Fail)
        })
        .map(|n| format!("node {}: {}", n.name, n.reason))
        .collect();
    if failed.is_empty() && !node_only.is_empty() {
        return (Verdict::Fail, node_only.join("; "));
    }
    if !failed.is_empty() {
        const SHOWN: usize = 5;
        let mut text = failed
            .iter()
            .take(SHOWN)
            .cloned()
            .collect::<Vec<_>>()
            .join("; ");
        if failed.len() > SHOWN {
            text += &format!("; and {} more", failed.len() - SHOWN);
        }
        return (
            Verdict::Fail,
            format!("{} of {} ranks failed: {text}", failed.len(), all.len()),
        );
    }
    let incomplete = all
        .iter()
        .filter(|(_, r)| r.verdict() == Verdict::Incomplete)
        .count();
    if incomplete > 0 {
        return (
            Verdict::Incomplete,
            format!("{incomplete} of {} ranks have no result", all.len()),
        );
    }
    (Verdict::Pass, format!("all {} ranks passed", all.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb::{CollectiveResult, Plan, StressResult};

    fn job(state: JobState, nodes: usize, per_node: u32) -> Job {
        let mut plan = Plan::default();
        for n in 0..nodes {
            plan.nodes.push(format!("node-{n}"));
            for l in 0..per_node {
                let rank = n as u32 * per_node + l;
                plan.ranks.push(RankPlacement {
                    rank,
                    local_rank: l,
                    node_rank: n as u32,
                    node: format!("node-{n}"),
                    gpu_index: Some(l),
                    ..Default::default()
                });
            }
        }
        plan.world_size = nodes as u32 * per_node;
        Job {
            id: "job-000007".into(),
            state: state as i32,
            spec: Some(gpuctl_proto::pb::JobSpec {
                workload: "stress".into(),
                ..Default::default()
            }),
            plan: Some(plan),
            started_unix_ms: 1_000,
            finished_unix_ms: 5_000,
            ..Default::default()
        }
    }

    fn stress(rank: u32, class: &str, digest: &str) -> RankResult {
        RankResult {
            rank,
            ok: true,
            detail: Some(Detail::Stress(StressResult {
                digest: digest.into(),
                device_class: class.into(),
                checks: 10,
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    fn build_with(job: &Job, results: Vec<RankResult>) -> Report {
        let results: BTreeMap<u32, RankResult> = results.into_iter().map(|r| (r.rank, r)).collect();
        build(&Inputs {
            job,
            results: &results,
            exits: &BTreeMap::new(),
            telemetry: &Telemetry::default(),
            rules: &HealthRules::default(),
            now_ms: 9_000,
        })
    }

    fn rank(report: &Report, rank: u32) -> &RankReport {
        report
            .nodes
            .iter()
            .flat_map(|n| &n.ranks)
            .find(|r| r.rank == rank)
            .unwrap()
    }

    #[test]
    fn sdc_majority_wins_within_a_class() {
        let j = job(JobState::Succeeded, 2, 2);
        let r = build_with(
            &j,
            vec![
                stress(0, "H200", "aaaa"),
                stress(1, "H200", "aaaa"),
                stress(2, "H200", "bbbb"),
                stress(3, "H100", "cccc"),
            ],
        );
        assert_eq!(rank(&r, 2).verdict(), Verdict::Fail);
        assert!(
            rank(&r, 2).reason.contains("silent data corruption"),
            "{}",
            rank(&r, 2).reason
        );
        assert!(rank(&r, 2).reason.contains("bbbb") && rank(&r, 2).reason.contains("aaaa"));
        // A class of one is not compared against the others.
        assert_eq!(rank(&r, 3).verdict(), Verdict::Pass);
        assert_eq!(rank(&r, 0).verdict(), Verdict::Pass);
        assert_eq!(r.nodes[0].verdict(), Verdict::Pass);
        assert_eq!(r.nodes[1].verdict(), Verdict::Fail);
        let (v, why) = ranks_verdict(&r);
        assert_eq!(v, Verdict::Fail);
        assert!(why.contains("rank 2 on node node-1 (cuda:0)"), "{why}");
        assert!(r.sdc_note.contains("2 device classes"), "{}", r.sdc_note);
        assert_eq!(r.duration_ms, 4_000);
    }

    #[test]
    fn sdc_tie_fails_both_and_self_mismatch_fails() {
        let j = job(JobState::Succeeded, 1, 3);
        let mut drift = stress(2, "X", "");
        if let Some(Detail::Stress(s)) = &mut drift.detail {
            s.self_mismatches = 2;
        }
        let r = build_with(&j, vec![stress(0, "X", "aa"), stress(1, "X", "bb"), drift]);
        assert_eq!(rank(&r, 0).verdict(), Verdict::Fail);
        assert_eq!(rank(&r, 1).verdict(), Verdict::Fail);
        assert!(rank(&r, 0).reason.contains("no majority"));
        assert_eq!(rank(&r, 2).verdict(), Verdict::Fail);
        assert!(rank(&r, 2).reason.contains("2 of 10 checks"));
    }

    #[test]
    fn all_agree_passes() {
        let j = job(JobState::Succeeded, 2, 1);
        let r = build_with(&j, vec![stress(0, "X", "aa"), stress(1, "X", "aa")]);
        assert_eq!(r.verdict(), Verdict::Pass);
        assert_eq!(ranks_verdict(&r).0, Verdict::Pass);
    }

    fn coll(rank: u32, world: u32, rows: Vec<(&str, u64, f64, u64)>) -> RankResult {
        RankResult {
            rank,
            ok: true,
            detail: Some(Detail::Collectives(CollectiveResult {
                backend: "tcp-ring".into(),
                world_size: world,
                rows: rows
                    .into_iter()
                    .map(|(op, bytes, t, wrong)| CollectiveRow {
                        op: op.into(),
                        bytes,
                        dtype: "float".into(),
                        time_us: t,
                        time_us_ip: t * 2.0,
                        wrong,
                        ..Default::default()
                    })
                    .collect(),
            })),
            ..Default::default()
        }
    }

    #[test]
    fn busbw_factors_match_nccl_tests() {
        assert!((busbw_factor("all_reduce", 4) - 1.5).abs() < 1e-12);
        assert!((busbw_factor("all_gather", 4) - 0.75).abs() < 1e-12);
        assert!((busbw_factor("reduce_scatter", 8) - 0.875).abs() < 1e-12);
        assert!((busbw_factor("alltoall", 2) - 0.5).abs() < 1e-12);
        for op in ["broadcast", "reduce", "sendrecv"] {
            assert_eq!(busbw_factor(op, 8), 1.0);
        }
        assert_eq!(busbw_factor("all_reduce", 1), 0.0);
    }

    #[test]
    fn collectives_take_the_slowest_rank_and_sum_wrong() {
        let mb = 1_000_000;
        let results = [
            coll(
                0,
                4,
                vec![("all_reduce", mb, 100.0, 0), ("broadcast", mb, 50.0, 0)],
            ),
            coll(
                1,
                4,
                vec![("all_reduce", mb, 250.0, 0), ("broadcast", mb, 40.0, 1)],
            ),
            coll(
                2,
                4,
                vec![("all_reduce", mb, 200.0, 0), ("broadcast", mb, 40.0, 2)],
            ),
            coll(
                3,
                4,
                vec![("all_reduce", mb, 10.0, 0), ("broadcast", mb, 40.0, 0)],
            ),
        ];
        let rows = aggregate_collectives(results.iter());
        assert_eq!(rows.len(), 2);
        let ar = &rows[0];
        assert_eq!(ar.op, "all_reduce");
        assert_eq!(ar.time_us, 250.0);
        assert!(
            (ar.algbw_gbps - 4.0).abs() < 1e-9,
            "1e6 B / 250 us = 4 GB/s, got {}",
            ar.algbw_gbps
        );
        assert!((ar.busbw_gbps - 6.0).abs() < 1e-9, "4 GB/s x 2(3)/4");
        assert_eq!(ar.time_us_ip, 500.0);
        assert!((ar.busbw_gbps_ip - 3.0).abs() < 1e-9);
        let bc = &rows[1];
        assert_eq!((bc.time_us, bc.wrong), (50.0, 3));
        assert!((bc.busbw_gbps - bc.algbw_gbps).abs() < 1e-12);

        // Wrong elements fail the ranks that saw them.
        let j = job(JobState::Succeeded, 2, 2);
        let r = build_with(&j, results.to_vec());
        assert_eq!(r.collectives.len(), 2);
        assert_eq!(r.backend, "tcp-ring");
        assert_eq!(rank(&r, 1).verdict(), Verdict::Fail);
        assert_eq!(rank(&r, 0).verdict(), Verdict::Pass);
        assert_eq!(rank(&r, 3).verdict(), Verdict::Pass);
    }

    #[test]
    fn failing_gpus_fail_their_ranks_and_nodes() {
        use gpuctl_proto::pb::{GpuSample, TelemetryBatch};
        let j = job(JobState::Succeeded, 2, 2);
        let mut t = Telemetry::default();
        let bad = |index: u32, xid: u32| GpuSample {
            index,
            util_gpu: 99.0,
            xids: vec![xid],
            ..Default::default()
        };
        // node-0 GPU 1 (no UUIDs: matched by `cuda:1`); node-1 GPU 7 ran no rank.
        for (node, index, xid) in [("node-0", 1, 79), ("node-1", 7, 48), ("node-1", 0, 13)] {
            t.add(
                node,
                TelemetryBatch {
                    node: node.into(),
                    samples: vec![bad(index, xid)],
                    ..Default::default()
                },
                1,
            );
        }
        let results: BTreeMap<u32, RankResult> =
            (0..4).map(|r| (r, stress(r, "X", "aa"))).collect();
        let r = build(&Inputs {
            job: &j,
            results: &results,
            exits: &BTreeMap::new(),
            telemetry: &t,
            rules: &HealthRules::default(),
            now_ms: 9_000,
        });
        assert_eq!(rank(&r, 0).verdict(), Verdict::Pass);
        assert_eq!(rank(&r, 1).verdict(), Verdict::Fail);
        assert!(
            rank(&r, 1).reason.contains("GPU 1 health `xid`"),
            "{}",
            rank(&r, 1).reason
        );
        assert_eq!(r.nodes[0].verdict(), Verdict::Fail);
        // XID 13 only warns; GPU 7's XID 48 fails node-1 though its ranks pass.
        assert_eq!(rank(&r, 2).verdict(), Verdict::Pass);
        assert_eq!(rank(&r, 3).verdict(), Verdict::Pass);
        assert_eq!(r.nodes[1].verdict(), Verdict::Fail);
        assert!(r.nodes[1].reason.contains("GPU 7"), "{}", r.nodes[1].reason);
        assert_eq!(r.verdict(), Verdict::Fail);
        assert_eq!(r.health.len(), 3);
        assert_eq!(r.telemetry.len(), 3);

        // Only the GPU that no rank ran on: the job still fails, naming the node.
        let mut t2 = Telemetry::default();
        t2.add(
            "node-1",
            TelemetryBatch {
                samples: vec![bad(7, 48)],
                ..Default::default()
            },
            1,
        );
        let r = build(&Inputs {
            job: &j,
            results: &results,
            exits: &BTreeMap::new(),
            telemetry: &t2,
            rules: &HealthRules::default(),
            now_ms: 9_000,
        });
        let (v, why) = ranks_verdict(&r);
        assert_eq!(v, Verdict::Fail);
        assert!(why.starts_with("node node-1: GPU 7"), "{why}");
    }

    #[test]
    fn missing_results_are_incomplete_with_reasons() {
        let mut j = job(JobState::Running, 2, 1);
        j.finished_unix_ms = 0;
        let results: BTreeMap<u32, RankResult> = [(0, stress(0, "X", "aa"))].into_iter().collect();
        let exits: BTreeMap<u32, WorkerExited> = BTreeMap::new();
        let r = build(&Inputs {
            job: &j,
            results: &results,
            exits: &exits,
            telemetry: &Telemetry::default(),
            rules: &HealthRules::default(),
            now_ms: 3_000,
        });
        assert_eq!(r.verdict(), Verdict::Incomplete);
        assert_eq!(rank(&r, 1).verdict(), Verdict::Incomplete);
        assert_eq!(rank(&r, 1).reason, "running, no result yet");
        assert_eq!(r.duration_ms, 2_000);
        assert!(r.notes.iter().any(|n| n.contains("partial report")));

        j.state = JobState::Failed as i32;
        j.message = "rank 1 on node node-1 (cuda:0) exited with code 1: boom".into();
        let exits: BTreeMap<u32, WorkerExited> = [(
            1,
            WorkerExited {
                rank: 1,
                exit_code: 1,
                stderr_tail: "first\nboom\n".into(),
                ..Default::default()
            },
        )]
        .into_iter()
        .collect();
        let r = build(&Inputs {
            job: &j,
            results: &results,
            exits: &exits,
            telemetry: &Telemetry::default(),
            rules: &HealthRules::default(),
            now_ms: 3_000,
        });
        assert_eq!(r.verdict(), Verdict::Fail);
        assert_eq!(r.reason, j.message);
        assert_eq!(
            rank(&r, 1).reason,
            "no result: the worker exited with code 1: boom"
        );
        assert_eq!(r.nodes[1].verdict(), Verdict::Incomplete);

        // A job that never ran still gets a report.
        let mut never = job(JobState::Cancelled, 0, 0);
        never.plan = None;
        never.message = "cancelled by user".into();
        let r = build_with(&never, vec![]);
        assert_eq!(r.verdict(), Verdict::Incomplete);
        assert!(r.nodes.is_empty());
        assert_eq!(r.reason, "cancelled by user");
    }
}

//! GPU health onto ranks and nodes: a GPU with a failing health finding fails
//! the ranks that ran on it, matched by UUID, else by NVML index;
//! a failing GPU that no rank ran on fails its node. Also what the health
//! rules need from the ranks: when each GPU ran its measured phase, and
//! whether the job's bandwidth confirms a link down.

use std::collections::BTreeMap;

use gpuctl_proto::pb::{
    Finding, GpuTelemetrySummary, HealthFinding, PhaseKind, PhaseMark, Plan, RankResult, Verdict,
};

use super::ranks::{RankStates, Source};
use crate::judge::health::{HealthRules, Level};
use crate::judge::telemetry::Windows;

/// When each GPU's rank ran its measured phase, from its timeline: from
/// the first mark the workload declared measured to the mark that ends its
/// last measured stretch (set-up, warm-up, verification and sweeps are not
/// judged: a GPT-1.3B job's parameter comparison after training left both
/// GPUs "idle" in 90 % of their samples, issue 47). Two workloads are not
/// judged at all:
/// - maxbatch: its search is trials of new shapes, each mostly allocation
///   and autotuning: bursty by design, not a load to judge;
/// - p2p: its copies run on the copy engines and NCCL's small copy kernels,
///   which NVML's utilisation barely counts: a busy link on an "idle" GPU.
///
/// Marks of an older worker or the simulator say no kind; their stretch is
/// read from the phase names as before ([`unmarked`]). A rank with no
/// measured stretch gives none, and its GPU's `idle` is not judged.
pub(super) fn measured_windows(
    workload: &str,
    plan: &Plan,
    results: &BTreeMap<u32, RankResult>,
) -> Windows {
    let mut out = Windows::new();
    if matches!(workload, "maxbatch" | "p2p") {
        return out;
    }
    for p in &plan.ranks {
        let (Some(gpu), Some(r)) = (p.gpu_index, results.get(&p.rank)) else {
            continue;
        };
        let declared = r.phases.iter().any(|m| m.kind() != PhaseKind::Unspecified);
        let window = if declared {
            stretch(&r.phases, |m| m.kind() == PhaseKind::Measured)
        } else {
            unmarked(workload, &r.phases)
        };
        if let Some((from, to)) = window.filter(|(from, to)| to > from) {
            out.insert((p.node.clone(), gpu), (from, to));
        }
    }
    out
}

/// An older worker's measured stretch, from its phase names: ddp and fsdp's
/// timed steps (`train step`, `baseline step`), else from the first mark
/// with work counted to the last mark.
fn unmarked(workload: &str, marks: &[PhaseMark]) -> Option<(u64, u64)> {
    match workload {
        "ddp" | "fsdp" => stretch(marks, |m| m.phase == "step" || m.phase.ends_with(" step")),
        _ => marks
            .iter()
            .find(|m| m.iterations > 0)
            .map(|from| (from.unix_ms, marks.last().map_or(0, |m| m.unix_ms))),
    }
}

/// From the first mark `inside` takes to the mark that ends the last
/// stretch of them (or the last such mark).
fn stretch(marks: &[PhaseMark], inside: impl Fn(&PhaseMark) -> bool) -> Option<(u64, u64)> {
    let first = marks.iter().position(&inside)?;
    let last = marks.iter().rposition(&inside)?;
    let end = marks.get(last + 1).unwrap_or(&marks[last]);
    Some((marks[first].unix_ms, end.unix_ms))
}

/// A GPU summary's verdict after [`confirm_nvlink`] raised a finding of it.
pub(super) fn fail_summaries(health: &[HealthFinding], summaries: &mut [GpuTelemetrySummary]) {
    for h in health.iter().filter(|h| h.verdict() == Verdict::Fail) {
        for s in summaries
            .iter_mut()
            .filter(|s| s.node == h.node && s.index == h.gpu_index)
        {
            s.verdict = Verdict::Fail as i32;
        }
    }
}

/// Raises `nvlink` findings to the `nvlink_down` level on nodes whose
/// bandwidth failed in this job (a job-wide figure counts for a job of one
/// node); elsewhere they stay at `nvlink_down_unconfirmed`, saying so.
pub(super) fn confirm_nvlink<'a>(
    health: &mut [HealthFinding],
    bandwidth: impl Iterator<Item = &'a Finding>,
    nodes: &[String],
    rules: &HealthRules,
) {
    let mut slow: BTreeMap<&str, String> = BTreeMap::new();
    for f in bandwidth.filter(|f| {
        f.level() == Verdict::Fail
            && matches!(
                f.metric.as_str(),
                "busbw" | "link_busbw" | "p2p_gbps" | "p2p_pair"
            )
    }) {
        let node = match (f.node.as_str(), nodes) {
            ("", [only]) => only.as_str(),
            (n, _) => n,
        };
        slow.entry(node).or_insert_with(|| f.detail.clone());
    }
    for h in health.iter_mut().filter(|h| h.rule == "nvlink") {
        match slow.get(h.node.as_str()) {
            Some(why) if rules.nvlink_down != Level::Off => {
                h.verdict = match rules.nvlink_down {
                    Level::Fail => Verdict::Fail,
                    _ => Verdict::Warn,
                } as i32;
                h.detail = format!("{}; confirmed by this job's bandwidth: {why}", h.detail);
            }
            _ => {
                h.detail = format!(
                    "{}; not confirmed by a bandwidth measurement in this job (`gpuctl submit nccl` on the node measures it)",
                    h.detail
                )
            }
        }
    }
}

/// Fails the ranks on failing GPUs; returns, per node, the failures of GPUs
/// that no rank ran on.
pub(super) fn apply(
    health: &[HealthFinding],
    plan: &Plan,
    states: &mut RankStates,
) -> BTreeMap<String, Vec<String>> {
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
                st.fail_from(Source::Health, why.clone());
            }
        }
        if on_gpu.is_empty() {
            node_faults.entry(f.node.clone()).or_default().push(why);
        }
    }
    node_faults
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb::RankPlacement;

    fn mark(phase: &str, unix_ms: u64, iterations: u64) -> PhaseMark {
        PhaseMark {
            phase: phase.into(),
            unix_ms,
            iterations,
            ..Default::default()
        }
    }

    fn plan() -> Plan {
        Plan {
            nodes: vec!["n0".into()],
            ranks: vec![RankPlacement {
                rank: 0,
                node: "n0".into(),
                gpu_index: Some(2),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn the_measured_phase_leaves_set_up_out() {
        // As a DDP rank on an H100 reported it: the first (autotuning)
        // warm-up step took 13 s.
        let phases = vec![
            mark("starting", 1_000, 0),
            mark("building the model", 3_000, 1),
            mark("baseline warmup", 4_000, 2),
            mark("baseline warmup", 17_000, 3),
            mark("baseline step", 18_000, 7),
            mark("warmup", 19_000, 17),
            mark("train step", 20_000, 22),
            mark("train step", 21_000, 38),
            mark("trained", 22_000, 51),
            mark("done", 22_100, 51),
        ];
        let results = BTreeMap::from([(
            0,
            RankResult {
                phases,
                ..Default::default()
            },
        )]);
        let w = measured_windows("ddp", &plan(), &results);
        assert_eq!(w[&("n0".to_string(), 2)], (18_000, 22_000));
        let w = measured_windows("stress", &plan(), &results);
        assert_eq!(w[&("n0".to_string(), 2)], (3_000, 22_100));
        assert!(measured_windows("maxbatch", &plan(), &results).is_empty());
    }

    #[test]
    fn declared_phases_judge_the_measured_stretch_alone() {
        // As the GPT-1.3B fsdp rank of issue 47: 20 steps in 1.8 s, then the
        // parameter comparison until the end, which no rule may call idle.
        let m = |phase: &str, unix_ms: u64, kind: PhaseKind| PhaseMark {
            kind: kind as i32,
            ..mark(phase, unix_ms, 0)
        };
        let phases = vec![
            m("starting", 1_000, PhaseKind::Setup),
            m("building the model", 3_000, PhaseKind::Setup),
            m("building the model", 8_000, PhaseKind::Warmup),
            m("warmup", 8_100, PhaseKind::Warmup),
            m("warmup", 9_000, PhaseKind::Measured),
            m("train step", 9_100, PhaseKind::Measured),
            m("train step", 10_100, PhaseKind::Measured),
            m("train step", 10_800, PhaseKind::Verify),
            m("comparing parameters", 10_800, PhaseKind::Verify),
            m("trained", 40_000, PhaseKind::Verify),
            m("done", 40_100, PhaseKind::Verify),
        ];
        let results = BTreeMap::from([(
            0,
            RankResult {
                phases,
                ..Default::default()
            },
        )]);
        for workload in ["fsdp", "ddp", "stress"] {
            let w = measured_windows(workload, &plan(), &results);
            assert_eq!(w[&("n0".to_string(), 2)], (9_000, 10_800), "{workload}");
        }
        assert!(measured_windows("p2p", &plan(), &results).is_empty());
    }

    #[test]
    fn a_link_down_fails_only_where_bandwidth_agrees() {
        let down = || HealthFinding {
            node: "n0".into(),
            gpu_index: 2,
            verdict: Verdict::Warn as i32,
            rule: "nvlink".into(),
            detail: "up to 4 of 18 NVLinks down".into(),
            ..Default::default()
        };
        let slow = Finding {
            node: String::new(),
            metric: "busbw".into(),
            level: Verdict::Fail as i32,
            detail: "all_reduce 1 GiB busbw 120 GB/s".into(),
            ..Default::default()
        };
        let rules = HealthRules::default();
        let mut h = vec![down()];
        confirm_nvlink(&mut h, std::iter::once(&slow), &["n0".into()], &rules);
        assert_eq!(h[0].verdict(), Verdict::Fail);
        assert!(
            h[0].detail.contains("confirmed by this job's bandwidth"),
            "{}",
            h[0].detail
        );
        // A job-wide figure of several nodes does not say which node is slow.
        let mut h = vec![down()];
        confirm_nvlink(
            &mut h,
            std::iter::once(&slow),
            &["n0".into(), "n1".into()],
            &rules,
        );
        assert_eq!(h[0].verdict(), Verdict::Warn);
        assert!(h[0].detail.contains("not confirmed"), "{}", h[0].detail);
        let mut h = vec![down()];
        confirm_nvlink(&mut h, std::iter::empty(), &["n0".into()], &rules);
        assert_eq!(h[0].verdict(), Verdict::Warn);
    }
}

//! When each GPU ran its rank's measured phase: the only samples `idle`
//! judges.

use std::collections::BTreeMap;

use gpuctl_proto::pb::{PhaseKind, PhaseMark, Plan, RankPlacement, RankResult};

/// When each GPU's rank ran its measured phase: (node, NVML index) → (from,
/// to) in unix ms. The node names are the plan's, borrowed: a copy of each
/// was 131,072 allocations at a big job's end, and as many again to look
/// them up.
pub type Windows<'a> = BTreeMap<(&'a str, u32), (u64, u64)>;

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
pub fn measured_windows<'a>(
    workload: &str,
    plan: &'a Plan,
    results: &BTreeMap<u32, RankResult>,
) -> Windows<'a> {
    if matches!(workload, "maxbatch" | "p2p") {
        return Windows::new();
    }
    // Collected, not inserted one by one: the plan's ranks come in node
    // order, and a map made from sorted pairs is built in one pass.
    let window = |p: &'a RankPlacement| {
        let (Some(gpu), Some(r)) = (p.gpu_index, results.get(&p.rank)) else {
            return None;
        };
        let declared = r.phases.iter().any(|m| m.kind() != PhaseKind::Unspecified);
        let window = if declared {
            stretch(&r.phases, |m| m.kind() == PhaseKind::Measured)
        } else {
            unmarked(workload, &r.phases)
        };
        let (from, to) = window.filter(|(from, to)| to > from)?;
        Some(((p.node.as_str(), gpu), (from, to)))
    };
    plan.ranks.iter().filter_map(window).collect()
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
        let plan = self::plan();
        let w = measured_windows("ddp", &plan, &results);
        assert_eq!(w[&("n0", 2)], (18_000, 22_000));
        let w = measured_windows("stress", &plan, &results);
        assert_eq!(w[&("n0", 2)], (3_000, 22_100));
        assert!(measured_windows("maxbatch", &plan, &results).is_empty());
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
        let plan = self::plan();
        for workload in ["fsdp", "ddp", "stress"] {
            let w = measured_windows(workload, &plan, &results);
            assert_eq!(w[&("n0", 2)], (9_000, 10_800), "{workload}");
        }
        assert!(measured_windows("p2p", &plan, &results).is_empty());
    }
}

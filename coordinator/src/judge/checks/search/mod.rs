//! `nccl --pattern search`: the workers search for every slow node and link
//! themselves (`gpuctl_core::search`) and every rank reports the same
//! verdict, the first rank of the first two nodes its rounds
//! (`gpuctl_core::search::carries_rounds`). Here nodes get their names, and each culprit
//! becomes a finding with both figures: the one that raised it and the one,
//! with another partner, that confirmed it. A node the second look cleared
//! and a node the search could not decide are notes, never failures.

use std::collections::{BTreeMap, BTreeSet};

use gpuctl_core::catalogue::TypedParams;
use gpuctl_proto::pb::{JobSpec, Link, Plan, RankResult, Verdict};

use super::{Check, Level, Phase};

use super::bisect::{name, named_rounds, Judged};

const RULE: &str = "search: groups below the slow share of their round's fastest group (or of half the search's fastest) are split until a node or link is left; a node is blamed when slow with two different cleared partners, a link when slow twice; a node is cleared only by a group that is fast against that reference as it ends";

/// What the search measured at: all_reduce of `bytes` in `dtype`.
#[derive(Debug, Clone, Default)]
pub struct Size {
    pub bytes: u64,
    pub dtype: String,
}

impl Size {
    /// The job's `max_bytes` and `dtype`, with the defaults of the device
    /// its ranks ran on.
    pub fn of(spec: &JobSpec, plan: &Plan) -> Size {
        let gpu = plan.ranks.iter().any(|r| r.is_gpu());
        match TypedParams::build(&spec.workload, &spec.params, gpu) {
            Ok(TypedParams::Nccl(p)) => Size {
                bytes: p.max_bytes,
                dtype: p.dtype,
            },
            _ => Size::default(),
        }
    }
}

/// What a healthy group reached: the median of the groups with no blamed
/// node and no blamed link in them. A median of every group was a
/// culprit's once half a round was slow; the search itself judged each
/// group against its own round ([`gpuctl_core::search`]).
fn healthy_median(out: &Judged, blamed: &[gpuctl_proto::pb::SearchBlame]) -> f64 {
    let bad = |nodes: &[u32]| {
        blamed.iter().any(|b| match (b.node, b.link_a, b.link_b) {
            (Some(n), _, _) => nodes.contains(&n),
            (None, Some(a), Some(z)) => nodes.contains(&a) && nodes.contains(&z),
            _ => false,
        })
    };
    let v: Vec<f64> = out
        .rounds
        .iter()
        .flat_map(|r| r.groups.iter())
        .filter(|g| !bad(&g.nodes))
        .map(|g| g.busbw_gbps)
        .collect();
    gpuctl_core::stats::median(v).unwrap_or(0.0)
}

/// The search's verdict, as the first rank that carries its rounds tells it.
pub fn judge(results: &BTreeMap<u32, RankResult>, plan: &Plan, size: &Size) -> Judged {
    let nodes = &plan.nodes;
    let Some((mut out, steps, c)) = named_rounds(results, plan) else {
        return Judged::default();
    };
    let tests: usize = out.rounds.iter().map(|r| r.groups.len()).sum();
    let rounds = out.rounds.len();
    let reference = healthy_median(&out, &c.search_blamed);
    for b in &c.search_blamed {
        // What every culprit's finding says alike: its confirming figure
        // against the search's healthy groups, by the search's rule.
        let base = Check {
            phase: Phase::Measured,
            metric: "search".into(),
            value: b.confirm_gbps,
            reference,
            reference_kind: "fleet".into(),
            rule: RULE.into(),
            level: Level::Fail,
            unit: "GB/s".into(),
            ..Default::default()
        };
        match (b.node, b.link_a, b.link_b) {
            (Some(n), _, _) => {
                let who = name(nodes, n);
                let partner = |i: usize| {
                    b.partners
                        .get(i)
                        .map_or_else(|| "?".to_string(), |p| name(nodes, *p))
                };
                out.findings.push(Check {
                    phase: Phase::Measured,
                    node: who.clone(),
                    key: "all_reduce".into(),
                    detail: format!(
                        "node {who} slow with {} ({:.2} GB/s) and again with {} ({:.2} GB/s), both cleared nodes; the search took {rounds} rounds, {tests} tests",
                        partner(0),
                        b.first_gbps,
                        partner(1),
                        b.confirm_gbps
                    ),
                    ..base
                });
            }
            (None, Some(a), Some(z)) => {
                let (na, nz) = (name(nodes, a), name(nodes, z));
                out.findings.push(Check {
                    phase: Phase::Measured,
                    key: format!("link {na}-{nz}"),
                    detail: format!(
                        "link {na} <-> {nz}: {:.2} GB/s, and {:.2} measured again; both nodes are fast with other partners, so the link (cable, port, switch) is suspect",
                        b.first_gbps, b.confirm_gbps
                    ),
                    ..base
                });
            }
            _ => {}
        }
    }
    out.links = links(&out, &c.search_blamed, nodes, size, reference);
    let names = |v: &[u32]| -> String {
        v.iter()
            .map(|n| name(nodes, *n))
            .collect::<Vec<_>>()
            .join(", ")
    };
    out.notes.push(format!(
        "search: {rounds} rounds, {tests} tests, {} blamed{}",
        c.search_blamed.len(),
        if c.search_blamed.is_empty() && steps.len() == 1 {
            " (every first-round group fast)".to_string()
        } else {
            String::new()
        }
    ));
    if !c.search_cleared.is_empty() {
        out.notes.push(format!(
            "search: slow once and cleared by a second look with another partner, not blamed: {}",
            names(&c.search_cleared)
        ));
    }
    if !c.search_undecided.is_empty() {
        out.notes.push(format!(
            "search: undecided (no cleared node to confirm them with; --pattern pairs measures every pair): {}",
            names(&c.search_undecided)
        ));
    }
    out
}

/// Every two-node group the search measured is a link between those nodes:
/// its first figure and, measured again, the second (the better one
/// judged, as the pairs' links). A link fails when the search blamed it or
/// one of its nodes.
fn links(
    out: &Judged,
    blamed: &[gpuctl_proto::pb::SearchBlame],
    nodes: &[String],
    size: &Size,
    reference: f64,
) -> Vec<Link> {
    let bad_nodes: BTreeSet<u32> = blamed.iter().filter_map(|b| b.node).collect();
    let bad_links: BTreeSet<(u32, u32)> = blamed
        .iter()
        .filter_map(|b| Some((b.link_a?.min(b.link_b?), b.link_a?.max(b.link_b?))))
        .collect();
    let mut seen: BTreeMap<(u32, u32), (u32, Vec<f64>)> = BTreeMap::new();
    for r in &out.rounds {
        for g in r.groups.iter().filter(|g| g.nodes.len() == 2) {
            let key = (g.nodes[0].min(g.nodes[1]), g.nodes[0].max(g.nodes[1]));
            seen.entry(key)
                .or_insert((r.round, Vec::new()))
                .1
                .push(g.busbw_gbps);
        }
    }
    seen.into_iter()
        .map(|((a, b), (round, v))| {
            let bad =
                bad_links.contains(&(a, b)) || bad_nodes.contains(&a) || bad_nodes.contains(&b);
            Link {
                a: name(nodes, a),
                b: name(nodes, b),
                op: "all_reduce".into(),
                bytes: size.bytes,
                dtype: size.dtype.clone(),
                round,
                busbw_gbps: v.iter().copied().fold(0.0, f64::max),
                verdict: if bad { Verdict::Fail } else { Verdict::Pass } as i32,
                reference_gbps: reference,
                first_gbps: v[0],
                repeat_gbps: v.get(1).copied().unwrap_or(0.0),
                ..Default::default()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb::{
        rank_result::Detail, BisectGroup, BisectRound, CollectiveResult, SearchBlame,
    };

    #[test]
    fn culprits_are_named_with_both_figures_and_cleared_ones_are_notes() {
        let c = CollectiveResult {
            bisect: vec![
                BisectRound {
                    round: 0,
                    groups: vec![BisectGroup {
                        nodes: vec![0, 1, 2, 3],
                        busbw_gbps: 1.0,
                        ..Default::default()
                    }],
                    decision: String::new(),
                },
                BisectRound {
                    round: 1,
                    groups: [[0, 2], [1, 3], [0, 1]]
                        .iter()
                        .map(|g| BisectGroup {
                            nodes: g.to_vec(),
                            busbw_gbps: if g == &[0, 1] { 1.1 } else { 0.3 },
                            ..Default::default()
                        })
                        .collect(),
                    decision: String::new(),
                },
                BisectRound {
                    round: 2,
                    groups: vec![BisectGroup {
                        nodes: vec![3, 1],
                        busbw_gbps: 0.42,
                        ..Default::default()
                    }],
                    decision: String::new(),
                },
            ],
            search_blamed: vec![
                SearchBlame {
                    node: Some(2),
                    first_gbps: 0.3,
                    confirm_gbps: 0.31,
                    partners: vec![0, 1],
                    ..Default::default()
                },
                SearchBlame {
                    link_a: Some(1),
                    link_b: Some(3),
                    first_gbps: 0.4,
                    confirm_gbps: 0.42,
                    ..Default::default()
                },
            ],
            search_cleared: vec![0],
            ..Default::default()
        };
        let results: BTreeMap<u32, RankResult> = [(
            0,
            RankResult {
                detail: Some(Detail::Collectives(c)),
                ..Default::default()
            },
        )]
        .into();
        let size = Size {
            bytes: 1 << 20,
            dtype: "float".into(),
        };
        let j = judge(&results, &super::super::bisect::test_plan(4, 1), &size);
        assert_eq!(j.findings.len(), 2, "{:#?}", j.findings);
        assert_eq!(j.findings[0].node, "n2");
        assert!(j.findings[0]
            .detail
            .contains("with n0 (0.30 GB/s) and again with n1 (0.31 GB/s)"));
        assert_eq!(j.findings[1].node, "", "a link fails the job, not a node");
        // Against the groups with no culprit in them: [n0 n1] alone here.
        assert!(
            j.findings.iter().all(|f| f.reference == 1.1),
            "{:?}",
            j.findings
        );
        assert!(j.findings[1].detail.contains("n1 <-> n3"));
        assert!(j
            .notes
            .iter()
            .any(|n| n.contains("cleared by a second look") && n.contains("n0")));
        assert_eq!(j.rounds[0].groups[0].names, ["n0", "n1", "n2", "n3"]);
        // The two-node groups are links for `gpuctl fleet links`, the one
        // measured twice with both figures; those of blamed nodes and links fail.
        let links: Vec<(&str, &str, f64, f64, bool)> = j
            .links
            .iter()
            .map(|l| {
                (
                    l.a.as_str(),
                    l.b.as_str(),
                    l.first_gbps,
                    l.repeat_gbps,
                    l.verdict() == Verdict::Fail,
                )
            })
            .collect();
        assert_eq!(
            links,
            [
                ("n0", "n1", 1.1, 0.0, false),
                ("n0", "n2", 0.3, 0.0, true),
                ("n1", "n3", 0.3, 0.42, true),
            ]
        );
        assert!(j
            .links
            .iter()
            .all(|l| l.bytes == 1 << 20 && l.op == "all_reduce"));
    }
}

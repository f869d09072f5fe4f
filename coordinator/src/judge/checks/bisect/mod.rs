//! `nccl --pattern bisect`: the workers search for the slow node themselves
//! (halves measured at the same time, the slow half split again); the first
//! rank of the first two nodes reports the rounds
//! (`gpuctl_core::search::carries_rounds`). Here the rounds get node names,
//! and the outcome becomes a finding: the isolated node fails, naming the
//! rounds that isolated it; an uncertain end is a note, and blames no node.

use std::collections::BTreeMap;

use gpuctl_proto::pb::{
    rank_result::Detail, BisectRound, CollectiveResult, Link, Plan, RankResult,
};

use super::{Check, Level, Phase};

/// What the search found.
#[derive(Debug, Default)]
pub struct Judged {
    pub rounds: Vec<BisectRound>,
    pub findings: Vec<Check>,
    pub notes: Vec<String>,
    /// The search's two-node groups, as links between nodes (`gpuctl fleet
    /// links` keeps them beside the pairs').
    pub links: Vec<Link>,
}

pub(crate) fn name(nodes: &[String], rank: u32) -> String {
    nodes
        .get(rank as usize)
        .cloned()
        .unwrap_or_else(|| format!("node rank {rank}"))
}

/// The rounds as the lowest rank the plan says carries them tells them,
/// with node names, and each round in words; `None` when no carrier
/// reported rounds. Another rank's rounds are not read: a node holding it
/// would otherwise write the search that blames its peers.
pub(crate) fn named_rounds(
    results: &BTreeMap<u32, RankResult>,
    plan: &Plan,
) -> Option<(Judged, Vec<String>, CollectiveResult)> {
    let nodes = &plan.nodes;
    let c = plan
        .ranks
        .iter()
        .filter(|p| {
            gpuctl_core::search::carries_rounds(p.node_rank as usize, p.local_rank as usize)
        })
        .filter_map(|p| results.get(&p.rank))
        .find_map(|r| match &r.detail {
            Some(Detail::Collectives(c)) if !c.bisect.is_empty() => Some(c),
            _ => None,
        })?;
    let mut out = Judged {
        rounds: c.bisect.clone(),
        ..Default::default()
    };
    for round in &mut out.rounds {
        for g in &mut round.groups {
            g.names = g.nodes.iter().map(|n| name(nodes, *n)).collect();
        }
    }
    let steps: Vec<String> = out
        .rounds
        .iter()
        .map(|r| {
            let groups: Vec<String> = r
                .groups
                .iter()
                .map(|g| format!("[{}] {:.2} GB/s", g.names.join(" "), g.busbw_gbps))
                .collect();
            format!("round {}: {}", r.round, groups.join(" vs "))
        })
        .collect();
    Some((out, steps, c.clone()))
}

/// The search as the first rank that carries its rounds tells it.
pub fn judge(results: &BTreeMap<u32, RankResult>, plan: &Plan) -> Judged {
    let nodes = &plan.nodes;
    let Some((mut out, steps, c)) = named_rounds(results, plan) else {
        return Judged::default();
    };
    match c.bisect_culprit {
        Some(n) => {
            let who = name(nodes, n);
            let last = out.rounds.last().and_then(|r| {
                r.groups
                    .iter()
                    .find(|g| g.nodes.contains(&n))
                    .map(|g| g.busbw_gbps)
            });
            out.findings.push(Check {
                phase: Phase::Measured,
                node: who.clone(),
                metric: "bisect".into(),
                key: "all_reduce".into(),
                value: last.unwrap_or(0.0),
                reference_kind: "fleet".into(),
                rule: "bisect: the half with the slower all_reduce is split again until one node is left".into(),
                level: Level::Fail,
                unit: "GB/s".into(),
                detail: format!(
                    "node {who} isolated by bisect in {} rounds: {}",
                    out.rounds.len(),
                    steps.join("; ")
                ),
                ..Default::default()
            });
        }
        None => out.notes.push(format!(
            "bisect in {} rounds found no single slow node: {}{}",
            out.rounds.len(),
            if c.bisect_note.is_empty() {
                "no half was slower than the other".to_string()
            } else {
                c.bisect_note.clone()
            },
            if steps.is_empty() {
                String::new()
            } else {
                format!(" ({})", steps.join("; "))
            }
        )),
    }
    out
}

/// A plan of `nodes` nodes `n0`, `n1`, … with `per_node` ranks each, in
/// node order, for the checks' tests.
#[cfg(test)]
pub(crate) fn test_plan(nodes: u32, per_node: u32) -> Plan {
    use gpuctl_proto::pb::RankPlacement;
    let names: Vec<String> = (0..nodes).map(|i| format!("n{i}")).collect();
    let ranks = (0..nodes * per_node)
        .map(|rank| RankPlacement {
            rank,
            local_rank: rank % per_node,
            node_rank: rank / per_node,
            node: names[(rank / per_node) as usize].clone(),
            ..Default::default()
        })
        .collect();
    Plan {
        nodes: names,
        ranks,
        world_size: nodes * per_node,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb::{BisectGroup, CollectiveResult};

    fn result(culprit: Option<u32>) -> BTreeMap<u32, RankResult> {
        result_at(0, culprit)
    }

    fn result_at(rank: u32, culprit: Option<u32>) -> BTreeMap<u32, RankResult> {
        let g = |nodes: Vec<u32>, bw: f64| BisectGroup {
            nodes,
            busbw_gbps: bw,
            ..Default::default()
        };
        let rounds = vec![
            BisectRound {
                round: 0,
                groups: vec![g(vec![0, 1, 2, 3], 1.0)],
                decision: "whole set".into(),
            },
            BisectRound {
                round: 1,
                groups: vec![g(vec![0, 1], 9.0), g(vec![2, 3], 1.0)],
                decision: "second half slower".into(),
            },
            BisectRound {
                round: 2,
                groups: vec![g(vec![0, 2], 1.0), g(vec![1, 3], 9.0)],
                decision: "node 2".into(),
            },
        ];
        let mut out = BTreeMap::new();
        out.insert(
            rank,
            RankResult {
                detail: Some(Detail::Collectives(CollectiveResult {
                    bisect: rounds,
                    bisect_culprit: culprit,
                    ..Default::default()
                })),
                ..Default::default()
            },
        );
        out
    }

    /// Four nodes of two ranks: ranks 0 and 2 carry the rounds.
    fn plan() -> Plan {
        test_plan(4, 2)
    }

    #[test]
    fn the_isolated_node_fails_with_the_rounds_as_evidence() {
        let j = judge(&result(Some(2)), &plan());
        assert_eq!(j.rounds.len(), 3);
        assert_eq!(j.rounds[1].groups[1].names, vec!["n2", "n3"]);
        assert_eq!(j.findings.len(), 1);
        assert_eq!(j.findings[0].node, "n2");
        assert!(j.findings[0].detail.contains("in 3 rounds"));
        assert!(j.findings[0].detail.contains("[n2 n3] 1.00 GB/s"));
    }

    #[test]
    fn no_culprit_blames_nobody_and_says_why() {
        let j = judge(&result(None), &plan());
        assert!(j.findings.is_empty());
        assert!(j.notes[0].contains("no single slow node"));
    }

    #[test]
    fn rounds_are_read_from_the_carriers_only() {
        // Rank 3 (n1's second GPU) and rank 4 (n2's first) carry none: what
        // their nodes send is not the search's.
        for rank in [1, 3, 4, 7] {
            let j = judge(&result_at(rank, Some(2)), &plan());
            assert!(j.findings.is_empty(), "rank {rank}: {:?}", j.findings);
            assert!(j.rounds.is_empty() && j.notes.is_empty(), "rank {rank}");
        }
        // The second node's first rank stands in for a lost first node.
        let j = judge(&result_at(2, Some(2)), &plan());
        assert_eq!(j.findings[0].node, "n2");
        // Both carriers sent rounds: the lowest rank's are read, not a
        // later rank's claim.
        let mut both = result_at(0, None);
        both.extend(result_at(2, Some(1)));
        both.extend(result_at(5, Some(3)));
        let j = judge(&both, &plan());
        assert!(j.findings.is_empty(), "{:?}", j.findings);
    }
}

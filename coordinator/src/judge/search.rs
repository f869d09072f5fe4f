//! `nccl --pattern search`: the workers search for every slow node and link
//! themselves (`gpuctl_proto::search`) and every rank reports the same
//! rounds and the same verdict. Here nodes get their names, and each culprit
//! becomes a finding with both figures: the one that raised it and the one,
//! with another partner, that confirmed it. A node the second look cleared
//! and a node the search could not decide are notes, never failures.

use std::collections::BTreeMap;

use gpuctl_proto::pb::{Finding, RankResult, Verdict};

use super::bisect::{name, named_rounds, Judged};
use super::figures::upper_quartile;

const RULE: &str = "search: groups below the slow share of the search's upper-quartile group are split until a node or link is left; a node is blamed when slow with two different cleared partners, a link when slow twice";

/// The search's verdict, as the lowest rank that reported it tells it.
pub fn judge(results: &BTreeMap<u32, RankResult>, nodes: &[String]) -> Judged {
    let Some((mut out, steps, c)) = named_rounds(results, nodes) else {
        return Judged::default();
    };
    let tests: usize = out.rounds.iter().map(|r| r.groups.len()).sum();
    let rounds = out.rounds.len();
    // What a healthy group reached: the upper quartile of the search's figures.
    let reference = upper_quartile(
        out.rounds
            .iter()
            .flat_map(|r| r.groups.iter().map(|g| g.busbw_gbps))
            .collect(),
    )
    .unwrap_or(0.0);
    for b in &c.search_blamed {
        // What every culprit's finding says alike: its confirming figure
        // against the search's healthy groups, by the search's rule.
        let base = Finding {
            metric: "search".into(),
            value: b.confirm_gbps,
            reference,
            reference_kind: "fleet".into(),
            rule: RULE.into(),
            level: Verdict::Fail as i32,
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
                out.findings.push(Finding {
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
                out.findings.push(Finding {
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

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb::{
        rank_result::Detail, BisectGroup, BisectRound, CollectiveResult, SearchBlame,
    };

    #[test]
    fn culprits_are_named_with_both_figures_and_cleared_ones_are_notes() {
        let c = CollectiveResult {
            bisect: vec![BisectRound {
                round: 0,
                groups: vec![BisectGroup {
                    nodes: vec![0, 1, 2, 3],
                    busbw_gbps: 1.0,
                    ..Default::default()
                }],
                decision: String::new(),
            }],
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
        let nodes: Vec<String> = (0..4).map(|i| format!("n{i}")).collect();
        let j = judge(&results, &nodes);
        assert_eq!(j.findings.len(), 2, "{:#?}", j.findings);
        assert_eq!(j.findings[0].node, "n2");
        assert!(j.findings[0]
            .detail
            .contains("with n0 (0.30 GB/s) and again with n1 (0.31 GB/s)"));
        assert_eq!(j.findings[1].node, "", "a link fails the job, not a node");
        assert!(j.findings[1].detail.contains("n1 <-> n3"));
        assert!(j
            .notes
            .iter()
            .any(|n| n.contains("cleared by a second look") && n.contains("n0")));
        assert_eq!(j.rounds[0].groups[0].names, ["n0", "n1", "n2", "n3"]);
    }
}

//! Silent data corruption: ranks that computed the same thing must end with
//! the same digest. Stress GEMM digests are compared within a device class,
//! DDP and FSDP parameter digests (FSDP's: the parameters gathered whole)
//! within a device model; the majority wins and every other rank fails,
//! named. A stress rank whose own digest changed during the run fails too.
//! FSDP's shards are checked against what the ranks gathered of them in
//! [`shards`](super::shards).

use std::borrow::Cow;
use std::collections::BTreeMap;

use gpuctl_proto::pb::{rank_result::Detail, JobSpec, RankResult};

use super::ranks::{RankStates, Source};

/// Ranks (with their node) and their digests, by the class they are
/// compared within, borrowed from the results: three copies a rank were a
/// tenth of judging a 131,072-rank job.
type Groups<'a> = BTreeMap<Cow<'a, str>, Vec<(u32, &'a str, &'a str)>>;

pub(super) fn short(digest: &str) -> &str {
    &digest[..digest.len().min(16)]
}

/// Stress: fails drifting and outvoted ranks; returns the report's
/// `sdc_note` (empty when no rank ran stress).
pub(super) fn stress(results: &BTreeMap<u32, RankResult>, states: &mut RankStates) -> String {
    // cuBLAS promises bit-identical products only for one architecture, SM
    // count and library, hence the device class.
    let mut groups = Groups::new();
    for (rank, r) in results {
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
                groups
                    .entry(Cow::Borrowed(s.device_class.as_str()))
                    .or_default()
                    .push((*rank, &r.node, &s.digest));
            }
        }
    }
    if groups.is_empty() {
        return String::new();
    }
    let classes = groups.len();
    let parts = vote(groups, states, "result digest");
    format!(
        "stress digests compared bit for bit within {} device class{}: {}. cuBLAS promises identical results only for the same GPU model, SM count and library version, so ranks are compared only within a class.",
        classes,
        if classes == 1 { "" } else { "es" },
        parts.join("; ")
    )
}

/// DDP and FSDP: every rank applies the same averaged gradients (FSDP: to
/// its shard, then gathers the others'), so parameters must end identical.
/// Fails outvoted ranks; returns a note when any were compared.
pub(super) fn params(
    results: &BTreeMap<u32, RankResult>,
    spec: &JobSpec,
    states: &mut RankStates,
) -> Option<String> {
    let mut groups = Groups::new();
    let mut modes = Vec::new();
    for (rank, r) in results {
        // Each model of `--model a,b` is its own comparison.
        let several = !r.more_train.is_empty();
        for t in crate::judge::figures::train_results(r) {
            let mode = if t.mode.is_empty() {
                spec.workload.as_str()
            } else {
                t.mode.as_str()
            };
            if matches!(mode, "ddp" | "fsdp") && !t.param_digest.is_empty() {
                let mode = mode.to_ascii_uppercase();
                if !modes.contains(&mode) {
                    modes.push(mode);
                }
                let group = if several {
                    Cow::Owned(format!("{} · {}", r.device_name, t.model))
                } else {
                    Cow::Borrowed(r.device_name.as_str())
                };
                groups
                    .entry(group)
                    .or_default()
                    .push((*rank, &r.node, &t.param_digest));
            }
        }
    }
    if groups.is_empty() {
        return None;
    }
    let parts = vote(groups, states, "parameter digest");
    Some(format!(
        "{} parameters after training compared across ranks: {}",
        modes.join(" and "),
        parts.join("; ")
    ))
}

/// The most common digests (several on a tie) and how many share each.
pub(super) fn leaders<'a>(digests: impl Iterator<Item = &'a str>) -> (usize, Vec<&'a str>) {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for d in digests {
        *counts.entry(d).or_default() += 1;
    }
    let best = counts.values().copied().max().unwrap_or(0);
    let leaders = counts
        .into_iter()
        .filter(|(_, c)| *c == best)
        .map(|(d, _)| d)
        .collect();
    (best, leaders)
}

/// Majority vote of digests within groups, one vote per node: each node
/// votes its own ranks' most common digest (a node split evenly abstains),
/// so a node that offers many ranks cannot outvote the others (issue 46).
/// Ranks that differ from the winner fail. Where nodes tie, no node is
/// blamed for another's digest: each is held to its own ranks' majority,
/// and every rank of the group is warned. Returns, per group, a sentence
/// for the report.
fn vote(groups: Groups, states: &mut RankStates, what: &str) -> Vec<String> {
    let mut notes = Vec::new();
    for (class, members) in groups {
        let label = if class.is_empty() {
            "unclassified".to_string()
        } else {
            class.into_owned()
        };
        let n = members.len();
        if n < 2 {
            notes.push(format!("`{label}`: 1 rank, nothing to compare against"));
            continue;
        }
        let mut by_node: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (_, node, d) in &members {
            by_node.entry(node).or_default().push(d);
        }
        let own: BTreeMap<&str, Option<&str>> = by_node
            .iter()
            .map(|(node, ds)| {
                let (_, l) = leaders(ds.iter().copied());
                (*node, (l.len() == 1).then(|| l[0]))
            })
            .collect();
        let nodes = by_node.len();
        let (best, winners, among) = if nodes == 1 {
            let (best, l) = leaders(members.iter().map(|(_, _, d)| *d));
            (best, l, format!("{n} ranks"))
        } else {
            let (best, l) = leaders(own.values().flatten().copied());
            (best, l, format!("{nodes} nodes' majorities"))
        };
        if winners.len() == 1 {
            let winner = winners[0];
            let odd = members.iter().filter(|(_, _, d)| *d != winner).count();
            for (rank, _, d) in members.iter().filter(|(_, _, d)| *d != winner) {
                if let Some(s) = states.get_mut(rank) {
                    s.fail(format!(
                        "silent data corruption: {what} {} differs from {} shared by {best} of {among} in class `{label}`",
                        short(d),
                        short(winner)
                    ));
                }
            }
            notes.push(if odd == 0 {
                format!("`{label}`: {n} ranks agree")
            } else {
                format!("`{label}`: {odd} of {n} ranks differ from the majority of {among}")
            });
        } else if nodes == 1 {
            for (rank, _, d) in &members {
                if let Some(s) = states.get_mut(rank) {
                    s.fail(format!(
                        "{what}s disagree with no majority in class `{label}` (this rank: {}); rerun on more GPUs to find the odd one",
                        short(d)
                    ));
                }
            }
            notes.push(format!("`{label}`: {n} ranks, no majority"));
        } else {
            let split: Vec<String> = own
                .iter()
                .map(|(node, d)| format!("{node}: {}", d.map_or("split", short)))
                .collect();
            for (rank, node, d) in &members {
                let Some(s) = states.get_mut(rank) else {
                    continue;
                };
                match own[node] {
                    Some(mine) if mine != *d => s.fail(format!(
                        "silent data corruption: {what} {} differs from {} shared by the other ranks of node {node} in class `{label}`",
                        short(d),
                        short(mine)
                    )),
                    _ => s.warn_from(
                        Source::Result,
                        format!(
                            "{what}s disagree between nodes with no majority of nodes in class `{label}` ({}); one node's digest does not fail another's: rerun on more nodes to find the odd one",
                            split.join(", ")
                        ),
                    ),
                }
            }
            notes.push(format!(
                "`{label}`: {nodes} nodes disagree with no majority of nodes ({})",
                split.join(", ")
            ));
        }
    }
    notes
}

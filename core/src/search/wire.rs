//! A search's rounds and verdict as `gpuctl.v1` carries them in a rank's
//! result (`CollectiveResult`): written one way, by `gpuctl-worker` and by
//! the simulator's ranks alike, so that the coordinator judges both the same.

use gpuctl_proto::pb::{BisectGroup, BisectRound, CollectiveResult, SearchBlame};

use super::{Blame, Search};

/// One measured round: its groups (node ranks), each group's busbw, and
/// what the round decided, in words.
pub fn round(round: usize, groups: &[Vec<usize>], busbw: &[f64], decision: String) -> BisectRound {
    BisectRound {
        round: round as u32,
        groups: groups
            .iter()
            .zip(busbw)
            .map(|(g, &b)| BisectGroup {
                nodes: g.iter().map(|&k| k as u32).collect(),
                busbw_gbps: b,
                names: Vec::new(),
            })
            .collect(),
        decision,
    }
}

/// The search's verdict into `result`: every culprit blamed with both its
/// figures, the suspects a second look cleared, the nodes left undecided.
pub fn verdict(result: &mut CollectiveResult, search: &Search) {
    let o = search.outcome();
    result.search_blamed = o.blamed.iter().map(blame).collect();
    result.search_cleared = o
        .cleared_on_second_look
        .iter()
        .map(|(n, _)| *n as u32)
        .collect();
    result.search_undecided = o.undecided.iter().map(|n| *n as u32).collect();
}

fn blame(b: &Blame) -> SearchBlame {
    match b {
        Blame::Node {
            node,
            first,
            confirm,
            partners,
        } => SearchBlame {
            node: Some(*node as u32),
            first_gbps: *first,
            confirm_gbps: *confirm,
            partners: vec![partners.0 as u32, partners.1 as u32],
            ..Default::default()
        },
        Blame::Link {
            a,
            b,
            first,
            confirm,
        } => SearchBlame {
            link_a: Some(*a as u32),
            link_b: Some(*b as u32),
            first_gbps: *first,
            confirm_gbps: *confirm,
            ..Default::default()
        },
    }
}

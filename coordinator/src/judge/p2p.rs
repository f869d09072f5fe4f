//! GPU pairs inside nodes (`p2p`): every ordered pair's bandwidth, the slower
//! of its two ranks' figures, each the better of two passes, judged against
//! the job's upper-quartile pair of the same GPU model.
//!
//! The reference is the upper quartile, not the median: one degraded GPU of
//! four is in half of the node's pairs, and a median would sit between the
//! fast and the slow ones. A pair below `slow ×` it is slow. A GPU in most of
//! its pairs slow (three GPUs or more on the node, so that its peers have
//! fast pairs to show) is the culprit and fails its rank; any other slow pair
//! fails the node, naming both GPUs. Wrong elements fail the pair at once.

use std::collections::BTreeMap;

use gpuctl_core::pb::{rank_result::Detail, Finding, GpuPair, Plan, RankResult, Verdict};

use gpuctl_core::stats::upper_quartile;

/// What the pairs of a job say.
#[derive(Debug, Default)]
pub struct Judged {
    pub pairs: Vec<GpuPair>,
    pub findings: Vec<Finding>,
    pub notes: Vec<String>,
}

/// Ratios a pair is judged by: GPU ranks' and CPU ranks' (a CPU "pair" is
/// TCP on loopback between processes that share a few cores).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratios {
    pub slow: f64,
    pub cpu_slow: f64,
}

/// One directed pair: both ranks' figures folded into the slower of each pass.
#[derive(Debug, Clone)]
struct Measured {
    node: String,
    model: String,
    cpu: bool,
    bytes: u64,
    first: f64,
    repeat: f64,
    wrong: u64,
    src_local: u32,
    dst_local: u32,
}

impl Measured {
    /// The better pass: one slow pass never blames a pair.
    fn judged(&self) -> f64 {
        self.first.max(self.repeat)
    }
}

fn collect(results: &BTreeMap<u32, RankResult>, plan: &Plan) -> BTreeMap<(u32, u32), Measured> {
    let node_of: BTreeMap<u32, &str> = plan
        .ranks
        .iter()
        .map(|p| (p.rank, p.node.as_str()))
        .collect();
    let mut out: BTreeMap<(u32, u32), Measured> = BTreeMap::new();
    for r in results.values() {
        let Some(Detail::P2p(p)) = &r.detail else {
            continue;
        };
        for c in &p.peers {
            // A rank speaks only of pairs on its own node.
            let node = node_of.get(&r.rank).copied().unwrap_or(r.node.as_str());
            let (src, dst) = (node_of.get(&c.src_rank), node_of.get(&c.dst_rank));
            if src != Some(&node) || dst != Some(&node) {
                continue;
            }
            let e = out
                .entry((c.src_rank, c.dst_rank))
                .or_insert_with(|| Measured {
                    node: node.to_string(),
                    model: r.device_name.clone(),
                    cpu: p.method == "host",
                    bytes: p.bytes,
                    first: f64::INFINITY,
                    repeat: f64::INFINITY,
                    wrong: 0,
                    src_local: c.src_local,
                    dst_local: c.dst_local,
                });
            e.first = e.first.min(c.gbps);
            e.repeat = e.repeat.min(c.repeat_gbps);
            e.wrong += c.wrong;
        }
    }
    out
}

/// Judges the GPU pairs of a job.
pub fn judge(results: &BTreeMap<u32, RankResult>, plan: &Plan, ratios: Ratios) -> Judged {
    let measured = collect(results, plan);
    let mut out = Judged::default();
    if measured.is_empty() {
        return out;
    }
    let gpu_of: BTreeMap<u32, Option<u32>> =
        plan.ranks.iter().map(|p| (p.rank, p.gpu_index)).collect();
    let gpu = |rank: u32| gpu_of.get(&rank).copied().flatten();
    let label = |rank: u32| match gpu(rank) {
        Some(i) => format!("GPU {i}"),
        None => format!("rank {rank}"),
    };
    let mut by_model: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for m in measured.values() {
        by_model.entry(&m.model).or_default().push(m.judged());
    }
    let reference: BTreeMap<&str, Option<f64>> = by_model
        .into_iter()
        // Three pairs at least: fewer have nothing to be compared with.
        .map(|(model, v)| (model, (v.len() >= 3).then(|| upper_quartile(v)).flatten()))
        .collect();
    let ratio_of = |m: &Measured| if m.cpu { ratios.cpu_slow } else { ratios.slow };
    for (model, r) in &reference {
        let model = if model.is_empty() { "ranks" } else { model };
        out.notes.push(match r {
            Some(r) => format!(
                "GPU pairs ({model}): each the better of two passes, against the job's upper-quartile pair, {r:.2} GB/s; slow below {:.2}x",
                ratios.slow
            ),
            None => format!(
                "GPU pairs ({model}): fewer than three pairs, nothing to compare them with; judge them against a baseline or floors"
            ),
        });
    }
    let slow = |m: &Measured| -> bool {
        m.wrong > 0 || reference[m.model.as_str()].is_some_and(|r| m.judged() < ratio_of(m) * r)
    };
    // Slow pairs per rank, and all of each rank's pairs.
    let mut slow_of: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    let mut all_of: BTreeMap<u32, usize> = BTreeMap::new();
    let mut locals: BTreeMap<&str, usize> = BTreeMap::new();
    for (&(s, d), m) in &measured {
        let gpus = m.src_local.max(m.dst_local) as usize + 1;
        let e = locals.entry(&m.node).or_default();
        *e = (*e).max(gpus);
        for (x, y) in [(s, d), (d, s)] {
            *all_of.entry(x).or_default() += 1;
            if slow(m) {
                slow_of.entry(x).or_default().push(y);
            }
        }
    }
    let mut culprits = std::collections::BTreeSet::new();
    for (&rank, peers) in &slow_of {
        let Some(m) = measured
            .iter()
            .find(|((s, d), _)| *s == rank || *d == rank)
            .map(|(_, m)| m)
        else {
            continue;
        };
        let total = all_of[&rank];
        if locals[m.node.as_str()] < 3 || peers.len() * 2 <= total {
            continue;
        }
        culprits.insert(rank);
        let r = reference[m.model.as_str()].unwrap_or(0.0);
        let mine: Vec<f64> = measured
            .iter()
            .filter(|((s, d), _)| *s == rank || *d == rank)
            .map(|(_, m)| m.judged())
            .collect();
        let med = gpuctl_core::stats::median(mine).unwrap_or(0.0);
        let mut with: Vec<String> = peers.iter().map(|p| label(*p)).collect();
        with.dedup();
        out.findings.push(Finding {
            node: m.node.clone(),
            rank: Some(rank),
            gpu_index: gpu(rank),
            metric: "p2p_pair".into(),
            key: format!("send {}", m.bytes),
            value: med,
            reference: r,
            reference_kind: "fleet".into(),
            rule: format!(
                "p2p rule: a pair below {:.2}x the job's upper-quartile pair is slow; a GPU in most of its pairs slow is the culprit",
                ratio_of(m)
            ),
            level: Verdict::Fail as i32,
            unit: "GB/s".into(),
            detail: format!(
                "{} on {}: {} of its {total} pairs slow (their median {med:.2} GB/s against the job's upper-quartile pair {r:.2} GB/s; slow with {})",
                label(rank),
                m.node,
                peers.len(),
                with.join(", ")
            ),
            ..Default::default()
        });
    }
    for (&(s, d), m) in &measured {
        let r = reference[m.model.as_str()];
        let bad = slow(m);
        out.pairs.push(GpuPair {
            node: m.node.clone(),
            src_rank: s,
            dst_rank: d,
            src_gpu: gpu(s),
            dst_gpu: gpu(d),
            bytes: m.bytes,
            gbps: m.judged(),
            first_gbps: m.first,
            repeat_gbps: m.repeat,
            wrong: m.wrong,
            verdict: if bad { Verdict::Fail } else { Verdict::Pass } as i32,
            reference_gbps: r.unwrap_or(0.0),
            src_local: m.src_local,
            dst_local: m.dst_local,
        });
        if !bad || culprits.contains(&s) || culprits.contains(&d) {
            continue;
        }
        let (ls, ld) = (label(s), label(d));
        out.findings.push(Finding {
            node: m.node.clone(),
            metric: "p2p_pair".into(),
            key: format!("send {} {ls}->{ld}", m.bytes),
            value: m.judged(),
            reference: r.unwrap_or(0.0),
            reference_kind: "fleet".into(),
            rule: format!(
                "p2p rule: a pair below {:.2}x the job's upper-quartile pair is slow",
                ratio_of(m)
            ),
            level: Verdict::Fail as i32,
            unit: "GB/s".into(),
            detail: if m.wrong > 0 {
                format!(
                    "{}: {} wrong elements arrived from {ls} at {ld}",
                    m.node, m.wrong
                )
            } else {
                let count = |r: u32| (slow_of.get(&r).map_or(0, Vec::len), all_of[&r]);
                let ((si, sn), (di, dn)) = (count(s), count(d));
                let why = if si == 1 && di == 1 {
                    "both GPUs are fast with their other peers, so the path between them (NVLink, PCIe switch) is suspect".to_string()
                } else {
                    format!("{ls} is slow in {si} of its {sn} pairs, {ld} in {di} of {dn}")
                };
                format!(
                    "{}: {ls} -> {ld} {:.2} GB/s (measured twice: {:.2} and {:.2}) against the job's upper-quartile pair {:.2} GB/s; {why}",
                    m.node,
                    m.judged(),
                    m.first,
                    m.repeat,
                    r.unwrap_or(0.0)
                )
            },
            ..Default::default()
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_core::pb::{P2pResult, PeerCopy, RankPlacement};

    /// One node of `l` GPUs (rank = local rank = GPU index); every rank
    /// reports its pairs with `bw(src, dst, pass)`.
    fn job(l: u32, bw: impl Fn(u32, u32, usize) -> f64) -> (BTreeMap<u32, RankResult>, Plan) {
        let plan = Plan {
            nodes: vec!["n0".into()],
            ranks: (0..l)
                .map(|r| RankPlacement {
                    rank: r,
                    local_rank: r,
                    node: "n0".into(),
                    gpu_index: Some(r),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let results = (0..l)
            .map(|r| {
                let peers = (0..l)
                    .flat_map(|a| (0..l).map(move |b| (a, b)))
                    .filter(|&(a, b)| a != b && (a == r || b == r))
                    .map(|(a, b)| PeerCopy {
                        src_rank: a,
                        dst_rank: b,
                        src_local: a,
                        dst_local: b,
                        gbps: bw(a, b, 0),
                        repeat_gbps: bw(a, b, 1),
                        wrong: 0,
                    })
                    .collect();
                let res = RankResult {
                    rank: r,
                    node: "n0".into(),
                    ok: true,
                    device_name: "NVIDIA H100 80GB HBM3".into(),
                    detail: Some(Detail::P2p(P2pResult {
                        bytes: 1 << 28,
                        method: "pinned".into(),
                        peers,
                        ..Default::default()
                    })),
                    ..Default::default()
                };
                (r, res)
            })
            .collect();
        (results, plan)
    }

    const R: Ratios = Ratios {
        slow: 0.8,
        cpu_slow: 0.3,
    };

    #[test]
    fn a_healthy_node_has_no_slow_pair() {
        let (res, plan) = job(4, |a, b, _| 360.0 + (a * 4 + b) as f64);
        let j = judge(&res, &plan, R);
        assert_eq!(j.pairs.len(), 12);
        assert!(j.findings.is_empty(), "{:#?}", j.findings);
    }

    #[test]
    fn a_degraded_gpu_is_named_and_its_peers_are_not() {
        let (res, plan) = job(4, |a, b, _| if a == 2 || b == 2 { 120.0 } else { 360.0 });
        let j = judge(&res, &plan, R);
        assert_eq!(j.findings.len(), 1, "{:#?}", j.findings);
        let f = &j.findings[0];
        assert_eq!((f.rank, f.gpu_index), (Some(2), Some(2)));
        assert!(f.detail.contains("6 of its 6 pairs slow"), "{}", f.detail);
        assert_eq!(
            j.pairs
                .iter()
                .filter(|p| p.verdict() == Verdict::Fail)
                .count(),
            6
        );
    }

    #[test]
    fn one_slow_pair_names_the_pair_and_a_noisy_pass_names_nothing() {
        let (res, plan) = job(4, |a, b, _| if (a, b) == (1, 3) { 150.0 } else { 360.0 });
        let j = judge(&res, &plan, R);
        assert_eq!(j.findings.len(), 1, "{:#?}", j.findings);
        assert_eq!(
            (j.findings[0].node.as_str(), j.findings[0].rank),
            ("n0", None)
        );
        assert!(j.findings[0].detail.contains("GPU 1 -> GPU 3"));
        // Slow in one pass only: not blamed.
        let (res, plan) = job(4, |a, b, pass| {
            if (a, b) == (1, 3) && pass == 0 {
                150.0
            } else {
                360.0
            }
        });
        let j = judge(&res, &plan, R);
        assert!(j.findings.is_empty(), "{:#?}", j.findings);
        let p = j
            .pairs
            .iter()
            .find(|p| (p.src_rank, p.dst_rank) == (1, 3))
            .unwrap();
        assert_eq!((p.first_gbps, p.repeat_gbps, p.gbps), (150.0, 360.0, 360.0));
    }

    #[test]
    fn the_slower_rank_sets_the_pair_and_wrong_elements_fail_it() {
        let (mut res, plan) = job(2, |_, _, _| 360.0);
        if let Some(Detail::P2p(p)) = &mut res.get_mut(&1).unwrap().detail {
            p.peers[0].gbps = 300.0;
            p.peers[0].repeat_gbps = 310.0;
            p.peers[1].wrong = 5;
        }
        let j = judge(&res, &plan, R);
        assert_eq!(j.pairs.len(), 2);
        let p01 = &j.pairs[0];
        assert_eq!((p01.src_rank, p01.dst_rank, p01.gbps), (0, 1, 310.0));
        assert!(j.notes[0].contains("fewer than three pairs"));
        assert_eq!(j.findings.len(), 1);
        assert!(j.findings[0].detail.contains("5 wrong elements"));
    }
}

//! Links between nodes (`nccl --pattern pairs`): every pair's bandwidth, the
//! slowest rank's figure of each (round, pair, op), judged against the job's
//! fast links of the same op ([`reference`]). The plain median was slow
//! itself once a third of the nodes sat behind slow links (most links touch
//! one of them), and then named nobody. A link below `slow_ratio ×` the reference is slow, and one
//! whose two measurements were both cut short below the job's floor rate is
//! slow whatever the others do; a node in most of its links slow is named as
//! the culprit and fails; a slow link between two otherwise good nodes is
//! named as the link.

use std::collections::{BTreeMap, BTreeSet};

use gpuctl_core::pb::{rank_result::Detail, Finding, Link, RankResult, Verdict};

use gpuctl_core::stats::{median, quantile};

/// What the links of a job say.
#[derive(Debug, Default)]
pub struct Judged {
    pub links: Vec<Link>,
    pub findings: Vec<Finding>,
    pub notes: Vec<String>,
}

/// Key of one measured link: (op, a, b, bytes, dtype, round).
type Key = (String, u32, u32, u64, String, u32);

/// The links the ranks reported, one per (op, pair): the slowest rank's
/// bandwidth (every rank of a pair waits for the slowest), `#wrong` summed.
/// One link's two measurements, each the slowest rank's (`repeat` 0: an
/// older worker measured once), and the wrong elements of both.
#[derive(Debug, Clone, Copy)]
struct Measured {
    first: f64,
    repeat: f64,
    wrong: u64,
    /// Each measurement was cut short below the floor (`floor` GB/s algbw).
    first_below: bool,
    repeat_below: bool,
    floor: f64,
}

impl Measured {
    /// The figure judged: the better of the two, so that one slow
    /// measurement never blames a link; a second that agrees does.
    fn judged(&self) -> f64 {
        if self.repeat > 0.0 {
            self.first.max(self.repeat)
        } else {
            self.first
        }
    }

    /// Both measurements (the only one, from an older worker) ran below
    /// the floor rate.
    fn below_floor(&self) -> bool {
        self.first_below && (self.repeat_below || self.repeat <= 0.0)
    }

    fn evidence(&self) -> String {
        if self.repeat > 0.0 {
            format!(
                "measured twice: {:.2} and {:.2} GB/s",
                self.first, self.repeat
            )
        } else {
            format!("measured once: {:.2} GB/s", self.first)
        }
    }
}

fn collect(results: &BTreeMap<u32, RankResult>) -> BTreeMap<Key, Measured> {
    let mut out: BTreeMap<Key, Measured> = BTreeMap::new();
    for r in results.values() {
        let Some(Detail::Collectives(c)) = &r.detail else {
            continue;
        };
        for l in &c.links {
            let (a, b) = (l.node_a.min(l.node_b), l.node_a.max(l.node_b));
            let key = (l.op.clone(), a, b, l.bytes, l.dtype.clone(), l.round);
            let e = out.entry(key).or_insert(Measured {
                first: f64::INFINITY,
                repeat: f64::INFINITY,
                wrong: 0,
                first_below: false,
                repeat_below: false,
                floor: 0.0,
            });
            e.first = e.first.min(l.busbw_gbps);
            e.repeat = e.repeat.min(l.repeat_busbw_gbps);
            e.wrong += l.wrong;
            // The ranks of a pair agree on the cut before they make it.
            e.first_below |= l.below_floor;
            e.repeat_below |= l.repeat_below_floor;
            e.floor = e.floor.max(l.floor_gbps);
        }
    }
    out
}

fn name(nodes: &[String], rank: u32) -> String {
    nodes
        .get(rank as usize)
        .cloned()
        .unwrap_or_else(|| format!("node rank {rank}"))
}

/// The job's fast links of one op (`None` below two figures): the median
/// link, unless that is itself slow against the 90th percentile (most links
/// touch a slow node); then the median of the links within `slow_ratio` of
/// that percentile. A healthy job's spread never switches it.
fn reference(v: &[f64], slow_ratio: f64) -> Option<f64> {
    if v.len() < 2 {
        return None;
    }
    let med = median(v.to_vec())?;
    let top = quantile(v.to_vec(), 0.9)?;
    if med >= slow_ratio * top {
        return Some(med);
    }
    median(
        v.iter()
            .copied()
            .filter(|x| *x >= slow_ratio * top)
            .collect(),
    )
}

/// The nodes to blame for the slow links, worst first: the node with the
/// largest share of its links slow, among links to nodes not yet blamed, is
/// a culprit while that share is over half (of two links or more). Counting
/// every link, a healthy node with most of its peers slow (half a fleet
/// behind bad links) had most of its links slow too, and was blamed.
/// `peers_of[(op, node)]`: each link's other node and whether it is slow.
fn culprits(peers_of: &BTreeMap<(&str, u32), Vec<(u32, bool)>>) -> BTreeSet<u32> {
    let mut out = BTreeSet::new();
    loop {
        let worst = peers_of
            .iter()
            .filter(|((_, node), _)| !out.contains(node))
            .filter_map(|((_, node), peers)| {
                let left: Vec<bool> = peers
                    .iter()
                    .filter(|(p, _)| !out.contains(p))
                    .map(|(_, slow)| *slow)
                    .collect();
                let slow = left.iter().filter(|s| **s).count();
                (left.len() >= 2 && slow * 2 > left.len())
                    .then_some((slow as f64 / left.len() as f64, *node))
            })
            .max_by(|x, y| x.0.total_cmp(&y.0).then(y.1.cmp(&x.1)));
        match worst {
            Some((_, node)) => {
                out.insert(node);
            }
            None => return out,
        }
    }
}

/// Judges the links of a job whose nodes are `nodes` (by node rank).
pub fn judge(results: &BTreeMap<u32, RankResult>, nodes: &[String], slow_ratio: f64) -> Judged {
    let measured = collect(results);
    let mut out = Judged::default();
    if measured.is_empty() {
        return out;
    }
    let mut by_op: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for ((op, ..), m) in &measured {
        let v = by_op.entry(op.as_str()).or_default();
        if !m.below_floor() {
            v.push(m.judged());
        }
    }
    let reference: BTreeMap<&str, Option<f64>> = by_op
        .iter()
        .map(|(op, v)| (*op, reference(v, slow_ratio)))
        .collect();
    for (op, m) in &reference {
        match m {
            Some(m) => out.notes.push(format!(
                "links ({op}): each against the job's fast links (the median link, or when that is slow against the 90th percentile the median of those near it), {m:.2} GB/s; slow below {slow_ratio:.2}x"
            )),
            None => out.notes.push(format!(
                "links ({op}): one link only above the floor, nothing to compare it with; judge it against a baseline"
            )),
        }
    }
    let slow_at = |op: &str, two: &Measured| {
        two.below_floor()
            || two.wrong > 0
            || reference
                .get(op)
                .copied()
                .flatten()
                .is_some_and(|m| two.judged() < slow_ratio * m)
    };
    // Slow links per node, per op.
    let mut peers_of: BTreeMap<(&str, u32), Vec<(u32, bool)>> = BTreeMap::new();
    for ((op, a, b, bytes, dtype, round), two) in &measured {
        let (bw, wrong) = (&two.judged(), &two.wrong);
        let m = reference[op.as_str()];
        let bad = slow_at(op, two);
        for (x, y) in [(*a, *b), (*b, *a)] {
            peers_of.entry((op.as_str(), x)).or_default().push((y, bad));
        }
        out.links.push(Link {
            a: name(nodes, *a),
            b: name(nodes, *b),
            op: op.clone(),
            bytes: *bytes,
            dtype: dtype.clone(),
            round: *round,
            busbw_gbps: *bw,
            wrong: *wrong,
            verdict: if bad { Verdict::Fail } else { Verdict::Pass } as i32,
            reference_gbps: m.unwrap_or(0.0),
            measured_unix_ms: 0,
            first_gbps: two.first,
            repeat_gbps: two.repeat,
            below_floor: two.below_floor(),
        });
    }
    // A node in most of its links slow is the culprit; its links are explained.
    let culprits = culprits(&peers_of);
    for ((op, node), all) in &peers_of {
        let total = all.len();
        let peers: Vec<u32> = all
            .iter()
            .filter(|(_, slow)| *slow)
            .map(|(p, _)| *p)
            .collect();
        if culprits.contains(node) && peers.len() * 2 > total {
            let m = reference[op].unwrap_or(0.0);
            let mine: Vec<f64> = measured
                .iter()
                .filter(|((o, a, b, ..), _)| o == op && (a == node || b == node))
                .map(|(_, two)| two.judged())
                .collect();
            let med = median(mine).unwrap_or(0.0);
            out.findings.push(Finding {
                node: name(nodes, *node),
                metric: "link_busbw".into(),
                key: op.to_string(),
                value: med,
                reference: m,
                reference_kind: "fleet".into(),
                rule: format!(
                    "links rule: a link below {slow_ratio:.2}x the job's fast links, or below the floor rate, is slow; a node in most of its links slow is the culprit"
                ),
                level: Verdict::Fail as i32,
                unit: "GB/s".into(),
                detail: format!(
                    "node {}: {} of {total} {op} links slow (median of its links {med:.2} GB/s against the job's fast links' {m:.2} GB/s; slow with {})",
                    name(nodes, *node),
                    peers.len(),
                    peers.iter().map(|p| name(nodes, *p)).collect::<Vec<_>>().join(", ")
                ),
                ..Default::default()
            });
        }
    }
    // A slow link between two nodes that are not culprits is the link's fault.
    for ((op, a, b, ..), two) in &measured {
        let (bw, wrong) = (&two.judged(), &two.wrong);
        let m = reference[op.as_str()];
        if !slow_at(op, two) || culprits.contains(a) || culprits.contains(b) {
            continue;
        }
        let (na, nb) = (name(nodes, *a), name(nodes, *b));
        out.findings.push(Finding {
            metric: "link_busbw".into(),
            key: format!("{op} {na}-{nb}"),
            value: *bw,
            reference: m.unwrap_or(0.0),
            reference_kind: "fleet".into(),
            rule: format!("links rule: a link below {slow_ratio:.2}x the job's fast links, or below the floor rate, is slow"),
            level: Verdict::Fail as i32,
            unit: "GB/s".into(),
            detail: if *wrong > 0 {
                format!("link {na} <-> {nb}: {wrong} wrong elements in {op}")
            } else if two.below_floor() {
                format!(
                    "link {na} <-> {nb}: {op} below the floor of {:.3} GB/s algbw, each measurement cut short after two operations ({}); both nodes are fine with their other peers, so the link (cable, port, switch) is suspect",
                    two.floor,
                    two.evidence()
                )
            } else {
                format!(
                    "link {na} <-> {nb}: {op} {bw:.2} GB/s ({}) against the job's fast links' {:.2} GB/s; both nodes are fine with their other peers, so the link (cable, port, switch) is suspect",
                    two.evidence(),
                    m.unwrap_or(0.0)
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
    use gpuctl_core::pb::{CollectiveResult, LinkResult};

    /// Rank `r` (one per node) reports every link it took part in.
    fn results(n: u32, bw: impl Fn(u32, u32) -> f64) -> BTreeMap<u32, RankResult> {
        let mut out = BTreeMap::new();
        for r in 0..n {
            let mut links = Vec::new();
            for p in 0..n {
                if p != r {
                    links.push(LinkResult {
                        node_a: r.min(p),
                        node_b: r.max(p),
                        op: "all_reduce".into(),
                        bytes: 1 << 20,
                        dtype: "float".into(),
                        busbw_gbps: bw(r.min(p), r.max(p)),
                        ..Default::default()
                    });
                }
            }
            out.insert(
                r,
                RankResult {
                    rank: r,
                    ok: true,
                    detail: Some(Detail::Collectives(CollectiveResult {
                        links,
                        ..Default::default()
                    })),
                    ..Default::default()
                },
            );
        }
        out
    }

    fn nodes(n: u32) -> Vec<String> {
        (0..n).map(|i| format!("node-{i}")).collect()
    }

    #[test]
    fn a_slow_node_is_named_and_its_peers_are_not() {
        let r = results(4, |a, b| if a == 2 || b == 2 { 1.0 } else { 10.0 });
        let j = judge(&r, &nodes(4), 0.8);
        assert_eq!(j.links.len(), 6);
        let nodes_failed: Vec<&str> = j.findings.iter().map(|f| f.node.as_str()).collect();
        assert_eq!(nodes_failed, vec!["node-2"], "{:#?}", j.findings);
        assert!(j.findings[0]
            .detail
            .contains("3 of 3 all_reduce links slow"));
    }

    #[test]
    fn one_slow_link_between_good_nodes_names_the_link() {
        let r = results(4, |a, b| if (a, b) == (1, 3) { 2.0 } else { 10.0 });
        let j = judge(&r, &nodes(4), 0.8);
        assert_eq!(j.findings.len(), 1, "{:#?}", j.findings);
        assert_eq!(j.findings[0].node, "", "the link, not a node");
        assert!(j.findings[0].key.contains("node-1-node-3"));
        let slow: Vec<&Link> = j
            .links
            .iter()
            .filter(|l| l.verdict() == Verdict::Fail)
            .collect();
        assert_eq!(slow.len(), 1);
    }

    /// Issue 34: n0 <-> n2 over sockets once at 0.77x the median link, a
    /// noisy measurement; measured again it is as fast as the others.
    #[test]
    fn a_link_is_blamed_only_when_its_second_measurement_agrees() {
        let repeat = |r: &mut BTreeMap<u32, RankResult>, f: &dyn Fn(u32, u32) -> f64| {
            for res in r.values_mut() {
                if let Some(Detail::Collectives(c)) = &mut res.detail {
                    for l in &mut c.links {
                        l.repeat_busbw_gbps = f(l.node_a, l.node_b);
                    }
                }
            }
        };
        let once_slow = |a, b| if (a, b) == (0, 2) { 2.11 } else { 2.9 };
        let mut r = results(4, once_slow);
        repeat(&mut r, &|_, _| 2.9);
        let j = judge(&r, &nodes(4), 0.8);
        assert!(j.findings.is_empty(), "{:#?}", j.findings);
        let l = j
            .links
            .iter()
            .find(|l| l.a == "node-0" && l.b == "node-2")
            .unwrap();
        assert_eq!(
            (l.first_gbps, l.repeat_gbps, l.busbw_gbps),
            (2.11, 2.9, 2.9)
        );

        let mut r = results(4, once_slow);
        repeat(&mut r, &|a, b| if (a, b) == (0, 2) { 2.05 } else { 2.9 });
        let j = judge(&r, &nodes(4), 0.8);
        assert_eq!(j.findings.len(), 1, "{:#?}", j.findings);
        assert!(
            j.findings[0]
                .detail
                .contains("measured twice: 2.11 and 2.05 GB/s"),
            "{}",
            j.findings[0].detail
        );
    }

    /// Issue 36: with a third of the nodes behind slow links, most links
    /// touch one of them and the median link is slow itself: the median
    /// rule passed every node.
    #[test]
    fn a_third_of_the_nodes_slow_are_all_named() {
        let bad = [1u32, 4, 7];
        let r = results(9, |a, b| {
            let base = 10.0 + ((a * 7 + b * 3) % 5) as f64 * 0.2;
            if bad.contains(&a) || bad.contains(&b) {
                base / 8.0
            } else {
                base
            }
        });
        let j = judge(&r, &nodes(9), 0.8);
        let mut named: Vec<&str> = j.findings.iter().map(|f| f.node.as_str()).collect();
        named.sort();
        assert_eq!(named, ["node-1", "node-4", "node-7"], "{:#?}", j.findings);
        assert!(
            j.links.iter().all(|l| l.reference_gbps >= 10.0),
            "{:?}",
            j.links
        );
        // Half the nodes slow: three quarters of the links; still named.
        let r = results(8, |a, b| if a % 2 == 1 || b % 2 == 1 { 1.0 } else { 10.0 });
        let j = judge(&r, &nodes(8), 0.8);
        let named: Vec<&str> = j.findings.iter().map(|f| f.node.as_str()).collect();
        assert_eq!(
            named,
            ["node-1", "node-3", "node-5", "node-7"],
            "{:#?}",
            j.findings
        );
    }

    /// A link cut short below the floor in both measurements is slow even
    /// where nothing else is there to compare it with.
    #[test]
    fn a_link_below_the_floor_is_slow_on_its_own() {
        let mut r = results(3, |a, b| if (a, b) == (0, 2) { 0.004 } else { 1.2 });
        for res in r.values_mut() {
            if let Some(Detail::Collectives(c)) = &mut res.detail {
                for l in &mut c.links {
                    let below = (l.node_a, l.node_b) == (0, 2);
                    l.repeat_busbw_gbps = l.busbw_gbps;
                    (l.below_floor, l.repeat_below_floor, l.floor_gbps) = (below, below, 0.05);
                }
            }
        }
        let j = judge(&r, &nodes(3), 0.8);
        assert_eq!(j.findings.len(), 1, "{:#?}", j.findings);
        assert!(
            j.findings[0]
                .detail
                .contains("below the floor of 0.050 GB/s"),
            "{}",
            j.findings[0].detail
        );
        let l = j.links.iter().find(|l| l.below_floor).unwrap();
        assert_eq!((l.a.as_str(), l.b.as_str()), ("node-0", "node-2"));
        // Cut short once and measured in full the second time: judged on
        // the better figure, as any link.
        for res in r.values_mut() {
            if let Some(Detail::Collectives(c)) = &mut res.detail {
                for l in &mut c.links {
                    l.repeat_below_floor = false;
                    l.repeat_busbw_gbps = 1.2;
                }
            }
        }
        assert!(judge(&r, &nodes(3), 0.8).findings.is_empty());
    }

    #[test]
    fn a_healthy_fleet_has_no_slow_link() {
        let r = results(5, |a, b| 10.0 + (a + b) as f64 * 0.1);
        let j = judge(&r, &nodes(5), 0.8);
        assert_eq!(j.links.len(), 10);
        assert!(j.findings.is_empty());
        assert!(j.links.iter().all(|l| l.verdict() == Verdict::Pass));
    }

    #[test]
    fn the_slowest_rank_of_a_pair_sets_the_link() {
        let mut r = results(2, |_, _| 10.0);
        if let Some(Detail::Collectives(c)) = &mut r.get_mut(&1).unwrap().detail {
            c.links[0].busbw_gbps = 7.0;
        }
        let j = judge(&r, &nodes(2), 0.8);
        assert_eq!(j.links.len(), 1);
        assert_eq!(j.links[0].busbw_gbps, 7.0);
        assert!(j.notes[0].contains("one link only"));
    }
}

//! Links between nodes (`nccl --pattern pairs`): every pair's bandwidth, the
//! slowest rank's figure of each (round, pair, op), judged against the
//! healthy links of the same op and round ([`Healthy`]): the median of the
//! links between nodes that are not slow themselves, measured at the same
//! time under the same load. The plain median was slow itself once a third
//! of the nodes sat behind slow links (most links touch one of them), and
//! then named nobody; the median of the links near the 90th percentile that
//! replaced it was the top of the healthy links, and with two slow nodes of
//! seven it failed three healthy ones at 0.66x; the job's healthy median
//! alone failed healthy links of a busy round (three CPU-bound pairs on two
//! cores read half of one pair beside two throttled ones). A link below
//! `slow_ratio ×` the reference is slow, and one whose two measurements were
//! both cut short below the job's floor rate is slow whatever the others do;
//! a node in most of its links slow is named as the culprit and fails; a
//! slow link between two otherwise good nodes is named as the link.

use std::collections::{BTreeMap, BTreeSet};

use gpuctl_proto::pb::{rank_result::Detail, Link, RankResult, Verdict};

use super::{Check, Level, Phase};

use gpuctl_core::stats::median;

/// What the links of a job say.
#[derive(Debug, Default)]
pub struct Judged {
    pub links: Vec<Link>,
    pub findings: Vec<Check>,
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

/// The healthy links of one op: the links between nodes whose best link
/// reaches `slow_ratio ×` the median node's best. A node slow itself never
/// reaches it with any peer; a healthy node does with another healthy one,
/// however many of its links touch slow nodes. The median node is a healthy
/// one while fewer than half are slow (at half, the two middle ones' mean).
/// Against the job's fastest link instead, healthy nodes of a noisy fabric
/// fell out (three of seven CPU nodes whose best sendrecv read 0.28 GB/s
/// against one of 0.36).
#[derive(Debug, Default)]
struct Healthy {
    /// Their median over the job (`None` below two such links).
    job: Option<f64>,
    /// Their median in each round that has one.
    by_round: BTreeMap<u32, f64>,
    /// How many nodes reach the line.
    nodes: usize,
}

impl Healthy {
    /// From the op's links above the floor, `(a, b, round, figure)`.
    fn of(links: &[(u32, u32, u32, f64)], slow_ratio: f64) -> Healthy {
        let mut best: BTreeMap<u32, f64> = BTreeMap::new();
        for &(a, b, _, f) in links {
            for n in [a, b] {
                let e = best.entry(n).or_insert(0.0);
                *e = e.max(f);
            }
        }
        let top = median(best.values().copied().collect()).unwrap_or(0.0);
        let nodes: BTreeSet<u32> = best
            .into_iter()
            .filter(|(_, f)| *f >= slow_ratio * top)
            .map(|(n, _)| n)
            .collect();
        let mut rounds: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
        let mut all = Vec::new();
        for &(a, b, round, f) in links {
            if nodes.contains(&a) && nodes.contains(&b) {
                rounds.entry(round).or_default().push(f);
                all.push(f);
            }
        }
        Healthy {
            job: if all.len() < 2 { None } else { median(all) },
            by_round: rounds
                .into_iter()
                .filter_map(|(r, v)| Some((r, median(v)?)))
                .collect(),
            nodes: nodes.len(),
        }
    }

    /// The reference of a link measured in `round`: the job's healthy
    /// links, or those of its round where they are slower (they ran at the
    /// same time under the same load: a busy round), but not under half the
    /// job's (a round of a bad link or two alone). A quiet round's never
    /// raises it: one healthy link of a round is no median.
    fn at(&self, round: u32) -> Option<f64> {
        let job = self.job?;
        Some(
            self.by_round
                .get(&round)
                .map_or(job, |r| r.min(job).max(0.5 * job)),
        )
    }
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
    let mut by_op: BTreeMap<&str, Vec<(u32, u32, u32, f64)>> = BTreeMap::new();
    for ((op, a, b, _, _, round), m) in &measured {
        let v = by_op.entry(op.as_str()).or_default();
        if !m.below_floor() {
            v.push((*a, *b, *round, m.judged()));
        }
    }
    let mut healthy: BTreeMap<&str, Healthy> = BTreeMap::new();
    for (op, v) in &by_op {
        let h = Healthy::of(v, slow_ratio);
        out.notes.push(match h.job {
            Some(m) => format!(
                "links ({op}): each against the job's healthy links (between the {} nodes whose best link reaches {slow_ratio:.2}x the median node's), their median {m:.2} GB/s, or the median of its round's where lower (a busy round), not under half of it; slow below {slow_ratio:.2}x",
                h.nodes
            ),
            None => format!(
                "links ({op}): fewer than two links between healthy nodes above the floor, nothing to compare them with; judge them against a baseline"
            ),
        });
        healthy.insert(op, h);
    }
    let reference = |op: &str, round: u32| healthy.get(op).and_then(|h| h.at(round));
    let slow_at = |op: &str, round: u32, two: &Measured| {
        two.below_floor()
            || two.wrong > 0
            || reference(op, round).is_some_and(|m| two.judged() < slow_ratio * m)
    };
    // Slow links per node, per op.
    let mut peers_of: BTreeMap<(&str, u32), Vec<(u32, bool)>> = BTreeMap::new();
    for ((op, a, b, bytes, dtype, round), two) in &measured {
        let (bw, wrong) = (&two.judged(), &two.wrong);
        let m = reference(op, *round);
        let bad = slow_at(op, *round, two);
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
            let m = healthy.get(op).and_then(|h| h.job).unwrap_or(0.0);
            let mine: Vec<f64> = measured
                .iter()
                .filter(|((o, a, b, ..), _)| o == op && (a == node || b == node))
                .map(|(_, two)| two.judged())
                .collect();
            let med = median(mine).unwrap_or(0.0);
            out.findings.push(Check {
                phase: Phase::Measured,
                node: name(nodes, *node),
                metric: "link_busbw".into(),
                key: op.to_string(),
                value: med,
                reference: m,
                reference_kind: "fleet".into(),
                rule: format!(
                    "links rule: a link below {slow_ratio:.2}x the job's healthy links, or below the floor rate, is slow; a node in most of its links slow is the culprit"
                ),
                level: Level::Fail,
                unit: "GB/s".into(),
                detail: format!(
                    "node {}: {} of {total} {op} links slow (median of its links {med:.2} GB/s against the job's healthy links' {m:.2} GB/s; slow with {})",
                    name(nodes, *node),
                    peers.len(),
                    peers.iter().map(|p| name(nodes, *p)).collect::<Vec<_>>().join(", ")
                ),
                ..Default::default()
            });
        }
    }
    // A slow link between two nodes that are not culprits is the link's fault.
    for ((op, a, b, _, _, round), two) in &measured {
        let (bw, wrong) = (&two.judged(), &two.wrong);
        let m = reference(op, *round);
        if !slow_at(op, *round, two) || culprits.contains(a) || culprits.contains(b) {
            continue;
        }
        let (na, nb) = (name(nodes, *a), name(nodes, *b));
        out.findings.push(Check {
            phase: Phase::Measured,
            metric: "link_busbw".into(),
            key: format!("{op} {na}-{nb}"),
            value: *bw,
            reference: m.unwrap_or(0.0),
            reference_kind: "fleet".into(),
            rule: format!("links rule: a link below {slow_ratio:.2}x the job's healthy links, or below the floor rate, is slow"),
            level: Level::Fail,
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
                    "link {na} <-> {nb}: {op} {bw:.2} GB/s ({}) against the healthy links' {:.2} GB/s; both nodes are fine with their other peers, so the link (cable, port, switch) is suspect",
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
mod tests;

//! `p2p` in the table report (and its CSV, Markdown and HTML): per node, the
//! matrix of GPU pairs, a row per sender and a column per receiver, each cell
//! the better of the pair's two passes with slow pairs marked and showing both;
//! then every GPU's host↔device copies, the better pass with both beside it.

use std::collections::BTreeMap;

use gpuctl_core::stats::median;
use gpuctl_proto::pb;
use gpuctl_proto::pb::rank_result::Detail;

use super::grid::Section;
use super::table::Table;

/// What marks a slow pair (or one with wrong elements) in a matrix cell.
pub const SLOW_MARK: &str = "*";

/// One GPU (or CPU rank) of a node's matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    pub rank: u32,
    pub local: u32,
    /// `GPU 3`, or `rank 5` for a CPU rank.
    pub label: String,
}

/// A node's GPU pairs, ready to lay out: its GPUs in local-rank order and
/// every measured ordered pair by (sender, receiver) rank.
pub struct Matrix<'a> {
    pub node: &'a str,
    pub members: Vec<Member>,
    pub cells: BTreeMap<(u32, u32), &'a pb::GpuPair>,
}

impl Matrix<'_> {
    /// The pair `src` sends to `dst` over, if it was measured.
    pub fn pair(&self, src: u32, dst: u32) -> Option<&pb::GpuPair> {
        self.cells.get(&(src, dst)).copied()
    }

    /// The median of every pair `rank` is in, as sender and as receiver.
    /// (The GPU's `p2p_gbps` figure is the same median over its own
    /// timings; a pair here is the slower of its two ranks', so it may read
    /// a little lower.)
    pub fn median_of(&self, rank: u32) -> Option<f64> {
        median(
            self.cells
                .iter()
                .filter(|((s, d), _)| *s == rank || *d == rank)
                .map(|(_, p)| p.gbps)
                .collect(),
        )
    }

    /// The references the node's pairs were judged against (one per GPU
    /// model; none when the job had fewer than three pairs of a model).
    pub fn references(&self) -> Vec<f64> {
        let mut v: Vec<f64> = self
            .cells
            .values()
            .map(|p| p.reference_gbps)
            .filter(|r| *r > 0.0)
            .collect();
        v.sort_by(f64::total_cmp);
        v.dedup();
        v
    }
}

/// GB/s with a decimal for GPUs (hundreds) and two for CPU ranks (units).
pub fn gbps(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn label(rank: u32, gpu: Option<u32>) -> String {
    match gpu {
        Some(g) => format!("GPU {g}"),
        None => format!("rank {rank}"),
    }
}

/// One matrix per node that has GPU pairs, nodes by name.
pub fn matrices(r: &pb::Report) -> Vec<Matrix<'_>> {
    let mut by_node: BTreeMap<&str, Vec<&pb::GpuPair>> = BTreeMap::new();
    for p in &r.gpu_pairs {
        by_node.entry(p.node.as_str()).or_default().push(p);
    }
    by_node
        .into_iter()
        .map(|(node, pairs)| {
            let mut members: BTreeMap<u32, Member> = BTreeMap::new();
            for p in &pairs {
                for (rank, local, gpu) in [
                    (p.src_rank, p.src_local, p.src_gpu),
                    (p.dst_rank, p.dst_local, p.dst_gpu),
                ] {
                    members.entry(rank).or_insert_with(|| Member {
                        rank,
                        local,
                        label: label(rank, gpu),
                    });
                }
            }
            let mut members: Vec<Member> = members.into_values().collect();
            members.sort_by_key(|m| (m.local, m.rank));
            let cells = pairs
                .into_iter()
                .map(|p| ((p.src_rank, p.dst_rank), p))
                .collect();
            Matrix {
                node,
                members,
                cells,
            }
        })
        .collect()
}

/// A pair's cell: the better pass; a slow pair both passes (first/second)
/// and the mark, with its wrong elements when some arrived wrong.
pub fn cell(p: &pb::GpuPair) -> String {
    if p.verdict() != pb::Verdict::Fail {
        return gbps(p.gbps);
    }
    let mut s = if p.first_gbps > 0.0 || p.repeat_gbps > 0.0 {
        format!("{}/{}{SLOW_MARK}", gbps(p.first_gbps), gbps(p.repeat_gbps))
    } else {
        format!("{}{SLOW_MARK}", gbps(p.gbps))
    };
    if p.wrong > 0 {
        s.push_str(&format!(" {} wrong", p.wrong));
    }
    s
}

/// The title line of a node's matrix.
pub fn title(node: &str) -> String {
    format!("GPU PAIRS {node} (GB/s, row sends to column)")
}

/// The legend under a node's matrix: how to read a cell.
pub fn legend(m: &Matrix) -> String {
    let refs: Vec<String> = m.references().into_iter().map(gbps).collect();
    let reference = match refs.len() {
        0 => "no reference (fewer than three pairs)".to_string(),
        _ => format!("the job's upper-quartile pair {} GB/s", refs.join(", ")),
    };
    format!(
        "each cell is the better of two passes; {SLOW_MARK} = slow (against {reference}) or wrong elements, \
         and a slow cell shows both passes, first/second; MEDIAN = the GPU's pairs both ways"
    )
}

/// A node's matrix before layout: `FROM \ TO`, one column per receiver,
/// then the sender's median pair.
pub fn matrix_grid(m: &Matrix) -> Table {
    let mut headers = vec!["FROM \\ TO".to_string()];
    headers.extend(m.members.iter().map(|x| x.label.clone()));
    headers.push("MEDIAN".into());
    let right: Vec<usize> = (1..headers.len()).collect();
    let mut t = Table::new(&headers).right(&right);
    for a in &m.members {
        let mut row = vec![a.label.clone()];
        for b in &m.members {
            row.push(match m.pair(a.rank, b.rank) {
                _ if a.rank == b.rank => "-".to_string(),
                Some(p) => cell(p),
                None => "?".to_string(),
            });
        }
        row.push(m.median_of(a.rank).map_or("-".into(), gbps));
        t.row(row);
    }
    t
}

/// `53.1 (52.9/53.1)`: the better pass, then both; `-` when none was measured.
pub fn passes(first: f64, repeat: f64) -> String {
    if first <= 0.0 && repeat <= 0.0 {
        return "-".into();
    }
    format!(
        "{} ({}/{})",
        gbps(first.max(repeat)),
        gbps(first),
        gbps(repeat)
    )
}

/// The ranks' p2p results, by node then local rank.
fn results(r: &pb::Report) -> Vec<(&str, &pb::RankReport, &pb::P2pResult)> {
    let mut out: Vec<(&str, &pb::RankReport, &pb::P2pResult)> = r
        .nodes
        .iter()
        .flat_map(|n| n.ranks.iter().map(move |x| (n.name.as_str(), x)))
        .filter_map(|(node, x)| match x.result.as_ref()?.detail.as_ref()? {
            Detail::P2p(p) => Some((node, x, p)),
            _ => None,
        })
        .collect();
    out.sort_by_key(|(node, x, _)| (*node, x.local_rank, x.rank));
    out
}

/// Every GPU's host↔device copies; `None` when no rank ran `p2p`.
pub fn host_grid(r: &pb::Report) -> Option<Table> {
    let all = results(r);
    if all.is_empty() {
        return None;
    }
    let mut t = Table::new(&["NODE", "GPU", "COPY", "H2D GB/S", "D2H GB/S"]).right(&[3, 4]);
    for (node, x, p) in all {
        t.row([
            node.to_string(),
            label(x.rank, x.gpu_index),
            match p.method.as_str() {
                "host" => "host memcpy".to_string(),
                m => super::dash(m),
            },
            passes(p.h2d_gbps, p.h2d_repeat_gbps),
            passes(p.d2h_gbps, p.d2h_repeat_gbps),
        ]);
    }
    Some(t)
}

/// The title line of the host↔device table.
pub const HOST_TITLE: &str =
    "HOST <-> DEVICE (GB/s: the better of two passes, then both; pinned host memory, or host memcpy on CPU ranks)";

/// The table report's p2p sections; `None` for a job without p2p results.
pub fn section(r: &pb::Report) -> Option<String> {
    let mut s = String::new();
    for m in matrices(r) {
        s.push_str(&format!("\n{}\n", title(m.node)));
        s.push_str(&matrix_grid(&m).render());
        s.push_str(&legend(&m));
        s.push('\n');
    }
    if let Some(t) = host_grid(r) {
        s.push_str(&format!("\n{HOST_TITLE}\n"));
        s.push_str(&t.render());
    }
    (!s.is_empty()).then_some(s)
}

/// The CSV and Markdown sections: `gpu pairs NODE` per node, `host device`.
pub fn grid_sections(r: &pb::Report) -> Vec<Section> {
    let mut out: Vec<Section> = matrices(r)
        .iter()
        .map(|m| Section::new(&format!("gpu pairs {}", m.node), matrix_grid(m)))
        .collect();
    if let Some(t) = host_grid(r) {
        out.push(Section::new("host device", t));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::fixtures::p2p_report;

    fn row<'a>(s: &'a str, start: &str) -> &'a str {
        s.lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no line starting `{start}` in\n{s}"))
    }

    #[test]
    fn the_matrix_has_a_row_per_sender_and_marks_the_slow_pair() {
        let s = section(&p2p_report()).unwrap();
        assert!(
            s.contains("GPU PAIRS node-a (GB/s, row sends to column)\n"),
            "{s}"
        );
        let header = row(&s, "FROM \\ TO");
        let cols: Vec<&str> = header.split("   ").map(str::trim).collect();
        assert_eq!(
            cols.iter().filter(|c| !c.is_empty()).collect::<Vec<_>>(),
            [
                &"FROM \\ TO",
                &"GPU 0",
                &"GPU 1",
                &"GPU 2",
                &"GPU 3",
                &"MEDIAN"
            ],
            "{header}"
        );
        // GPU 1 -> GPU 3 is slow: both passes and the mark, in GPU 3's column.
        let g1: Vec<&str> = row(&s, "GPU 1").split_whitespace().collect();
        assert_eq!(
            g1,
            ["GPU", "1", "360.0", "-", "360.0", "150.0/148.5*", "360.0"],
            "{s}"
        );
        // The other direction is fine; the mark is on one cell only.
        let g3: Vec<&str> = row(&s, "GPU 3").split_whitespace().collect();
        assert_eq!(
            g3,
            ["GPU", "3", "360.0", "360.0", "360.0", "-", "360.0"],
            "{s}"
        );
        assert_eq!(s.matches(SLOW_MARK).count(), 2, "cell and legend:\n{s}");
        let legend = row(&s, "each cell is the better of two passes");
        assert!(
            legend.contains("upper-quartile pair 360.0 GB/s"),
            "{legend}"
        );
        assert!(legend.contains("both passes"), "{legend}");
    }

    #[test]
    fn host_copies_show_the_better_pass_and_both() {
        let s = section(&p2p_report()).unwrap();
        let host = s.find("HOST <-> DEVICE").expect(&s);
        assert!(s.find("GPU PAIRS").unwrap() < host, "{s}");
        let lines: Vec<&str> = s[host..].lines().collect();
        assert!(lines[1].contains("H2D GB/S") && lines[1].contains("D2H GB/S"));
        assert_eq!(lines.len(), 6, "a header and four GPUs:\n{s}");
        let g2 = lines.iter().find(|l| l.contains("GPU 2")).unwrap();
        assert!(g2.starts_with("node-a"), "{g2}");
        assert!(g2.contains("53.1 (52.9/53.1)"), "{g2}");
        assert!(g2.contains("51.3 (50.0/51.3)"), "{g2}");
        let g0 = lines.iter().find(|l| l.contains("GPU 0")).unwrap();
        assert!(g0.contains("53.0 (53.0/52.0)"), "{g0}");
    }

    #[test]
    fn cpu_ranks_are_named_by_rank_and_no_p2p_means_no_section() {
        let mut r = p2p_report();
        for p in &mut r.gpu_pairs {
            p.src_gpu = None;
            p.dst_gpu = None;
        }
        let m = &matrices(&r)[0];
        let labels: Vec<&str> = m.members.iter().map(|x| x.label.as_str()).collect();
        assert_eq!(labels, ["rank 0", "rank 1", "rank 2", "rank 3"]);
        // A missing pair is `?`, never a number.
        r.gpu_pairs.retain(|p| (p.src_rank, p.dst_rank) != (0, 2));
        let t = matrix_grid(&matrices(&r)[0]);
        assert_eq!(t.rows()[0][3], "?");
        assert!(section(&pb::Report::default()).is_none());
        assert!(grid_sections(&pb::Report::default()).is_empty());
    }

    #[test]
    fn wrong_elements_are_named_in_the_cell() {
        let p = pb::GpuPair {
            gbps: 360.0,
            first_gbps: 360.0,
            repeat_gbps: 355.0,
            wrong: 5,
            verdict: pb::Verdict::Fail as i32,
            ..Default::default()
        };
        assert_eq!(cell(&p), "360.0/355.0* 5 wrong");
        assert_eq!(passes(0.0, 0.0), "-");
        assert_eq!(gbps(1.234), "1.23");
    }
}

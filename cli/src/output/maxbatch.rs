//! `maxbatch` in the table report: each rank's batch → peak memory curve, the
//! out-of-memory trials marked, and why the search stopped (the old suites
//! drew this curve with the out-of-memory point in red; here it is a table).

use gpuctl_core::units::format_bytes;
use gpuctl_proto::pb;
use gpuctl_proto::pb::rank_result::Detail;

use super::table::Table;

/// The ranks' maxbatch results, by rank.
fn results(r: &pb::Report) -> Vec<(&str, u32, &pb::MaxBatchResult)> {
    let mut out: Vec<(&str, u32, &pb::MaxBatchResult)> = r
        .nodes
        .iter()
        .flat_map(|n| n.ranks.iter().map(move |x| (n.name.as_str(), x)))
        .filter_map(|(node, x)| match x.result.as_ref()?.detail.as_ref()? {
            Detail::Maxbatch(m) => Some((node, x.rank, m)),
            _ => None,
        })
        .collect();
    out.sort_by_key(|(_, rank, _)| *rank);
    out
}

/// Why a rank's search stopped, in words.
pub fn stopped(m: &pb::MaxBatchResult) -> String {
    let why = if m.capped {
        "stopped at --limit, not at out-of-memory".to_string()
    } else {
        match m.points.iter().find(|p| !p.fits) {
            Some(p) => format!("batch {} ran out of memory", p.batch_size),
            None => "no trial ran out of memory".to_string(),
        }
    };
    if m.note.is_empty() {
        why
    } else {
        format!("{why}; {}", m.note)
    }
}

/// One row per trial of every rank, in the order they ran; `None` when the
/// report has no maxbatch result.
pub fn curve(r: &pb::Report) -> Option<String> {
    let all = results(r);
    if all.is_empty() {
        return None;
    }
    let mut t = Table::new(&["RANK", "NODE", "BATCH", "FITS", "PEAK MEM", "NOTE"]).right(&[0, 2]);
    for (node, rank, m) in all {
        for p in &m.points {
            let note = if !p.fits {
                super::truncate(p.error.lines().next().unwrap_or("out of memory"), 60)
            } else if p.batch_size == m.max_batch {
                format!("largest that fit; recommended {}", m.recommended)
            } else {
                String::new()
            };
            t.row([
                rank.to_string(),
                node.to_string(),
                p.batch_size.to_string(),
                if p.fits { "yes" } else { "OOM" }.to_string(),
                if p.peak_memory_bytes > 0 {
                    format_bytes(p.peak_memory_bytes)
                } else {
                    "-".to_string()
                },
                super::dash(&note),
            ]);
        }
        t.row([
            rank.to_string(),
            node.to_string(),
            "-".into(),
            "-".into(),
            "-".into(),
            stopped(m),
        ]);
    }
    Some(t.render())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(m: pb::MaxBatchResult) -> pb::Report {
        pb::Report {
            nodes: vec![pb::NodeReport {
                name: "n0".into(),
                ranks: vec![pb::RankReport {
                    rank: 0,
                    result: Some(Box::new(pb::RankResult {
                        detail: Some(Detail::Maxbatch(m)),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn point(batch: u32, fits: bool, gib: u64) -> pb::MaxBatchPoint {
        pb::MaxBatchPoint {
            batch_size: batch,
            fits,
            peak_memory_bytes: gib << 30,
            error: if fits {
                String::new()
            } else {
                "CUDA out of memory. Tried to allocate 2.00 GiB".into()
            },
        }
    }

    #[test]
    fn the_curve_marks_the_out_of_memory_trial_and_says_why_it_stopped() {
        let r = report(pb::MaxBatchResult {
            max_batch: 64,
            recommended: 57,
            points: vec![
                point(32, true, 20),
                point(64, true, 39),
                point(128, false, 0),
            ],
            ..Default::default()
        });
        let text = curve(&r).unwrap();
        assert!(text.contains("OOM"), "{text}");
        assert!(text.contains("CUDA out of memory"), "{text}");
        assert!(text.contains("largest that fit; recommended 57"), "{text}");
        assert!(text.contains("batch 128 ran out of memory"), "{text}");
        assert!(text.contains("39 GiB"), "{text}");
        let capped = report(pb::MaxBatchResult {
            max_batch: 64,
            capped: true,
            points: vec![point(64, true, 1)],
            ..Default::default()
        });
        assert!(curve(&capped).unwrap().contains("stopped at --limit"));
        assert!(curve(&pb::Report::default()).is_none());
    }
}

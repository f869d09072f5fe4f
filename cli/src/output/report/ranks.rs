//! The report's node and rank tables: a rank's verdict beside the figures of
//! its workload (stress, training, maxbatch), its peak memory and its reason.

use gpuctl_proto::pb::{self, rank_result::Detail};

use crate::output::{self, table::Table};

pub(super) fn nodes_table(r: &pb::Report) -> String {
    nodes_grid(r).render()
}

pub(crate) fn nodes_grid(r: &pb::Report) -> Table {
    let mut t = Table::new(&["NODE", "VERDICT", "RANKS", "REASON"]).right(&[2]);
    for n in &r.nodes {
        let pass = n
            .ranks
            .iter()
            .filter(|x| x.verdict() == pb::Verdict::Pass)
            .count();
        t.row([
            n.name.clone(),
            n.verdict().label().to_string(),
            format!("{pass}/{} pass", n.ranks.len()),
            output::dash(&n.reason),
        ]);
    }
    t
}

/// Which workload figures appear in the rank table: the union over the ranks,
/// so a mixed or partly-reported job still lines up.
#[derive(Default)]
struct Kinds {
    stress: bool,
    train: bool,
    maxbatch: bool,
}

fn kinds(r: &pb::Report) -> Kinds {
    let mut k = Kinds::default();
    for rank in r.nodes.iter().flat_map(|n| &n.ranks) {
        match rank.result.as_ref().and_then(|x| x.detail.as_ref()) {
            Some(Detail::Stress(_)) => k.stress = true,
            Some(Detail::Train(_)) => k.train = true,
            Some(Detail::Maxbatch(_)) => k.maxbatch = true,
            _ => {}
        }
    }
    k
}

/// The SDC cell of a stress rank: its own stability, then the cross-rank verdict.
/// (A rank fails for other reasons too, a slow GPU say: the coordinator's
/// digest vote is what the reason says.)
fn sdc_cell(rank: &pb::RankReport, s: &pb::StressResult, ok: bool) -> String {
    let outvoted =
        rank.reason.contains("silent data corruption") || rank.reason.contains("digests disagree");
    if s.self_mismatches > 0 {
        format!("{} of {} checks changed", s.self_mismatches, s.checks)
    } else if ok && outvoted {
        "differs from group".into()
    } else {
        format!("ok ({} checks)", s.checks)
    }
}

fn short_digest(d: &str) -> String {
    output::dash(&d.chars().take(12).collect::<String>())
}

pub(super) fn ranks_table(r: &pb::Report) -> String {
    ranks_grid(r).render()
}

pub(crate) fn ranks_grid(r: &pb::Report) -> Table {
    let k = kinds(r);
    let mut headers = vec!["RANK", "NODE", "LOCAL", "DEVICE", "DEVICE NAME", "VERDICT"];
    let mut right = vec![0, 2];
    // --with-comm: the median of its first phase, the GEMMs alone, which
    // is what names a slow GPU (beside the all_reduce all run alike).
    let alone = k.stress
        && r.nodes.iter().flat_map(|n| &n.ranks).any(|rank| {
            matches!(rank.result.as_ref().and_then(|x| x.detail.as_ref()),
                Some(Detail::Stress(s)) if !s.solo_tflops_per_interval.is_empty())
        });
    if k.stress {
        right.extend(headers.len()..headers.len() + 3 + usize::from(alone));
        headers.extend(["TFLOP/S MIN", "MEDIAN", "MAX"]);
        if alone {
            headers.push("ALONE");
        }
        headers.extend(["DIGEST", "SDC"]);
    }
    if k.train {
        right.extend(headers.len()..headers.len() + 4);
        headers.extend(["SAMPLES/S", "P50 MS", "P99 MS", "LOSS", "SCALING"]);
        right.extend(headers.len()..headers.len() + 3);
        headers.extend(["COMM MS", "EXPOSED MS", "OVERLAP"]);
    }
    if k.maxbatch {
        right.extend(headers.len()..headers.len() + 2);
        headers.extend(["MAX BATCH", "RECOMMENDED"]);
    }
    right.push(headers.len());
    headers.push("PEAK MEM");
    headers.push("REASON");
    let mut t = Table::new(&headers).right(&right);
    for (node, rank) in ranks_in_order(r) {
        let res = rank.result.as_ref();
        let detail = res.and_then(|x| x.detail.as_ref());
        let mut row = vec![
            rank.rank.to_string(),
            node.to_string(),
            rank.local_rank.to_string(),
            output::dash(&rank.device),
            output::dash(&rank.device_name),
            rank.verdict().label().to_string(),
        ];
        if k.stress {
            match detail {
                Some(Detail::Stress(s)) => {
                    row.extend([
                        output::fmt_tflops(s.tflops_min),
                        output::fmt_tflops(s.tflops_median),
                        output::fmt_tflops(s.tflops_max),
                    ]);
                    if alone {
                        row.push(if s.solo_tflops_per_interval.is_empty() {
                            "-".to_string()
                        } else {
                            output::fmt_tflops(s.solo_tflops_median)
                        });
                    }
                    row.extend([
                        short_digest(&s.digest),
                        sdc_cell(rank, s, res.is_some_and(|x| x.ok)),
                    ]);
                }
                _ => row.extend(std::iter::repeat_n("-".to_string(), 5 + usize::from(alone))),
            }
        }
        if k.train {
            match detail {
                Some(Detail::Train(t)) => row.extend([
                    if t.unit.is_empty() {
                        format!("{:.1}", t.samples_per_s)
                    } else {
                        format!("{:.1} {}", t.samples_per_s, t.unit)
                    },
                    format!("{:.1}", t.step_ms_p50),
                    format!("{:.1}", t.step_ms_p99),
                    format!("{:.4}", t.final_loss),
                    // Against this rank's own no-communication rate.
                    if t.baseline_samples_per_s > 0.0 {
                        format!("{:.1}%", t.scaling_efficiency * 100.0)
                    } else {
                        "-".to_string()
                    },
                ]),
                _ => row.extend(std::iter::repeat_n("-".to_string(), 5)),
            }
            // Per step of the first model; `-` without communication.
            match detail {
                Some(Detail::Train(t)) => {
                    row.extend(output::models::comm_cells(output::models::comm(t)))
                }
                _ => row.extend(std::iter::repeat_n("-".to_string(), 3)),
            }
        }
        if k.maxbatch {
            match detail {
                Some(Detail::Maxbatch(m)) => {
                    row.extend([m.max_batch.to_string(), m.recommended.to_string()])
                }
                _ => row.extend(std::iter::repeat_n("-".to_string(), 2)),
            }
        }
        // Train results carry the allocator's peak (the highest model's with
        // `--model a,b`); others the device's (or VmHWM on CPU).
        let peak = match (detail, res) {
            (Some(Detail::Train(t)), Some(x)) if t.peak_memory_bytes > 0 => {
                let models = output::models::train_results(x);
                models.map(|t| t.peak_memory_bytes).max().unwrap_or(0)
            }
            _ => res.map(|x| x.peak_memory_bytes).unwrap_or(0),
        };
        row.push(if peak > 0 {
            gpuctl_core::units::format_bytes(peak)
        } else {
            "-".to_string()
        });
        row.push(output::truncate(&output::dash(&rank_reason(rank)), 80));
        t.row(row);
    }
    t
}

/// Every rank with its node's name, by rank number.
pub(crate) fn ranks_in_order(r: &pb::Report) -> Vec<(&str, &pb::RankReport)> {
    let mut ranks: Vec<(&str, &pb::RankReport)> = r
        .nodes
        .iter()
        .flat_map(|n| n.ranks.iter().map(move |x| (n.name.as_str(), x)))
        .collect();
    ranks.sort_by_key(|(_, x)| x.rank);
    ranks
}

/// Why a rank got its verdict: the coordinator's reason, else the worker's error.
pub(crate) fn rank_reason(rank: &pb::RankReport) -> String {
    if rank.reason.is_empty() {
        rank.result
            .as_ref()
            .map(|x| x.error.clone())
            .unwrap_or_default()
    } else {
        rank.reason.clone()
    }
}

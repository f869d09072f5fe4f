//! Which plots a report gets, and their numbers and words: bus bandwidth
//! against message size, the link matrix as a heat map, TFLOP/s over time,
//! maxbatch's batch → peak memory curve and the step-time distribution of
//! data-parallel training. Each builder returns nothing when the report has
//! no data for it, and a note instead of a plot when the data is thin.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Result;
use gpuctl_core::units::format_bytes;
use gpuctl_proto::pb::{self, rank_result::Detail};

use super::chart::{self, Plot};
use super::lines::{whole_number, Heatmap, Histogram, Lines, Series};
use crate::output::report::ranks::ranks_in_order;
use gpuctl_core::stats::median;

/// A plot, or a sentence where a plot would be.
pub enum Figure {
    Plot(Plot),
    Note { title: String, text: String },
}

impl Figure {
    pub fn note(title: impl Into<String>, text: impl Into<String>) -> Self {
        Figure::Note {
            title: title.into(),
            text: text.into(),
        }
    }
}

fn bytes_label(v: f64) -> String {
    format_bytes(v.round() as u64)
}

/// Out-of-place bus bandwidth against message size, one line per op.
pub fn busbw(rows: &[pb::CollectiveRow]) -> Result<Option<Figure>> {
    let mut by_op: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.bytes > 0) {
        by_op
            .entry(r.op.as_str())
            .or_default()
            .push((r.bytes as f64, r.busbw_gbps));
    }
    if by_op.is_empty() {
        return Ok(None);
    }
    let mut l = Lines::new(
        "plot-busbw",
        "Bus bandwidth against message size",
        "message size (log scale)",
        "bus bandwidth (GB/s, out of place)",
    );
    l.x_log = true;
    l.x_fmt = Some(bytes_label);
    for (i, (op, mut pts)) in by_op.into_iter().enumerate() {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        l.series.push(Series::line(op, chart::colour(i), pts));
    }
    l.note = "Per op, the slowest rank's time at each size (nccl-tests' busbw).".into();
    Ok(Some(Figure::Plot(l.plot()?)))
}

/// One heat map per op of a `--pattern pairs` job: busbw between every pair.
pub fn links(links: &[pb::Link]) -> Result<Vec<Figure>> {
    let mut by_op: BTreeMap<&str, Vec<&pb::Link>> = BTreeMap::new();
    for l in links {
        by_op.entry(l.op.as_str()).or_default().push(l);
    }
    let mut out = Vec::new();
    for (i, (op, ls)) in by_op.into_iter().enumerate() {
        let names: BTreeSet<&str> = ls
            .iter()
            .flat_map(|l| [l.a.as_str(), l.b.as_str()])
            .collect();
        let names: Vec<String> = names.into_iter().map(String::from).collect();
        let at = |n: &str| names.iter().position(|x| x == n).unwrap_or(0);
        let mut cells = Vec::new();
        for l in &ls {
            let slow = l.verdict() == pb::Verdict::Fail;
            let (a, b) = (at(&l.a), at(&l.b));
            cells.push((a, b, l.busbw_gbps, slow));
            cells.push((b, a, l.busbw_gbps, slow));
        }
        let bytes = ls.first().map_or(0, |l| l.bytes);
        let reference = ls.iter().map(|l| l.reference_gbps).find(|r| *r > 0.0);
        let slow = ls
            .iter()
            .filter(|l| l.verdict() == pb::Verdict::Fail)
            .count();
        let mut note = format!(
            "Bus bandwidth (GB/s) of {op} between every pair of nodes at {}",
            format_bytes(bytes)
        );
        if let Some(r) = reference {
            note.push_str(&format!("; the median link is {r:.2} GB/s"));
        }
        note.push_str(&match slow {
            0 => "; no link is slow.".to_string(),
            1 => "; 1 slow link is outlined.".to_string(),
            n => format!("; {n} slow links are outlined."),
        });
        out.push(Figure::Plot(
            Heatmap {
                id: format!("plot-links-{i}"),
                title: format!("Link matrix: {op}"),
                names,
                cells,
                unit: "GB/s".into(),
                note,
            }
            .plot()?,
        ));
    }
    Ok(out)
}

fn rank_label(node: &str, rank: u32) -> String {
    format!("rank {rank} ({node})")
}

/// TFLOP/s of every stress rank over its run, one line per rank.
pub fn tflops(r: &pb::Report) -> Result<Option<Figure>> {
    let mut l = Lines::new(
        "plot-tflops",
        "TFLOP/s over time per rank",
        "time since the measurement started (s)",
        "TFLOP/s",
    );
    for (i, (node, rank)) in ranks_in_order(r).into_iter().enumerate() {
        let Some(Detail::Stress(s)) = rank.result.as_ref().and_then(|x| x.detail.as_ref()) else {
            continue;
        };
        if s.tflops_per_interval.is_empty() {
            continue;
        }
        let step = if s.interval_s > 0.0 {
            s.interval_s
        } else {
            1.0
        };
        let pts = s
            .tflops_per_interval
            .iter()
            .enumerate()
            .map(|(k, v)| ((k + 1) as f64 * step, *v))
            .collect();
        let mut label = rank_label(node, rank.rank);
        if !rank.device_name.is_empty() {
            label.push_str(&format!(", {}", rank.device_name));
        }
        l.series.push(Series::line(label, chart::colour(i), pts));
    }
    if l.series.is_empty() {
        return Ok(None);
    }
    l.note =
        "Each point is one measurement interval's rate of the rank's matrix multiplies.".into();
    Ok(Some(Figure::Plot(l.plot()?)))
}

/// Batch → peak memory of every maxbatch rank; out-of-memory trials as crosses.
pub fn maxbatch(r: &pb::Report) -> Result<Option<Figure>> {
    let results: Vec<(&str, u32, &pb::MaxBatchResult)> = ranks_in_order(r)
        .into_iter()
        .filter_map(|(node, x)| match x.result.as_ref()?.detail.as_ref()? {
            Detail::Maxbatch(m) => Some((node, x.rank, m)),
            _ => None,
        })
        .collect();
    if results.is_empty() {
        return Ok(None);
    }
    let peak_max = results
        .iter()
        .flat_map(|(_, _, m)| m.points.iter().map(|p| p.peak_memory_bytes))
        .max()
        .unwrap_or(0);
    let (div, unit) = if peak_max >= 1 << 30 {
        ((1u64 << 30) as f64, "GiB")
    } else {
        ((1u64 << 20) as f64, "MiB")
    };
    let mut l = Lines::new(
        "plot-maxbatch",
        "Batch size against peak memory",
        "batch size per rank (log scale)",
        &format!("peak memory ({unit})"),
    );
    l.x_log = true;
    let mut notes = Vec::new();
    let mut oom = Vec::new();
    for (i, (node, rank, m)) in results.iter().enumerate() {
        let fits: Vec<(f64, f64)> = m
            .points
            .iter()
            .filter(|p| p.fits && p.batch_size > 0)
            .map(|p| (p.batch_size as f64, p.peak_memory_bytes as f64 / div))
            .collect();
        oom.extend(
            m.points
                .iter()
                .filter(|p| !p.fits && p.batch_size > 0)
                .map(|p| (p.batch_size as f64, p.peak_memory_bytes as f64 / div)),
        );
        let mut label = rank_label(node, *rank);
        if !m.model.is_empty() {
            label.push_str(&format!(", {}", m.model));
        }
        let mut s = Series::line(label, chart::colour(i), fits);
        s.dots = true;
        l.series.push(s);
        notes.push(format!(
            "rank {rank}: largest batch that fit {}, recommended {} ({}).",
            m.max_batch,
            m.recommended,
            crate::output::maxbatch::stopped(m)
        ));
    }
    // A trial that ran out of memory often has no peak of its own: its cross
    // sits at the top of the axis, where the memory ran out.
    let top = l.y_top() / 1.1;
    l.crosses = oom
        .into_iter()
        .map(|(b, y)| (b, if y > 0.0 { y } else { top }))
        .collect();
    l.note = notes.join(" ");
    Ok(Some(Figure::Plot(l.plot()?)))
}

/// The ranks' training results per model, in `--model a,b,c` order.
fn models(r: &pb::Report) -> Vec<(String, Vec<(u32, &pb::TrainResult)>)> {
    let mut out: Vec<(String, Vec<(u32, &pb::TrainResult)>)> = Vec::new();
    for (_, rank) in ranks_in_order(r) {
        let Some(res) = rank.result.as_ref() else {
            continue;
        };
        for (i, t) in crate::output::models::train_results(res).enumerate() {
            if out.len() <= i {
                out.push((crate::output::models::label(t), Vec::new()));
            }
            out[i].1.push((rank.rank, t));
        }
    }
    out
}

/// The step-time distribution of every model a ddp/fsdp job trained; per
/// rank p50 and p99 when the ranks sent no per-step times.
pub fn step_times(r: &pb::Report) -> Result<Vec<Figure>> {
    let mut out = Vec::new();
    for (i, (model, ranks)) in models(r).into_iter().enumerate() {
        let name = if model.is_empty() {
            "model".into()
        } else {
            model
        };
        let steps: Vec<f64> = ranks
            .iter()
            .flat_map(|(_, t)| t.step_ms.iter().copied())
            .filter(|v| v.is_finite())
            .collect();
        let p50 = median(ranks.iter().map(|(_, t)| t.step_ms_p50).collect()).unwrap_or(0.0);
        let p99 = median(ranks.iter().map(|(_, t)| t.step_ms_p99).collect()).unwrap_or(0.0);
        let summary = format!("Median over the ranks: p50 {p50:.1} ms, p99 {p99:.1} ms.");
        if !steps.is_empty() {
            let title = format!(
                "Step time distribution: {name} ({} steps over {} ranks)",
                steps.len(),
                ranks.len()
            );
            let h = Histogram {
                id: format!("plot-steps-{i}"),
                title,
                x_desc: "time per step (ms)".into(),
                label: format!("{name}: steps of every rank"),
                colour: chart::colour(i),
                values: steps,
                bins: 24,
                note: summary,
            };
            out.push(Figure::Plot(h.plot()?));
        } else if ranks.iter().any(|(_, t)| t.step_ms_p50 > 0.0) {
            let mut l = Lines::new(
                &format!("plot-steps-{i}"),
                format!("Step time per rank: {name}"),
                "rank",
                "time per step (ms)",
            );
            let last = ranks.iter().map(|(r, _)| *r).max().unwrap_or(0) as f64;
            l.x_range = Some((-0.5, last + 0.5));
            l.x_fmt = Some(whole_number);
            let of = |f: fn(&pb::TrainResult) -> f64| {
                ranks
                    .iter()
                    .map(|(r, t)| (*r as f64, f(t)))
                    .collect::<Vec<_>>()
            };
            l.series
                .push(Series::dots("p50", chart::colour(0), of(|t| t.step_ms_p50)));
            l.series
                .push(Series::dots("p99", chart::colour(1), of(|t| t.step_ms_p99)));
            l.note = format!("The ranks sent no per-step times, only p50 and p99. {summary}");
            out.push(Figure::Plot(l.plot()?));
        } else {
            out.push(Figure::note(
                format!("Step times: {name}"),
                "No step times: the ranks reported none.",
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::html::chart::ALERT;

    fn row(op: &str, bytes: u64, busbw: f64) -> pb::CollectiveRow {
        pb::CollectiveRow {
            op: op.into(),
            bytes,
            busbw_gbps: busbw,
            ..Default::default()
        }
    }

    fn marks(f: &Figure) -> usize {
        match f {
            Figure::Plot(p) => p.svg.matches("data-mark").count(),
            Figure::Note { .. } => 0,
        }
    }

    #[test]
    fn busbw_has_a_line_per_op_on_a_log_axis() {
        let rows = [
            row("all_reduce", 1024, 0.5),
            row("all_reduce", 1 << 20, 4.0),
            row("all_gather", 1024, 0.3),
            row("all_gather", 1 << 20, 3.0),
        ];
        let f = busbw(&rows).unwrap().unwrap();
        let Figure::Plot(p) = &f else { panic!() };
        assert_eq!(p.legend.len(), 2);
        // Two polylines and four dots.
        assert_eq!(marks(&f), 6, "{}", p.svg);
        assert!(p.svg.contains("1 MiB"), "{}", p.svg);
        assert!(busbw(&[]).unwrap().is_none());
    }

    #[test]
    fn a_slow_link_is_outlined() {
        let link = |a: &str, b: &str, v: f64, verdict: pb::Verdict| pb::Link {
            a: a.into(),
            b: b.into(),
            op: "sendrecv".into(),
            bytes: 1 << 20,
            busbw_gbps: v,
            verdict: verdict as i32,
            reference_gbps: 10.0,
            ..Default::default()
        };
        let ls = [
            link("n0", "n1", 10.0, pb::Verdict::Pass),
            link("n0", "n2", 2.0, pb::Verdict::Fail),
            link("n1", "n2", 10.0, pb::Verdict::Pass),
        ];
        let figs = links(&ls).unwrap();
        assert_eq!(figs.len(), 1);
        let Figure::Plot(p) = &figs[0] else { panic!() };
        // Six cells and the slow pair's two outlines.
        assert_eq!(marks(&figs[0]), 8, "{}", p.svg);
        assert!(p.svg.contains(&format!("stroke=\"{}\"", chart::hex(ALERT))));
        assert!(p.note.contains("1 slow link"), "{}", p.note);
        for n in ["n0", "n1", "n2"] {
            assert!(p.svg.contains(&format!(">\n{n}\n<")), "{n}: {}", p.svg);
        }
    }

    fn train(model: &str, step_ms: Vec<f64>) -> pb::TrainResult {
        pb::TrainResult {
            model: model.into(),
            step_ms_p50: 10.0,
            step_ms_p99: 14.0,
            step_ms,
            ..Default::default()
        }
    }

    fn report_with(details: Vec<(Detail, Vec<pb::TrainResult>)>) -> pb::Report {
        let ranks = details
            .into_iter()
            .enumerate()
            .map(|(i, (d, more))| pb::RankReport {
                rank: i as u32,
                result: Some(Box::new(pb::RankResult {
                    detail: Some(d),
                    more_train: more,
                    ..Default::default()
                })),
                ..Default::default()
            })
            .collect();
        pb::Report {
            nodes: vec![pb::NodeReport {
                name: "n0".into(),
                ranks,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn step_times_are_a_histogram_per_model_or_p50_p99_without_them() {
        let steps: Vec<f64> = (0..50).map(|i| 10.0 + (i % 7) as f64).collect();
        let r = report_with(vec![
            (
                Detail::Train(train("cnn", steps.clone())),
                vec![train("resnet18", vec![])],
            ),
            (
                Detail::Train(train("cnn", steps)),
                vec![train("resnet18", vec![])],
            ),
        ]);
        let figs = step_times(&r).unwrap();
        assert_eq!(figs.len(), 2);
        let Figure::Plot(h) = &figs[0] else { panic!() };
        assert!(
            h.title.contains("cnn (100 steps over 2 ranks)"),
            "{}",
            h.title
        );
        assert_eq!(marks(&figs[0]), 7, "one bar per distinct step time");
        let Figure::Plot(p) = &figs[1] else { panic!() };
        assert!(p.title.contains("resnet18"));
        assert_eq!(marks(&figs[1]), 4, "p50 and p99 of two ranks");
    }

    #[test]
    fn maxbatch_marks_out_of_memory_trials() {
        let point = |b: u32, fits: bool, mib: u64| pb::MaxBatchPoint {
            batch_size: b,
            fits,
            peak_memory_bytes: mib << 20,
            error: String::new(),
        };
        let m = pb::MaxBatchResult {
            model: "cnn".into(),
            max_batch: 4,
            recommended: 3,
            points: vec![
                point(1, true, 10),
                point(2, true, 20),
                point(4, true, 40),
                point(8, false, 0),
            ],
            ..Default::default()
        };
        let f = maxbatch(&report_with(vec![(Detail::Maxbatch(m), vec![])]))
            .unwrap()
            .unwrap();
        let Figure::Plot(p) = &f else { panic!() };
        let alert = format!("stroke=\"{}\"", chart::hex(ALERT));
        assert_eq!(p.svg.matches(&alert).count(), 2, "a cross is two strokes");
        assert!(p.note.contains("batch 8 ran out of memory"), "{}", p.note);
        assert!(p.legend.iter().any(|k| k.label == "out of memory"));
    }
}

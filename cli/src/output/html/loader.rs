//! The loader sweep's plots (`ddp --loader-workers`): samples/s against the
//! worker count, one line per rank, so that a rank whose host feeds its
//! device slower stands apart; and per GPU rank the old tool's plot, its
//! GPU's utilisation over each setting's window, one curve per worker count,
//! with the 10 % line under which a sample counts as idle and each curve's
//! mean in its legend. CPU ranks get the first plot only: their GPU
//! utilisation is unknown.

use std::collections::BTreeMap;

use anyhow::Result;
use gpuctl_proto::pb;

use super::chart;
use super::lines::{whole_number, Lines, Series};
use super::plots::Figure;
use crate::output::models::{label, train_results};

/// GPU ranks drawn one plot each at most: a fleet's worth would bury the page.
const MAX_GPU_PLOTS: usize = 8;

/// Every sweeping rank's settings: (rank, model, settings).
fn sweeps(r: &pb::Report) -> Vec<(u32, String, &[pb::LoaderSetting])> {
    let mut out = Vec::new();
    for n in &r.nodes {
        for rk in &n.ranks {
            let Some(res) = &rk.result else { continue };
            for t in train_results(res).filter(|t| !t.loader.is_empty()) {
                out.push((rk.rank, label(t), t.loader.as_slice()));
            }
        }
    }
    out
}

pub fn figures(r: &pb::Report) -> Result<Vec<Figure>> {
    let all = sweeps(r);
    if all.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    let mut rate = Lines::new(
        "plot-loader-rate",
        "Loader sweep: samples/s against data-loader workers",
        "workers",
        "samples/s (each rank alone)",
    );
    rate.x_fmt = Some(whole_number);
    for (i, (rank, model, settings)) in all.iter().enumerate() {
        let pts = settings
            .iter()
            .map(|s| (s.workers as f64, s.samples_per_s))
            .collect();
        rate.series.push(Series::line(
            format!("rank {rank} {model}"),
            chart::colour(i),
            pts,
        ));
    }
    rate.note = "Batches made on each rank's own host (decode and augment of synthetic images), with no communication; a rank far below the others fails on loader_samples_per_s.".into();
    out.push(Figure::Plot(rate.plot()?));

    let windows: BTreeMap<(u32, &str, u32), &pb::LoaderGpu> = r
        .loader_gpu
        .iter()
        .map(|g| ((g.rank, g.model.as_str(), g.workers), g))
        .collect();
    let mut drawn = 0;
    for (rank, model, settings) in &all {
        let mut l = Lines::new(
            &format!("plot-loader-util-{rank}-{}", model.replace(' ', "-")),
            format!("GPU utilisation per loader setting: rank {rank}, {model}"),
            "seconds into the setting",
            "GPU utilisation (%)",
        );
        l.y_min_top = 100.0;
        let mut longest: f64 = 0.0;
        for (i, s) in settings.iter().enumerate() {
            let Some(g) = windows.get(&(*rank, model.as_str(), s.workers)) else {
                continue;
            };
            if g.util.is_empty() {
                continue;
            }
            let secs = s.end_unix_ms.saturating_sub(s.start_unix_ms) as f64 / 1e3;
            longest = longest.max(secs);
            let step = secs / (g.util.len().max(2) - 1) as f64;
            let pts = g
                .util
                .iter()
                .enumerate()
                .map(|(k, u)| (k as f64 * step, *u))
                .collect();
            l.series.push(Series::line(
                format!(
                    "{} workers: mean {:.0} %, std {:.1}, idle {:.0} %",
                    s.workers,
                    g.util_mean,
                    g.util_std,
                    g.idle_share * 100.0
                ),
                chart::colour(i),
                pts,
            ));
        }
        if l.series.is_empty() {
            continue;
        }
        l.series.push(Series::line(
            "10 %: under it a sample counts as idle",
            chart::SHADE,
            vec![(0.0, 10.0), (longest.max(1e-3), 10.0)],
        ));
        l.note = "From the agent's telemetry of the rank's GPU over each setting's timed steps (agent --sample-interval; 500ms samples as often as the old tool did).".into();
        out.push(Figure::Plot(l.plot()?));
        drawn += 1;
        if drawn == MAX_GPU_PLOTS {
            break;
        }
    }
    if drawn == 0 {
        out.push(Figure::note(
            "GPU utilisation per loader setting",
            "No GPU telemetry for the sweep's windows: CPU ranks (their GPU utilisation is unknown, never a failure), or an agent that sampled nothing then.",
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::fixtures;

    fn report(gpu: bool) -> pb::Report {
        let setting = |workers, per_s| pb::LoaderSetting {
            workers,
            samples_per_s: per_s,
            start_unix_ms: 1_000,
            end_unix_ms: 5_000,
            ..Default::default()
        };
        let window = |workers, util: Vec<f64>| pb::LoaderGpu {
            rank: 0,
            model: "mobilenet_v2".into(),
            workers,
            samples: util.len() as u32,
            util_mean: util.iter().sum::<f64>() / util.len() as f64,
            util,
            ..Default::default()
        };
        let gpu_windows = if gpu {
            vec![
                window(0, vec![60.0, 5.0, 70.0, 3.0, 65.0]),
                window(4, vec![95.0, 97.0, 96.0, 98.0, 97.0]),
            ]
        } else {
            Vec::new()
        };
        fixtures::loader_report(
            "mobilenet_v2",
            vec![setting(0, 300.0), setting(4, 900.0)],
            gpu_windows,
        )
    }

    #[test]
    fn a_gpu_sweep_plots_rates_and_one_utilisation_curve_per_setting() {
        let figs = figures(&report(true)).unwrap();
        assert_eq!(figs.len(), 2);
        assert!(figs.iter().all(|f| matches!(f, Figure::Plot(_))));
        let cpu = figures(&report(false)).unwrap();
        assert_eq!(cpu.len(), 2);
        assert!(matches!(cpu[1], Figure::Note { .. }));
        assert!(figures(&pb::Report::default()).unwrap().is_empty());
    }
}

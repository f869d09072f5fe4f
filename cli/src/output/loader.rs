//! The loader sweep of a ddp report (`--loader-workers 0,2,4,8`): one row per
//! rank, model and worker count with what the old suite's loader tool printed
//! (samples/s, GPU utilisation mean, standard deviation and idle share, the
//! time) and what tells a host that cannot feed its GPU: the share of each
//! step spent waiting for data, and the CPU the setting used. The best setting
//! of each rank is starred. GPU figures come from the agent's telemetry
//! (`Report.loader_gpu`); a CPU rank has none and shows `-`.

use serde_json::{json, Value};

use gpuctl_proto::pb;

use super::models::{label, train_results};
use super::table::Table;

/// One row per rank, model and setting; `None` when no rank swept.
pub fn grid(r: &pb::Report) -> Option<Table> {
    let mut t = Table::new(&[
        "NODE",
        "RANK",
        "MODEL",
        "WORKERS",
        "SAMPLES/S",
        "DATA WAIT",
        "STEP MS P50",
        "CPU CORES",
        "HOST CPU",
        "GPU UTIL",
        "STD",
        "IDLE",
        "TIME S",
        "BEST",
    ])
    .right(&[1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
    let mut any = false;
    for n in &r.nodes {
        for rk in &n.ranks {
            let Some(res) = &rk.result else { continue };
            for tr in train_results(res) {
                let best = tr
                    .loader
                    .iter()
                    .map(|s| s.samples_per_s)
                    .fold(f64::NAN, f64::max);
                let model = label(tr);
                for s in &tr.loader {
                    any = true;
                    let gpu = r
                        .loader_gpu
                        .iter()
                        .find(|g| g.rank == rk.rank && g.model == model && g.workers == s.workers);
                    let pct = |v: f64| format!("{:.0}%", v * 100.0);
                    let (util, std, idle) = match gpu.filter(|g| g.samples > 0) {
                        Some(g) => (
                            format!("{:.0}%", g.util_mean),
                            format!("{:.1}", g.util_std),
                            pct(g.idle_share),
                        ),
                        None => ("-".into(), "-".into(), "-".into()),
                    };
                    t.row([
                        n.name.clone(),
                        rk.rank.to_string(),
                        model.clone(),
                        s.workers.to_string(),
                        format!("{:.1}", s.samples_per_s),
                        pct(s.data_wait_share),
                        format!("{:.1}", s.step_ms_p50),
                        format!("{:.2}", s.cpu_cores),
                        pct(s.host_cpu_share),
                        util,
                        std,
                        idle,
                        format!(
                            "{:.1}",
                            s.end_unix_ms.saturating_sub(s.start_unix_ms) as f64 / 1e3
                        ),
                        if s.samples_per_s == best { "*" } else { "" }.to_string(),
                    ]);
                }
            }
        }
    }
    any.then_some(t)
}

/// The LOADER section of the table report.
pub fn section(r: &pb::Report) -> Option<String> {
    let t = grid(r)?;
    let (work, cpu_us) = r
        .nodes
        .iter()
        .flat_map(|n| &n.ranks)
        .filter_map(|rk| rk.result.as_deref())
        .flat_map(train_results)
        .flat_map(|t| &t.loader)
        .map(|s| (s.work, s.sample_cpu_us))
        .next()
        .unwrap_or((0, 0));
    let cost = match cpu_us {
        0 => format!("{work} augment pass(es) per sample"),
        us => format!(
            "{work} augment pass(es) per sample and more until it has cost {:.2} ms of CPU",
            us as f64 / 1e3
        ),
    };
    Some(format!(
        "\nLOADER (each rank alone, batches made on its host: {cost}; DATA WAIT: share of the time the step waited for a batch; CPU CORES: the rank's process; HOST CPU: all cores; GPU UTIL from the agent's telemetry; * = the rank's best)\n{}",
        t.render()
    ))
}

/// A rank's sweep for `-o json`; `best` marks its best setting (its figure).
pub fn json(t: &pb::TrainResult) -> Value {
    let best = t
        .loader
        .iter()
        .map(|s| s.samples_per_s)
        .fold(f64::NAN, f64::max);
    Value::Array(
        t.loader
            .iter()
            .map(|s| {
                json!({
                    "best": s.samples_per_s == best,
                    "workers": s.workers,
                    "work": s.work,
                    "sample_cpu_us": s.sample_cpu_us,
                    "steps": s.steps,
                    "samples_per_s": s.samples_per_s,
                    "data_wait_share": s.data_wait_share,
                    "step_ms_p50": s.step_ms_p50,
                    "cpu_cores": s.cpu_cores,
                    "host_cpu_share": s.host_cpu_share,
                    "start_unix_ms": s.start_unix_ms,
                    "end_unix_ms": s.end_unix_ms,
                })
            })
            .collect(),
    )
}

/// The report's GPU windows for `-o json`.
pub fn gpu_json(r: &pb::Report) -> Value {
    Value::Array(
        r.loader_gpu
            .iter()
            .map(|g| {
                json!({
                    "rank": g.rank,
                    "node": g.node,
                    "gpu_index": g.gpu_index,
                    "model": g.model,
                    "workers": g.workers,
                    "samples": g.samples,
                    "util_mean": g.util_mean,
                    "util_std": g.util_std,
                    "idle_share": g.idle_share,
                    "util": g.util,
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::fixtures;

    #[test]
    fn one_row_per_setting_with_the_best_starred_and_gpu_figures_where_known() {
        let setting = |workers, per_s| pb::LoaderSetting {
            workers,
            work: 1,
            samples_per_s: per_s,
            data_wait_share: 0.5,
            start_unix_ms: 1_000,
            end_unix_ms: 3_500,
            ..Default::default()
        };
        let r = fixtures::loader_report(
            "cnn",
            vec![setting(0, 100.0), setting(2, 180.0)],
            vec![pb::LoaderGpu {
                rank: 0,
                model: "cnn".into(),
                workers: 2,
                samples: 3,
                util_mean: 87.0,
                util_std: 4.5,
                idle_share: 0.0,
                ..Default::default()
            }],
        );
        let s = section(&r).unwrap();
        let rows: Vec<&str> = s.lines().filter(|l| l.starts_with("n1")).collect();
        assert_eq!(rows.len(), 2, "{s}");
        assert!(rows[0].contains("100.0") && rows[0].contains(" - "), "{s}");
        assert!(
            rows[1].contains("87%") && rows[1].trim_end().ends_with('*'),
            "{s}"
        );
        assert!(rows[1].contains("2.5"), "{s}");
        assert!(section(&pb::Report::default()).is_none());
    }
}

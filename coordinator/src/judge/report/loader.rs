//! The loader sweep's GPU side (`ddp --loader-workers`): each setting's
//! utilisation of the rank's GPU as the agent's telemetry saw it between the
//! setting's first and last timed step. The worker knows the window, the
//! coordinator holds the samples; only here do they meet. CPU ranks have no
//! GPU and get no row: their loader is judged on its samples/s alone.

use std::collections::BTreeMap;

use gpuctl_proto::pb::{LoaderGpu, Plan, RankResult};

use super::super::figures::train_results;
use super::super::series::{Bucket, GpuSeries};
use super::super::telemetry::Telemetry;

/// Every GPU rank's loader settings with the telemetry of their windows.
pub(super) fn gpu_windows(
    plan: &Plan,
    results: &BTreeMap<u32, RankResult>,
    telemetry: &Telemetry,
) -> Vec<LoaderGpu> {
    if !results
        .values()
        .any(|r| train_results(r).any(|t| !t.loader.is_empty()))
    {
        return Vec::new();
    }
    let decoded: Vec<GpuSeries> = telemetry.series().collect();
    let series: BTreeMap<(&str, u32), &GpuSeries> = decoded
        .iter()
        .map(|s| ((s.node.as_str(), s.index), s))
        .collect();
    let mut out = Vec::new();
    for p in &plan.ranks {
        let (Some(gpu), Some(r)) = (p.gpu_index, results.get(&p.rank)) else {
            continue;
        };
        let Some(s) = series.get(&(p.node.as_str(), gpu)) else {
            continue;
        };
        for t in train_results(r) {
            let model = gpuctl_core::catalogue::model_label(&t.model, &t.variant);
            for l in &t.loader {
                out.push(window(
                    p.rank,
                    &p.node,
                    gpu,
                    &model,
                    l.workers,
                    s,
                    l.start_unix_ms,
                    l.end_unix_ms,
                ));
            }
        }
    }
    out
}

/// One setting's window of one GPU's series: the buckets that overlap it
/// (the agent samples every second or so; a setting of a few seconds would
/// otherwise keep none whole).
#[allow(clippy::too_many_arguments)]
fn window(
    rank: u32,
    node: &str,
    gpu: u32,
    model: &str,
    workers: u32,
    s: &GpuSeries,
    from: u64,
    to: u64,
) -> LoaderGpu {
    let mut t = Bucket::default();
    let mut curve = Vec::new();
    for b in s
        .buckets
        .iter()
        .filter(|b| b.end_ms >= from && b.start_ms <= to && b.n > 0)
    {
        t.merge(b);
        curve.push(b.util_sum / b.n as f64);
    }
    let n = t.n.max(1) as f64;
    let mean = t.util_sum / n;
    LoaderGpu {
        rank,
        node: node.to_string(),
        gpu_index: gpu,
        model: model.to_string(),
        workers,
        samples: t.n,
        util_mean: mean,
        util_std: (t.util_sq / n - mean * mean).max(0.0).sqrt(),
        // Samples under series::LOW_UTIL (10 %), as the report's summaries count.
        idle_share: t.util_low as f64 / n,
        util: curve,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb::GpuSample;

    #[test]
    fn a_window_keeps_the_buckets_it_overlaps() {
        let mut s = GpuSeries::new("n1", 0, "GPU-0");
        for (i, u) in [90.0, 5.0, 80.0, 0.0, 95.0].into_iter().enumerate() {
            let t = 1_000 * (i as u64 + 1);
            s.add(
                &GpuSample {
                    unix_ms: t,
                    util_gpu: u,
                    ..Default::default()
                },
                t,
            );
        }
        let w = window(0, "n1", 0, "cnn", 2, &s, 2_000, 4_000);
        assert_eq!(w.samples, 3);
        assert_eq!(w.util, vec![5.0, 80.0, 0.0]);
        assert!((w.util_mean - 85.0 / 3.0).abs() < 1e-9);
        assert!((w.idle_share - 2.0 / 3.0).abs() < 1e-9);
        assert!(w.util_std > 30.0);
    }
}

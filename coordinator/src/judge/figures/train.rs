//! `ddp` and `fsdp`: a rank's rate without communication and its loader
//! sweep's best (figures of one rank), and the synchronous rates, step times
//! and scaling efficiency that all ranks make together (job figures). Keys
//! name the mode, model, precision and batch, so that only like runs meet.

use std::collections::BTreeMap;

use gpuctl_core::catalogue::TrainParams;
use gpuctl_core::stats::median;
use gpuctl_proto::pb::{rank_result::Detail, LoaderSetting, RankResult, TrainResult};

use super::{Expected, Figure, Metric, Name};

pub fn train_key(mode: &str, model: &str, precision: &str, batch: u64) -> String {
    format!("{mode} {model} {precision} batch {batch}")
}

/// The loader sweep's figure: the training key and the host work per sample
/// (`loader ddp cnn fp32 batch 16 work 1`); the worker counts are not part of
/// it, since the figure is the best of them.
/// A per-sample CPU target (`--loader-cpu-us`) is part of it: a sweep at 4 ms
/// a sample is not judged against one at the passes alone.
pub fn loader_key(train_key: &str, work: u64, cpu_us: u64) -> String {
    match cpu_us {
        0 => format!("loader {train_key} work {work}"),
        us => format!("loader {train_key} work {work} cpu {us}us"),
    }
}

/// The best setting of a loader sweep, by samples/s.
pub fn best_loader_setting(t: &TrainResult) -> Option<&LoaderSetting> {
    t.loader
        .iter()
        .filter(|s| s.samples_per_s.is_finite())
        .max_by(|a, b| a.samples_per_s.total_cmp(&b.samples_per_s))
}

/// A GPT's size is part of its key: a 1.3b is not compared with a 124m.
pub(super) fn train_key_of(t: &TrainResult, workload: &str) -> String {
    let mode = if t.mode.is_empty() { workload } else { &t.mode };
    let model = gpuctl_core::catalogue::model_label(&t.model, &t.variant);
    train_key(mode, &model, &t.precision, t.batch_size as u64)
}

/// Every model's training result of a rank, in the order trained: the first
/// (`train`), then `more_train` (`--model a,b,c`).
pub fn train_results(r: &RankResult) -> impl Iterator<Item = &TrainResult> {
    let first = match &r.detail {
        Some(Detail::Train(t)) => Some(t),
        _ => None,
    };
    first.into_iter().chain(&r.more_train)
}

/// The figures of one training rank, every model it trained.
pub(super) fn rank_figures(workload: &str, r: &RankResult) -> Vec<Figure> {
    let fig = |metric, key: Name, value| Figure { metric, key, value };
    train_results(r)
        .flat_map(|t| {
            let key: Name = train_key_of(t, workload).into();
            let solo = (t.baseline_samples_per_s > 0.0).then(|| {
                fig(
                    Metric::SoloSamplesPerS,
                    key.clone(),
                    t.baseline_samples_per_s,
                )
            });
            let loader = best_loader_setting(t).map(|s| {
                fig(
                    Metric::LoaderSamplesPerS,
                    loader_key(&key, s.work as u64, s.sample_cpu_us).into(),
                    s.samples_per_s,
                )
            });
            solo.into_iter().chain(loader)
        })
        .collect()
}

/// Per model: the ranks' median rate, the worst rank's p99 step time and
/// the median scaling efficiency.
pub(super) fn job_figures(workload: &str, results: &[&RankResult], figures: &mut Vec<Figure>) {
    let mut train: BTreeMap<String, Vec<&TrainResult>> = BTreeMap::new();
    for t in results.iter().flat_map(|r| train_results(r)) {
        train.entry(train_key_of(t, workload)).or_default().push(t);
    }
    for (key, ts) in train {
        let key: Name = key.into();
        let rate = median(ts.iter().map(|t| t.samples_per_s).collect());
        let p99 = ts
            .iter()
            .map(|t| t.step_ms_p99)
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
        let eff = median(
            ts.iter()
                .map(|t| t.scaling_efficiency)
                .filter(|e| *e > 0.0)
                .collect(),
        );
        for (metric, value) in [
            (Metric::SamplesPerS, rate),
            (Metric::StepMsP99, p99),
            (Metric::ScalingEfficiency, eff),
        ] {
            if let Some(value) = value.filter(|v| *v > 0.0) {
                figures.push(Figure {
                    metric,
                    key: key.clone(),
                    value,
                });
            }
        }
    }
}

pub(super) fn expected(workload: &str, t: &TrainParams, world_size: u32, out: &mut Expected) {
    for m in &t.models {
        let p = &m.model;
        let variant = gpuctl_core::catalogue::model_variant(&p.model, &p.gpt_size);
        let key = train_key(
            workload,
            &gpuctl_core::catalogue::model_label(&p.model, variant),
            &m.model.precision,
            m.batch_size,
        );
        out.insert((Metric::SamplesPerS, key.clone()));
        out.insert((Metric::StepMsP99, key.clone()));
        if !t.loader_workers.is_empty() && p.model != "gpt" {
            out.insert((
                Metric::LoaderSamplesPerS,
                loader_key(&key, t.loader_work, t.loader_cpu_us),
            ));
        }
        // The no-communication rate is timed only beside other ranks.
        if world_size > 1 {
            out.insert((Metric::SoloSamplesPerS, key.clone()));
            out.insert((Metric::ScalingEfficiency, key));
        }
    }
}

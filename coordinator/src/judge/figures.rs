//! The figures of a job, read out of its rank results in one form for every
//! workload, so that verdicts, baselines and reports speak of the same things:
//! a job's figures per rank and per job, what its spec asks for, and what a
//! baseline keeps of it (what each metric measures is [`super::metric`]).
//! Keys say what was measured (`bf16 8192`, `all_reduce 1073741824 float`,
//! `ddp resnet50 bf16 batch 256`): only figures with equal keys are compared.

use std::collections::{BTreeMap, BTreeSet};

use gpuctl_core::catalogue::{NcclPattern, TypedParams};
use gpuctl_core::pb::{
    rank_result::Detail, BaselineFigure, CollectiveRow, JobSpec, RankResult, Report, TrainResult,
};
use gpuctl_core::stats::median;

pub use super::metric::Metric;

/// One measured figure: what (`metric` at `key`, e.g. `bf16 8192` or
/// `all_reduce 1073741824 float`) and how much.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    pub metric: Metric,
    pub key: String,
    pub value: f64,
}

/// One rank and the per-rank figures it produced.
#[derive(Debug, Clone)]
pub struct RankFigures {
    pub rank: u32,
    pub node: String,
    pub gpu_index: Option<u32>,
    pub gpu_uuid: String,
    /// GPU model (or CPU model): what floors are chosen by.
    pub model: String,
    /// Ranks are compared only within a device class (model and libraries).
    pub class: String,
    /// Whether the rank produced a result at all; a rank without one already
    /// failed or is incomplete, and its missing figures say nothing new.
    pub reported: bool,
    pub figures: Vec<Figure>,
    /// Stress sampling intervals behind the TFLOP/s figures (0: not stress).
    pub intervals: u32,
}

/// The figures that all ranks made together.
#[derive(Debug, Clone, Default)]
pub struct JobFigures {
    /// The one device class of the job; `None` when ranks differ, and then
    /// job figures are not judged against baselines and floors.
    pub class: Option<String>,
    pub model: Option<String>,
    /// The node a job figure can be pinned on: the job's only node.
    pub single_node: Option<String>,
    pub figures: Vec<Figure>,
}

/// What the job was asked to produce: the (metric, key) pairs its spec implies.
/// Baselines and floors whose figures the job was asked for and did not
/// produce fail; the others do not apply.
pub type Expected = BTreeSet<(Metric, String)>;

pub use gpuctl_core::catalogue::{judged_sizes, BUSBW_MIN_BYTES};

/// Ranks are compared only within one device class: the same model and the
/// same libraries.
pub fn device_class(r: &RankResult) -> String {
    class_of(&r.device_name, &r.torch_version, &r.nccl_version)
}

/// Made three times a rank when a job is judged: at 32,768 ranks `format!`
/// and its regrowing buffer were a quarter of the judge's time.
fn class_of(model: &str, torch: &str, nccl: &str) -> String {
    const TORCH: &str = " · torch ";
    const SEP: &str = " · ";
    let mut class =
        String::with_capacity(model.len() + TORCH.len() + torch.len() + SEP.len() + nccl.len());
    class.push_str(model);
    if !torch.is_empty() {
        class.push_str(TORCH);
        class.push_str(torch);
    }
    if !nccl.is_empty() {
        class.push_str(SEP);
        class.push_str(nccl);
    }
    class
}

/// `bf16 8192`, or `bf16 8192 with_comm` for GEMMs beside an all_reduce:
/// floors and baselines of plain stress do not judge those.
pub fn stress_key(precision: &str, size: u64, with_comm: bool) -> String {
    use std::fmt::Write;
    const COMM: &str = " with_comm";
    // Made for every rank of a job, twice: `format!` regrows its buffer.
    let mut key = String::with_capacity(precision.len() + 21 + COMM.len());
    key.push_str(precision);
    key.push(' ');
    let _ = write!(key, "{size}");
    if with_comm {
        key.push_str(COMM);
    }
    key
}

pub fn busbw_key(op: &str, bytes: u64, dtype: &str) -> String {
    format!("{op} {bytes} {dtype}")
}

pub fn train_key(mode: &str, model: &str, precision: &str, batch: u64) -> String {
    format!("{mode} {model} {precision} batch {batch}")
}

/// The loader sweep's figure: the training key and the host work per sample
/// (`loader ddp cnn fp32 batch 16 work 1`); the worker counts are not part of
/// it, since the figure is the best of them.
pub fn loader_key(train_key: &str, work: u64) -> String {
    format!("loader {train_key} work {work}")
}

/// The best setting of a loader sweep, by samples/s.
pub fn best_loader_setting(t: &TrainResult) -> Option<&gpuctl_core::pb::LoaderSetting> {
    t.loader
        .iter()
        .filter(|s| s.samples_per_s.is_finite())
        .max_by(|a, b| a.samples_per_s.total_cmp(&b.samples_per_s))
}

pub fn maxbatch_key(model: &str, precision: &str) -> String {
    format!("{model} {precision}")
}

/// `pinned 268435456` (GPU ranks) or `host 16777216` (CPU ranks).
pub fn copy_key(method: &str, bytes: u64) -> String {
    format!("{method} {bytes}")
}

/// `send 268435456`: one GPU sending to another.
pub fn p2p_key(bytes: u64) -> String {
    format!("send {bytes}")
}

/// How a rank copies between host and device: pinned host memory to a GPU,
/// or one host buffer to another on a CPU rank.
pub fn copy_method(gpu: bool) -> &'static str {
    if gpu {
        "pinned"
    } else {
        "host"
    }
}

/// The figure of two passes: the better one, so that one slow pass never
/// blames a link (a second that agrees does).
pub fn better_pass(first: f64, repeat: f64) -> f64 {
    first.max(repeat)
}

/// A GPT's size is part of its key: a 1.3b is not compared with a 124m.
fn train_key_of(t: &TrainResult, workload: &str) -> String {
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

/// How many sampling intervals a stress rank's TFLOP/s figures come from.
pub fn intervals(r: &RankResult) -> u32 {
    match &r.detail {
        Some(Detail::Stress(s)) if s.with_comm && !s.solo_tflops_per_interval.is_empty() => {
            s.tflops_per_interval
                .len()
                .min(s.solo_tflops_per_interval.len()) as u32
        }
        Some(Detail::Stress(s)) => s.tflops_per_interval.len() as u32,
        _ => 0,
    }
}

/// A stress rank's "worst" figure: its slowest tenth of sampling intervals
/// (nearest rank), so a single interval's dip among ten or more is not the
/// figure judged; with ten intervals or fewer it is the slowest one.
pub fn slow_tenth(per_interval: &[f64]) -> f64 {
    let mut v: Vec<f64> = per_interval
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let at = (v.len() as f64 * 0.1).ceil() as usize;
    v[at.saturating_sub(1).min(v.len() - 1)]
}

/// The figures that belong to one rank alone.
pub fn rank_figures(workload: &str, r: &RankResult) -> Vec<Figure> {
    let fig = |metric, key: String, value| Figure { metric, key, value };
    match &r.detail {
        Some(Detail::Stress(s)) if !s.tflops_per_interval.is_empty() => {
            let key = stress_key(&s.dtype, s.matrix_size as u64, s.with_comm);
            let mut v = vec![
                fig(Metric::stress(s.with_comm), key.clone(), s.tflops_median),
                fig(
                    Metric::StressTflopsWorst,
                    key,
                    slow_tenth(&s.tflops_per_interval),
                ),
            ];
            // The GEMMs alone before the all_reduce: the figures that name
            // a slow GPU, judged as plain stress.
            if s.with_comm && !s.solo_tflops_per_interval.is_empty() {
                let plain = stress_key(&s.dtype, s.matrix_size as u64, false);
                v.push(fig(
                    Metric::StressTflops,
                    plain.clone(),
                    s.solo_tflops_median,
                ));
                v.push(fig(
                    Metric::StressTflopsWorst,
                    plain,
                    slow_tenth(&s.solo_tflops_per_interval),
                ));
            }
            v
        }
        Some(Detail::Train(_)) => train_results(r)
            .flat_map(|t| {
                let key = train_key_of(t, workload);
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
                        loader_key(&key, s.work as u64),
                        s.samples_per_s,
                    )
                });
                solo.into_iter().chain(loader)
            })
            .collect(),
        Some(Detail::Maxbatch(m)) if m.max_batch > 0 => vec![fig(
            Metric::MaxBatch,
            maxbatch_key(&m.model, &m.precision),
            m.max_batch as f64,
        )],
        Some(Detail::P2p(p)) => {
            let key = copy_key(&p.method, p.bytes);
            let mut out = Vec::new();
            for (metric, a, b) in [
                (Metric::H2dGbps, p.h2d_gbps, p.h2d_repeat_gbps),
                (Metric::D2hGbps, p.d2h_gbps, p.d2h_repeat_gbps),
            ] {
                if better_pass(a, b) > 0.0 {
                    out.push(fig(metric, key.clone(), better_pass(a, b)));
                }
            }
            let pairs: Vec<f64> = p
                .peers
                .iter()
                .map(|c| better_pass(c.gbps, c.repeat_gbps))
                .collect();
            if let Some(m) = median(pairs) {
                out.push(fig(Metric::P2pGbps, p2p_key(p.bytes), m));
            }
            out
        }
        _ => Vec::new(),
    }
}

/// Every rank's figures and the job's, as a report was judged with them.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    pub ranks: Vec<RankFigures>,
    pub job: JobFigures,
}

/// The figures a finished report holds: what `gpuctl baseline save` keeps.
pub fn of_report(report: &Report) -> Figures {
    // Borrowed: at 32,768 ranks a copy of the results is a hundred MB.
    let mut results: Vec<&RankResult> = Vec::new();
    let mut ranks = Vec::new();
    for node in &report.nodes {
        for r in &node.ranks {
            let Some(res) = &r.result else {
                continue;
            };
            results.push(res);
            ranks.push(RankFigures {
                rank: r.rank,
                node: node.name.clone(),
                gpu_index: r.gpu_index,
                gpu_uuid: r.gpu_uuid.clone(),
                model: res.device_name.clone(),
                class: device_class(res),
                reported: res.ok,
                figures: rank_figures(&report.workload, res),
                intervals: intervals(res),
            });
        }
    }
    let nodes: Vec<String> = report.nodes.iter().map(|n| n.name.clone()).collect();
    let job = job_figures(&report.workload, &results, &report.collectives, &nodes);
    Figures { ranks, job }
}

/// The figures a job's spec asks for, with the catalogue's defaults for its
/// device: what a baseline or floor may insist on. A spec that no longer
/// parses asks for nothing (it was checked at submit).
pub fn expected(spec: &JobSpec, gpu: bool, world_size: u32) -> Expected {
    let mut out = Expected::new();
    let Ok(params) = TypedParams::build(&spec.workload, &spec.params, gpu) else {
        return out;
    };
    match params {
        TypedParams::Stress(s) => {
            let key = stress_key(&s.precision, s.size, s.with_comm);
            out.insert((Metric::stress(s.with_comm), key.clone()));
            out.insert((Metric::StressTflopsWorst, key));
            if s.with_comm {
                // Its GEMMs alone first (StressResult.solo_tflops_*).
                let plain = stress_key(&s.precision, s.size, false);
                out.insert((Metric::StressTflops, plain.clone()));
                out.insert((Metric::StressTflopsWorst, plain));
            }
        }
        // Pairs and bisect measure links and groups, judged against each
        // other (judge::links, judge::bisect), not a sweep.
        TypedParams::Nccl(n) if n.pattern != NcclPattern::All => {}
        TypedParams::Nccl(n) => {
            for bytes in judged_sizes(&n.sizes()) {
                for op in &n.ops {
                    out.insert((Metric::Busbw, busbw_key(op, bytes, &n.dtype)));
                }
            }
        }
        TypedParams::Ddp(t) | TypedParams::Fsdp(t) => {
            for m in &t.models {
                let p = &m.model;
                let variant = gpuctl_core::catalogue::model_variant(&p.model, &p.gpt_size);
                let key = train_key(
                    &spec.workload,
                    &gpuctl_core::catalogue::model_label(&p.model, variant),
                    &m.model.precision,
                    m.batch_size,
                );
                out.insert((Metric::SamplesPerS, key.clone()));
                out.insert((Metric::StepMsP99, key.clone()));
                if !t.loader_workers.is_empty() && p.model != "gpt" {
                    out.insert((Metric::LoaderSamplesPerS, loader_key(&key, t.loader_work)));
                }
                // The no-communication rate is timed only beside other ranks.
                if world_size > 1 {
                    out.insert((Metric::SoloSamplesPerS, key.clone()));
                    out.insert((Metric::ScalingEfficiency, key));
                }
            }
        }
        TypedParams::MaxBatch(m) => {
            out.insert((
                Metric::MaxBatch,
                maxbatch_key(&m.model.model, &m.model.precision),
            ));
        }
        // GPU pairs exist only on nodes of two GPUs or more: a floor on
        // them applies where they were measured, never by their absence.
        TypedParams::P2p(p) => {
            let key = copy_key(copy_method(gpu), p.bytes / 4 * 4);
            out.insert((Metric::H2dGbps, key.clone()));
            out.insert((Metric::D2hGbps, key));
        }
    }
    out
}

/// The figures all ranks made together: bus bandwidth from the job's
/// collective table (the slowest rank's time, as nccl-tests reports), and the
/// synchronous training rates.
pub fn job_figures(
    workload: &str,
    results: &[&RankResult],
    collectives: &[CollectiveRow],
    nodes: &[String],
) -> JobFigures {
    // The classes' parts told apart first: one string per class, not per rank.
    let classes: Vec<String> = results
        .iter()
        .map(|r| (&*r.device_name, &*r.torch_version, &*r.nccl_version))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .map(|(model, torch, nccl)| class_of(model, torch, nccl))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut models: Vec<&str> = results.iter().map(|r| r.device_name.as_str()).collect();
    models.sort();
    models.dedup();
    let mut figures = Vec::new();
    let mut by_op: BTreeMap<(&str, &str), Vec<&CollectiveRow>> = BTreeMap::new();
    for row in collectives {
        by_op
            .entry((row.op.as_str(), row.dtype.as_str()))
            .or_default()
            .push(row);
    }
    for ((op, dtype), rows) in by_op {
        let sizes: Vec<u64> = rows.iter().map(|r| r.bytes).collect();
        for bytes in judged_sizes(&sizes) {
            if let Some(row) = rows.iter().find(|r| r.bytes == bytes) {
                figures.push(Figure {
                    metric: Metric::Busbw,
                    key: busbw_key(op, bytes, dtype),
                    value: row.busbw_gbps,
                });
            }
        }
    }
    let mut train: BTreeMap<String, Vec<&TrainResult>> = BTreeMap::new();
    for t in results.iter().flat_map(|r| train_results(r)) {
        train.entry(train_key_of(t, workload)).or_default().push(t);
    }
    for (key, ts) in train {
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
    JobFigures {
        class: (classes.len() == 1).then(|| classes[0].clone()),
        model: (models.len() == 1).then(|| models[0].to_string()),
        single_node: (nodes.len() == 1).then(|| nodes[0].clone()),
        figures,
    }
}

/// The figures a baseline keeps of a job: per device class, the median of
/// each per-rank figure over the ranks of the class, and the job figures.
pub fn baseline_figures(ranks: &[RankFigures], job: &JobFigures) -> Vec<BaselineFigure> {
    let mut groups: BTreeMap<(&str, &str, Metric, &str), Vec<f64>> = BTreeMap::new();
    for r in ranks.iter().filter(|r| r.reported) {
        for f in r.figures.iter().filter(|f| f.metric.per_rank()) {
            groups
                .entry((r.class.as_str(), r.model.as_str(), f.metric, f.key.as_str()))
                .or_default()
                .push(f.value);
        }
    }
    let mut out: Vec<BaselineFigure> = groups
        .into_iter()
        .map(|((class, model, metric, key), v)| BaselineFigure {
            device_class: class.to_string(),
            device_name: model.to_string(),
            metric: metric.name().to_string(),
            key: key.to_string(),
            ranks: v.len() as u32,
            value: median(v).unwrap_or(0.0),
        })
        .collect();
    if let (Some(class), Some(model)) = (&job.class, &job.model) {
        for f in &job.figures {
            out.push(BaselineFigure {
                device_class: class.clone(),
                device_name: model.clone(),
                metric: f.metric.name().to_string(),
                key: f.key.clone(),
                ranks: 0,
                value: f.value,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_class_names_the_model_and_its_libraries() {
        let r = |torch: &str, nccl: &str| RankResult {
            device_name: "NVIDIA H200".into(),
            torch_version: torch.into(),
            nccl_version: nccl.into(),
            ..Default::default()
        };
        assert_eq!(
            device_class(&r("2.11.0", "2.28.3")),
            "NVIDIA H200 · torch 2.11.0 · 2.28.3"
        );
        assert_eq!(device_class(&r("", "")), "NVIDIA H200");
        assert_eq!(device_class(&r("", "2.28.3")), "NVIDIA H200 · 2.28.3");
        assert_eq!(slow_tenth(&[5.0, 1.0, 4.0]), 1.0);
        let mut v: Vec<f64> = (0..20).map(|i| 600.0 + i as f64).collect();
        v[7] = 300.0; // one interval's dip among 20 is not the figure
        assert_eq!(slow_tenth(&v), 600.0);
        v[3] = 310.0; // a tenth of them is
        assert_eq!(slow_tenth(&v), 310.0);
        assert_eq!(stress_key("bf16", 8192, false), "bf16 8192");
        assert_eq!(stress_key("bf16", 8192, true), "bf16 8192 with_comm");
    }

    #[test]
    fn a_loader_sweep_is_judged_on_its_best_setting() {
        let setting = |workers, per_s| gpuctl_core::pb::LoaderSetting {
            workers,
            work: 2,
            samples_per_s: per_s,
            ..Default::default()
        };
        let t = TrainResult {
            model: "mobilenet_v2".into(),
            mode: "ddp".into(),
            precision: "bf16".into(),
            batch_size: 64,
            loader: vec![setting(0, 300.0), setting(4, 900.0), setting(8, 850.0)],
            ..Default::default()
        };
        let r = RankResult {
            detail: Some(Detail::Train(t)),
            ..Default::default()
        };
        assert_eq!(
            rank_figures("ddp", &r),
            vec![Figure {
                metric: Metric::LoaderSamplesPerS,
                key: "loader ddp mobilenet_v2 bf16 batch 64 work 2".into(),
                value: 900.0,
            }]
        );
        assert!(Metric::LoaderSamplesPerS.per_rank());
        let spec = JobSpec {
            workload: "ddp".into(),
            params: [
                ("model", "mobilenet_v2"),
                ("batch_size", "64"),
                ("loader_workers", "0,4,8"),
                ("loader_work", "2"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            ..Default::default()
        };
        assert!(expected(&spec, true, 1).contains(&(
            Metric::LoaderSamplesPerS,
            "loader ddp mobilenet_v2 bf16 batch 64 work 2".to_string()
        )));
    }

    #[test]
    fn every_model_of_a_list_has_its_figures() {
        let train = |model: &str, per_s: f64| TrainResult {
            model: model.into(),
            mode: "ddp".into(),
            precision: "fp32".into(),
            batch_size: 2,
            samples_per_s: per_s,
            step_ms_p99: 10.0,
            baseline_samples_per_s: per_s * 1.1,
            scaling_efficiency: 0.9,
            ..Default::default()
        };
        let results: BTreeMap<u32, RankResult> = (0..2)
            .map(|rank| {
                let r = RankResult {
                    rank,
                    ok: true,
                    detail: Some(Detail::Train(train("cnn", 100.0))),
                    more_train: vec![train("mobilenet_v2", 5.0)],
                    ..Default::default()
                };
                (rank, r)
            })
            .collect();
        let keys = |figs: &[Figure]| -> BTreeSet<(Metric, String)> {
            figs.iter().map(|f| (f.metric, f.key.clone())).collect()
        };
        let solo = keys(&rank_figures("ddp", &results[&0]));
        assert_eq!(
            solo,
            [
                (Metric::SoloSamplesPerS, "ddp cnn fp32 batch 2".to_string()),
                (
                    Metric::SoloSamplesPerS,
                    "ddp mobilenet_v2 fp32 batch 2".to_string()
                ),
            ]
            .into()
        );
        let job = job_figures(
            "ddp",
            &results.values().collect::<Vec<_>>(),
            &[],
            &["a".into()],
        );
        let spec = JobSpec {
            workload: "ddp".into(),
            params: [
                ("model".to_string(), "cnn,mobilenet_v2".to_string()),
                ("batch_size".to_string(), "2".to_string()),
            ]
            .into(),
            ..Default::default()
        };
        // What the spec asks for is what the job produced, model by model.
        let mut made = keys(&job.figures);
        made.extend(solo);
        assert_eq!(made, expected(&spec, false, 2));
        let rate = |model: &str| {
            job.figures
                .iter()
                .find(|f| f.metric == Metric::SamplesPerS && f.key.contains(model))
                .map(|f| f.value)
        };
        assert_eq!(
            (rate("cnn"), rate("mobilenet_v2")),
            (Some(100.0), Some(5.0))
        );
    }

    #[test]
    fn a_gpt_is_keyed_by_its_size() {
        let t = TrainResult {
            model: "gpt".into(),
            variant: "1.3b".into(),
            mode: "fsdp".into(),
            precision: "bf16".into(),
            batch_size: 8,
            ..Default::default()
        };
        assert_eq!(train_key_of(&t, "fsdp"), "fsdp gpt 1.3b bf16 batch 8");
        let spec = |size: &str| JobSpec {
            workload: "fsdp".into(),
            params: [
                ("model".to_string(), "gpt".to_string()),
                ("gpt_size".to_string(), size.to_string()),
            ]
            .into(),
            ..Default::default()
        };
        let keys = |size| -> BTreeSet<String> {
            expected(&spec(size), true, 2)
                .into_iter()
                .map(|(_, k)| k)
                .collect()
        };
        assert_eq!(keys("1.3b"), [train_key_of(&t, "fsdp")].into());
        assert_eq!(
            keys("2.7b"),
            ["fsdp gpt 2.7b bf16 batch 4".to_string()].into()
        );
    }

    #[test]
    fn judged_sizes_take_the_large_ones_or_the_largest() {
        assert_eq!(
            judged_sizes(&[1 << 20, 64 << 20, 128 << 20]),
            vec![64 << 20, 128 << 20]
        );
        assert_eq!(judged_sizes(&[1 << 20, 16 << 20]), vec![16 << 20]);
        assert!(judged_sizes(&[]).is_empty());
    }
}

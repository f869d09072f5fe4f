//! The figures of a job, read out of its rank results in one form for every
//! workload, so that verdicts, baselines and reports speak of the same things:
//! a job's figures per rank and per job, what its spec asks for, and what a
//! baseline keeps of it (what each metric measures is [`super::metric`]).
//! Keys say what was measured (`bf16 8192`, `all_reduce 1073741824 float`,
//! `ddp resnet50 bf16 batch 256`): only figures with equal keys are compared.
//!
//! One file per workload family ([`stress`], [`nccl`], [`train`],
//! [`maxbatch`], [`p2p`]): its keys, its figures and what its spec asks for.
//! Here, the types they fill and the dispatch by workload.

mod maxbatch;
mod names;
mod nccl;
mod p2p;
mod stress;
mod train;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

use gpuctl_core::catalogue::TypedParams;
use gpuctl_core::stats::median;
use gpuctl_proto::pb::{
    rank_result::Detail, BaselineFigure, CollectiveRow, JobSpec, RankResult, Report,
};

pub use maxbatch::maxbatch_key;
pub use names::{Name, Names};
pub use nccl::busbw_key;
pub use p2p::{better_pass, copy_key, copy_method, p2p_key};
pub use stress::{intervals, slow_tenth, stress_key};
pub use train::{best_loader_setting, loader_key, train_key, train_results};

pub use super::metric::Metric;

/// One measured figure: what (`metric` at `key`, e.g. `bf16 8192` or
/// `all_reduce 1073741824 float`) and how much.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    pub metric: Metric,
    pub key: Name,
    pub value: f64,
}

/// One rank and the per-rank figures it produced.
#[derive(Debug, Clone)]
pub struct RankFigures {
    pub rank: u32,
    pub node: Name,
    pub gpu_index: Option<u32>,
    pub gpu_uuid: String,
    /// GPU model (or CPU model): what floors are chosen by.
    pub model: Name,
    /// Ranks are compared only within a device class (model and libraries).
    pub class: Name,
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

/// The figures that belong to one rank alone.
pub fn rank_figures(workload: &str, r: &RankResult) -> Vec<Figure> {
    match &r.detail {
        Some(Detail::Stress(s)) if !s.tflops_per_interval.is_empty() => stress::rank_figures(s),
        Some(Detail::Train(_)) => train::rank_figures(workload, r),
        Some(Detail::Maxbatch(m)) => maxbatch::rank_figures(m),
        Some(Detail::P2p(p)) => p2p::rank_figures(p),
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
    let mut names = Names::default();
    for node in &report.nodes {
        let name = names.name(&node.name);
        for r in &node.ranks {
            let Some(res) = &r.result else {
                continue;
            };
            results.push(res);
            ranks.push(RankFigures {
                rank: r.rank,
                node: name.clone(),
                gpu_index: r.gpu_index,
                gpu_uuid: r.gpu_uuid.clone(),
                model: names.name(&res.device_name),
                class: names.class(res),
                reported: res.ok,
                figures: names.figures(rank_figures(&report.workload, res)),
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
        TypedParams::Stress(s) => stress::expected(&s, &mut out),
        TypedParams::Nccl(n) => nccl::expected(&n, &mut out),
        TypedParams::Ddp(t) | TypedParams::Fsdp(t) => {
            train::expected(&spec.workload, &t, world_size, &mut out)
        }
        TypedParams::MaxBatch(m) => maxbatch::expected(&m, &mut out),
        TypedParams::P2p(p) => p2p::expected(&p, gpu, &mut out),
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
        .collect::<BTreeSet<_>>()
        .into_iter()
        .map(|(model, torch, nccl)| class_of(model, torch, nccl))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut models: Vec<&str> = results.iter().map(|r| r.device_name.as_str()).collect();
    models.sort();
    models.dedup();
    let mut figures = Vec::new();
    nccl::job_figures(collectives, &mut figures);
    train::job_figures(workload, results, &mut figures);
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
                .entry((&*r.class, &*r.model, f.metric, &*f.key))
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
                key: f.key.to_string(),
                ranks: 0,
                value: f.value,
            });
        }
    }
    out
}

//! One node's runs folded, oldest first, into what its fleet row is made of:
//! the last run's headline figures, each workload's last run per GPU, and
//! the median of every earlier run for drift. A row is rendered from the
//! digest alone, so the fleet view adds a job's runs to the rows it keeps
//! without reading every node's history again (at 16,384 nodes that read
//! was 1.3-5.4 s after each job), and a fresh build folds the same way.

use std::collections::BTreeMap;

use gpuctl_core::stats::median;
use gpuctl_proto::pb::{Drift, FigureRecord, FleetRow, GpuRow, NodeRun};

use super::super::figures::Metric;

/// (metric, key) of a figure.
type FigureKey = (String, String);

/// One node's runs, folded.
#[derive(Debug, Clone, Default)]
pub struct NodeDigest {
    node: String,
    runs: u32,
    /// The last run's finish and job: a run is added only after it.
    last_at: (u64, String),
    last_verdict: i32,
    /// Per figure, the median of each earlier run that measured it, oldest
    /// first: what the last run's figures drift against.
    earlier: BTreeMap<FigureKey, Vec<f64>>,
    /// The last run's figures (one per GPU, or the job's own).
    last_values: BTreeMap<FigureKey, Vec<f64>>,
    /// Per workload, its last run's devices in the order its figures and
    /// floor failures name them: (device, UUID, figures below a floor).
    workloads: BTreeMap<String, Vec<(String, String, u32)>>,
    /// The last stress run's GPU medians, with their devices.
    stress: Option<Vec<(Option<String>, f64)>>,
    busbw: Option<f64>,
    link_median: Option<f64>,
    p2p: Option<f64>,
    h2d: Option<f64>,
    d2h: Option<f64>,
    samples: Option<f64>,
}

/// A figure's device label; runs kept before `device` was written name GPUs
/// by their index only.
fn device_of(f: &FigureRecord) -> Option<String> {
    if !f.device.is_empty() {
        return Some(f.device.clone());
    }
    f.gpu_index.map(|i| i.to_string())
}

/// Headline figures of one run: (metric, key) → values (one per GPU).
fn values(run: &NodeRun) -> BTreeMap<FigureKey, Vec<f64>> {
    let mut out: BTreeMap<FigureKey, Vec<f64>> = BTreeMap::new();
    for f in &run.figures {
        out.entry((f.metric.clone(), f.key.clone()))
            .or_default()
            .push(f.value);
    }
    out
}

/// A stress run's median TFLOP/s, with an all_reduce beside it or not.
fn is_stress_median(metric: &str) -> bool {
    Metric::from_name(metric).is_some_and(Metric::is_stress_median)
}

/// The GPUs' TFLOP/s of a stress run: its GEMMs alone where it has them
/// (plain stress, and the first phase of `--with-comm`), else beside the
/// all_reduce (a run from before that phase); `None` for a run without.
fn stress_medians(r: &NodeRun) -> Option<Vec<(Option<String>, f64)>> {
    let pick = |keep: &dyn Fn(&FigureRecord) -> bool| -> Vec<(Option<String>, f64)> {
        r.figures
            .iter()
            .filter(|f| keep(f))
            .map(|f| (device_of(f), f.value))
            .collect()
    };
    let plain = pick(&|f| f.metric == Metric::StressTflops.name());
    if !plain.is_empty() {
        return Some(plain);
    }
    Some(pick(&|f| is_stress_median(&f.metric))).filter(|v| !v.is_empty())
}

/// The figures of `metric` in `r`, `None` when it has none.
fn of_metric(r: &NodeRun, metric: Metric) -> Option<Vec<&FigureRecord>> {
    let v: Vec<_> = r
        .figures
        .iter()
        .filter(|f| f.metric == metric.name())
        .collect();
    (!v.is_empty()).then_some(v)
}

/// A workload's run's devices: each once, in the order its figures, then
/// its floor failures, name them, with the UUID it was first named with.
fn devices(r: &NodeRun) -> Vec<(String, String, u32)> {
    let mut out: Vec<(String, String, u32)> = Vec::new();
    let mut touch = |f: &FigureRecord, below: u32| {
        let Some(d) = device_of(f) else { return };
        match out.iter_mut().find(|(x, _, _)| *x == d) {
            Some(e) => e.2 += below,
            None => out.push((d, f.gpu_uuid.clone(), below)),
        }
    };
    for f in &r.figures {
        touch(f, 0);
    }
    for f in &r.below_floor {
        touch(f, 1);
    }
    out
}

impl NodeDigest {
    /// A node's runs, any order.
    pub fn of(node: &str, runs: &mut [&NodeRun]) -> Self {
        runs.sort_by(|a, b| (a.finished_unix_ms, &a.job_id).cmp(&(b.finished_unix_ms, &b.job_id)));
        let mut d = NodeDigest {
            node: node.to_string(),
            ..Default::default()
        };
        for r in runs.iter() {
            d.fold(r);
        }
        d
    }

    /// Whether `run` comes after every run folded so far, so that adding it
    /// gives what folding all of them again would.
    pub fn comes_after(&self, run: &NodeRun) -> bool {
        self.runs == 0 || (run.finished_unix_ms, &run.job_id) > (self.last_at.0, &self.last_at.1)
    }

    /// Adds `run`, the node's newest (see [`NodeDigest::comes_after`]).
    pub fn fold(&mut self, run: &NodeRun) {
        for (k, v) in std::mem::take(&mut self.last_values) {
            if let Some(m) = median(v) {
                self.earlier.entry(k).or_default().push(m);
            }
        }
        self.last_values = values(run);
        self.runs += 1;
        self.last_at = (run.finished_unix_ms, run.job_id.clone());
        self.last_verdict = run.verdict;
        self.workloads.insert(run.workload.clone(), devices(run));
        if let Some(s) = stress_medians(run) {
            self.stress = Some(s);
        }
        if let Some(f) = of_metric(run, Metric::Busbw) {
            let all_reduce = f.iter().filter(|f| f.key.starts_with("all_reduce "));
            self.busbw = Some(all_reduce.map(|f| f.value).fold(0.0, f64::max));
        }
        if !run.links.is_empty() {
            let v = run.links.iter().map(|l| l.busbw_gbps).collect();
            self.link_median = Some(median(v).unwrap_or(0.0));
        }
        for (metric, into) in [
            (Metric::P2pGbps, &mut self.p2p),
            (Metric::H2dGbps, &mut self.h2d),
            (Metric::D2hGbps, &mut self.d2h),
        ] {
            if let Some(f) = of_metric(run, metric) {
                *into = Some(f.iter().map(|f| f.value).fold(f64::INFINITY, f64::min));
            }
        }
        if let Some(f) = of_metric(run, Metric::SamplesPerS) {
            self.samples = Some(f[0].value);
        }
    }

    /// The node's row; `tolerance` flags drift. `None` before any run.
    pub fn row(&self, tolerance: f64) -> Option<FleetRow> {
        if self.runs == 0 {
            return None;
        }
        let mut row = FleetRow {
            node: self.node.clone(),
            last_verdict: self.last_verdict,
            last_unix_ms: self.last_at.0,
            last_job: self.last_at.1.clone(),
            runs: self.runs,
            drift: self.drift(tolerance),
            gpus: self.gpu_rows(),
            all_reduce_busbw_gbps: self.busbw.unwrap_or(0.0),
            median_link_gbps: self.link_median.unwrap_or(0.0),
            p2p_gbps_worst: self.p2p.unwrap_or(0.0),
            h2d_gbps_worst: self.h2d.unwrap_or(0.0),
            d2h_gbps_worst: self.d2h.unwrap_or(0.0),
            samples_per_s: self.samples.unwrap_or(0.0),
            ..Default::default()
        };
        if let Some(s) = &self.stress {
            let v: Vec<f64> = s.iter().map(|(_, v)| *v).collect();
            row.stress_tflops_worst = v.iter().copied().fold(f64::INFINITY, f64::min);
            row.stress_tflops_median = median(v).unwrap_or(0.0);
        }
        Some(row)
    }

    /// The drift of every figure of the last run against the median of the
    /// earlier runs that measured the same thing (per-GPU figures by their
    /// median over the node's GPUs). `tolerance`: a ratio under it is flagged.
    fn drift(&self, tolerance: f64) -> Vec<Drift> {
        let mut out = Vec::new();
        for ((metric, key), v) in &self.last_values {
            let before = self.earlier.get(&(metric.clone(), key.clone()));
            let before = before.map_or(&[][..], Vec::as_slice);
            let (Some(now), Some(prev)) = (median(v.clone()), median(before.to_vec())) else {
                continue;
            };
            if prev <= 0.0 || now <= 0.0 {
                continue;
            }
            let better_low = Metric::from_name(metric).is_some_and(|m| !m.higher_is_better());
            let ratio = if better_low { prev / now } else { now / prev };
            out.push(Drift {
                metric: metric.clone(),
                key: key.clone(),
                last: now,
                previous_median: prev,
                previous_runs: before.len() as u32,
                ratio,
                flagged: ratio < tolerance,
            });
        }
        out
    }

    /// Per GPU: its median TFLOP/s in the node's last stress run, and its
    /// figures that failed a floor in the last run of each workload (a stress
    /// run's floor failure stays until the next stress run, whatever ran
    /// between).
    fn gpu_rows(&self) -> Vec<GpuRow> {
        let mut rows: BTreeMap<&str, GpuRow> = BTreeMap::new();
        for devices in self.workloads.values() {
            for (gpu, uuid, below) in devices {
                let row = rows.entry(gpu).or_insert_with(|| GpuRow {
                    gpu: gpu.clone(),
                    gpu_uuid: uuid.clone(),
                    ..Default::default()
                });
                row.below_floor += below;
            }
        }
        let mut per: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for (gpu, v) in self.stress.iter().flatten() {
            if let Some(gpu) = gpu {
                per.entry(gpu).or_default().push(*v);
            }
        }
        for (gpu, v) in per {
            if let Some(g) = rows.get_mut(gpu) {
                g.stress_tflops = median(v).unwrap_or(0.0);
            }
        }
        rows.into_values().collect()
    }
}

//! One node's runs folded, oldest first, into what its fleet row is made of:
//! the last run's headline figures, each workload's last run per GPU, and
//! the median of every earlier run for drift. A row is rendered from the
//! digest alone, so the fleet view adds a job's runs to the rows it keeps
//! without reading every node's history again (at 16,384 nodes that read
//! was 1.3-5.4 s after each job), and a fresh build folds the same way.

use std::borrow::Cow;
use std::collections::BTreeMap;

use gpuctl_core::stats::{median, median_in};
use gpuctl_proto::pb::{Drift, FigureRecord, FleetRow, GpuRow, NodeRun};

use super::super::figures::Metric;

/// A figure's metric and key as one string, `metric`, NUL, `key`: looked up
/// from a figure through one reused buffer, so that folding a run makes no
/// string for a figure whose key its node's last run had (allocating and
/// freeing were ~40 % of folding in a job's 16,384 runs, `perf`). Metric
/// names hold no NUL, so these sort as the pairs do.
type FigureKey = String;

/// `f`'s [`FigureKey`], written into `buf`.
fn key_into<'a>(buf: &'a mut String, f: &FigureRecord) -> &'a str {
    buf.clear();
    buf.push_str(&f.metric);
    buf.push('\0');
    buf.push_str(&f.key);
    buf
}

/// A [`FigureKey`]'s metric and key.
fn split_key(k: &str) -> (&str, &str) {
    k.split_once('\0').unwrap_or((k, ""))
}

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
fn device_of(f: &FigureRecord) -> Option<Cow<'_, str>> {
    if !f.device.is_empty() {
        return Some(Cow::Borrowed(&f.device));
    }
    f.gpu_index.map(|i| Cow::Owned(i.to_string()))
}

/// A stress run's median TFLOP/s, with an all_reduce beside it or not.
fn is_stress_median(metric: &str) -> bool {
    Metric::from_name(metric).is_some_and(Metric::is_stress_median)
}

/// The GPUs' TFLOP/s of a stress run: its GEMMs alone where it has them
/// (plain stress, and the first phase of `--with-comm`), else beside the
/// all_reduce (a run from before that phase); `None` for a run without.
/// Device names are taken from `old` (the last stress run's) where the
/// same device stands at the same place.
fn stress_medians(
    r: &NodeRun,
    mut old: Option<&mut Vec<(Option<String>, f64)>>,
) -> Option<Vec<(Option<String>, f64)>> {
    let plain = Metric::StressTflops.name();
    let has_plain = r.figures.iter().any(|f| f.metric == plain);
    let keep = |f: &&FigureRecord| {
        if has_plain {
            f.metric == plain
        } else {
            is_stress_median(&f.metric)
        }
    };
    let mut out = Vec::new();
    for (i, f) in r.figures.iter().filter(keep).enumerate() {
        let device = device_of(f);
        let same = old
            .as_deref_mut()
            .and_then(|o| o.get_mut(i))
            .filter(|(d, _)| d.as_deref() == device.as_deref());
        let device = match same {
            Some((d, _)) => d.take(),
            None => device.map(Cow::into_owned),
        };
        out.push((device, f.value));
    }
    (!out.is_empty()).then_some(out)
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
/// Strings are taken from `old` (the workload's last run's) where a device
/// and its UUID are the same.
fn devices(r: &NodeRun, mut old: Vec<(String, String, u32)>) -> Vec<(String, String, u32)> {
    let mut out: Vec<(String, String, u32)> = Vec::with_capacity(old.len());
    let mut touch = |f: &FigureRecord, below: u32| {
        let Some(d) = device_of(f) else { return };
        if let Some(e) = out.iter_mut().find(|(x, _, _)| *x == *d) {
            e.2 += below;
            return;
        }
        let (device, uuid) = match old
            .iter()
            .position(|(x, u, _)| *x == *d && *u == f.gpu_uuid)
        {
            Some(i) => {
                let (x, u, _) = old.swap_remove(i);
                (x, u)
            }
            None => (d.into_owned(), f.gpu_uuid.clone()),
        };
        out.push((device, uuid, below));
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
        self.fold_values(run);
        self.runs += 1;
        self.last_at.0 = run.finished_unix_ms;
        self.last_at.1.clone_from(&run.job_id);
        self.last_verdict = run.verdict;
        match self.workloads.get_mut(&run.workload) {
            Some(d) => *d = devices(run, std::mem::take(d)),
            None => {
                let d = devices(run, Vec::new());
                self.workloads.insert(run.workload.clone(), d);
            }
        }
        let mut old = self.stress.take();
        self.stress = stress_medians(run, old.as_mut()).or(old);
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

    /// The last run's figures' medians into `earlier`, and `run`'s figures
    /// as the last, under the keys the last run had where it has them too.
    fn fold_values(&mut self, run: &NodeRun) {
        let mut old = std::mem::take(&mut self.last_values);
        for (k, v) in old.iter_mut() {
            if let Some(m) = median_in(v) {
                match self.earlier.get_mut(k) {
                    Some(e) => e.push(m),
                    None => {
                        self.earlier.insert(k.clone(), vec![m]);
                    }
                }
            }
            v.clear();
        }
        let mut buf = String::new();
        for f in &run.figures {
            let k = key_into(&mut buf, f);
            if let Some(v) = self.last_values.get_mut(k) {
                v.push(f.value);
                continue;
            }
            let (k, mut v) = old
                .remove_entry(k)
                .unwrap_or_else(|| (k.to_string(), Vec::new()));
            v.push(f.value);
            self.last_values.insert(k, v);
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
        let (mut now, mut prev) = (Vec::new(), Vec::new());
        for (k, v) in &self.last_values {
            let before = self.earlier.get(k).map_or(&[][..], Vec::as_slice);
            now.clone_from(v);
            prev.clear();
            prev.extend_from_slice(before);
            let (Some(now), Some(prev)) = (median_in(&mut now), median_in(&mut prev)) else {
                continue;
            };
            if prev <= 0.0 || now <= 0.0 {
                continue;
            }
            let (metric, key) = split_key(k);
            let better_low = Metric::from_name(metric).is_some_and(|m| !m.higher_is_better());
            let ratio = if better_low { prev / now } else { now / prev };
            out.push(Drift {
                metric: metric.to_string(),
                key: key.to_string(),
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
        // A node has a few devices: a list searched is cheaper than a map.
        let mut rows: Vec<GpuRow> = Vec::new();
        for devices in self.workloads.values() {
            for (gpu, uuid, below) in devices {
                match rows.iter_mut().find(|r| r.gpu == *gpu) {
                    Some(r) => r.below_floor += below,
                    None => rows.push(GpuRow {
                        gpu: gpu.clone(),
                        gpu_uuid: uuid.clone(),
                        below_floor: *below,
                        ..Default::default()
                    }),
                }
            }
        }
        if let Some(stress) = &self.stress {
            let mut v = Vec::new();
            for row in &mut rows {
                v.clear();
                let mine = stress
                    .iter()
                    .filter(|(g, _)| g.as_deref() == Some(&*row.gpu));
                v.extend(mine.map(|(_, t)| *t));
                if let Some(m) = median_in(&mut v) {
                    row.stress_tflops = m;
                }
            }
        }
        rows.sort_by(|a, b| a.gpu.cmp(&b.gpu));
        rows
    }
}

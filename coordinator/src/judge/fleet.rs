//! The fleet over time. When a job ends each of its nodes gets a [`NodeRun`]:
//! its verdict and its figures (per GPU, and the job's own), kept in the
//! store's history; `gpuctl fleet` reads them back as one row per node with
//! the last verdict, the headline figures and the drift of each figure
//! against the node's own previous runs.

use std::collections::{BTreeMap, HashMap};

use gpuctl_proto::pb::{Drift, FigureRecord, FleetRow, GpuRow, Link, NodeRun, Report, Verdict};

use gpuctl_core::stats::median;

use super::figures::{of_report, Figures, Metric};

/// The runs a finished report leaves in the history, one per node it judged.
pub fn runs_of(report: &Report) -> Vec<NodeRun> {
    runs(report, &of_report(report))
}

/// A rank's device on its node: its NVML index, or "cpuN" for the node's Nth
/// CPU rank (ranks in order), so that per-GPU series stay one per device.
fn device_label(gpu_index: Option<u32>, cpus_before: &mut u32) -> String {
    match gpu_index {
        Some(i) => i.to_string(),
        None => {
            *cpus_before += 1;
            format!("cpu{}", *cpus_before - 1)
        }
    }
}

/// As [`runs_of`], from the figures the report was judged with (made again
/// from its results, they were a tenth of judging 32,768 ranks).
pub fn runs(report: &Report, figures: &Figures) -> Vec<NodeRun> {
    let (ranks, job) = (&figures.ranks, &figures.job);
    // Grouped once: a 4,096-node job has 32,768 ranks.
    let mut ranks_of: HashMap<&str, Vec<_>> = HashMap::new();
    for r in ranks.iter().filter(|r| r.reported) {
        ranks_of.entry(r.node.as_str()).or_default().push(r);
    }
    let mut links_of: HashMap<&str, Vec<_>> = HashMap::new();
    for l in &report.links {
        links_of.entry(l.a.as_str()).or_default().push(l);
        if l.b != l.a {
            links_of.entry(l.b.as_str()).or_default().push(l);
        }
    }
    let mut floors_of: HashMap<&str, Vec<_>> = HashMap::new();
    for f in report
        .findings
        .iter()
        .filter(|f| f.reference_kind == "floor" && f.level == Verdict::Fail as i32)
    {
        floors_of.entry(f.node.as_str()).or_default().push(f);
    }
    report
        .nodes
        .iter()
        // A node the job did not judge (its request could not run) has no
        // run: the fleet shows what the node last did.
        .filter(|n| n.verdict() != Verdict::Unspecified)
        .map(|n| {
            let mut mine = ranks_of.get(n.name.as_str()).cloned().unwrap_or_default();
            mine.sort_by_key(|r| r.rank);
            let mut cpus = 0;
            let devices: HashMap<u32, String> = mine
                .iter()
                .map(|r| (r.rank, device_label(r.gpu_index, &mut cpus)))
                .collect();
            let mut figures: Vec<FigureRecord> = mine
                .iter()
                .flat_map(|r| {
                    r.figures.iter().map(|f| FigureRecord {
                        metric: f.metric.name().to_string(),
                        key: f.key.clone(),
                        value: f.value,
                        gpu_uuid: r.gpu_uuid.clone(),
                        gpu_index: r.gpu_index,
                        device: devices[&r.rank].clone(),
                    })
                })
                .collect();
            figures.extend(job.figures.iter().map(|f| FigureRecord {
                metric: f.metric.name().to_string(),
                key: f.key.clone(),
                value: f.value,
                ..Default::default()
            }));
            let below_floor = floors_of
                .get(n.name.as_str())
                .into_iter()
                .flatten()
                .map(|f| FigureRecord {
                    metric: f.metric.clone(),
                    key: f.key.clone(),
                    value: f.value,
                    gpu_uuid: f.gpu_uuid.clone(),
                    gpu_index: f.gpu_index,
                    device: f
                        .rank
                        .and_then(|r| devices.get(&r).cloned())
                        .or_else(|| f.gpu_index.map(|i| i.to_string()))
                        .unwrap_or_default(),
                })
                .collect();
            NodeRun {
                node: n.name.clone(),
                job_id: report.job_id.clone(),
                workload: report.workload.clone(),
                finished_unix_ms: report.finished_unix_ms,
                verdict: n.verdict,
                reason: n.reason.clone(),
                figures,
                links: links_of
                    .get(n.name.as_str())
                    .into_iter()
                    .flatten()
                    .map(|l| (*l).clone())
                    .collect(),
                below_floor,
            }
        })
        .collect()
}

/// A figure's device label; runs kept before `device` was written name GPUs
/// by their index only.
fn device_of(f: &FigureRecord) -> Option<String> {
    if !f.device.is_empty() {
        return Some(f.device.clone());
    }
    f.gpu_index.map(|i| i.to_string())
}

/// Per GPU: its median TFLOP/s in the node's last stress run, and its
/// figures that failed a floor in the last run of each workload (a stress
/// run's floor failure stays until the next stress run, whatever ran between).
fn gpu_rows(rs: &[&NodeRun]) -> Vec<GpuRow> {
    let mut rows: BTreeMap<String, GpuRow> = BTreeMap::new();
    fn row<'a>(rows: &'a mut BTreeMap<String, GpuRow>, f: &FigureRecord) -> Option<&'a mut GpuRow> {
        let gpu = device_of(f)?;
        Some(rows.entry(gpu.clone()).or_insert_with(|| GpuRow {
            gpu,
            gpu_uuid: f.gpu_uuid.clone(),
            ..Default::default()
        }))
    }
    let mut last_of_workload: BTreeMap<&str, &NodeRun> = BTreeMap::new();
    for r in rs {
        last_of_workload.insert(r.workload.as_str(), r);
    }
    for r in last_of_workload.values() {
        for f in &r.figures {
            row(&mut rows, f);
        }
        for f in &r.below_floor {
            if let Some(g) = row(&mut rows, f) {
                g.below_floor += 1;
            }
        }
    }
    if let Some(r) = last_stress(rs) {
        let mut per: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for f in stress_medians(r) {
            if let Some(d) = device_of(f) {
                per.entry(d).or_default().push(f.value);
            }
        }
        for (gpu, v) in per {
            if let Some(g) = rows.get_mut(&gpu) {
                g.stress_tflops = median(v).unwrap_or(0.0);
            }
        }
    }
    rows.into_values().collect()
}

/// Headline figures of one run: (metric, key) → values (one per GPU).
fn values(run: &NodeRun) -> BTreeMap<(&str, &str), Vec<f64>> {
    let mut out: BTreeMap<(&str, &str), Vec<f64>> = BTreeMap::new();
    for f in &run.figures {
        out.entry((f.metric.as_str(), f.key.as_str()))
            .or_default()
            .push(f.value);
    }
    out
}

/// The drift of every figure of the last run against the median of the
/// previous runs that measured the same thing (per-GPU figures by their
/// median over the node's GPUs). `tolerance`: a ratio under it is flagged.
fn drift(runs: &[&NodeRun], tolerance: f64) -> Vec<Drift> {
    let Some((last, previous)) = runs.split_last() else {
        return Vec::new();
    };
    // Each previous run's figures, read once for all the last run's figures.
    let previous: Vec<_> = previous.iter().map(|r| values(r)).collect();
    let mut out = Vec::new();
    for ((metric, key), v) in values(last) {
        let before: Vec<f64> = previous
            .iter()
            .filter_map(|p| p.get(&(metric, key)).and_then(|v| median(v.clone())))
            .collect();
        let (Some(now), Some(prev)) = (median(v), median(before.clone())) else {
            continue;
        };
        if prev <= 0.0 || now <= 0.0 {
            continue;
        }
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

/// A stress run's median TFLOP/s, with an all_reduce beside it or not.
fn is_stress_median(metric: &str) -> bool {
    Metric::from_name(metric).is_some_and(Metric::is_stress_median)
}

/// The GPUs' TFLOP/s of a stress run: its GEMMs alone where it has them
/// (plain stress, and the first phase of `--with-comm`), else beside the
/// all_reduce (a run from before that phase).
fn stress_medians(r: &NodeRun) -> Vec<&FigureRecord> {
    let plain: Vec<_> = r
        .figures
        .iter()
        .filter(|f| f.metric == Metric::StressTflops.name())
        .collect();
    if !plain.is_empty() {
        return plain;
    }
    r.figures
        .iter()
        .filter(|f| is_stress_median(&f.metric))
        .collect()
}

/// The last run with a stress median (plain, or with an all_reduce as the
/// standard suite runs it).
fn last_stress<'a>(runs: &[&'a NodeRun]) -> Option<&'a NodeRun> {
    runs.iter()
        .rev()
        .find(|r| r.figures.iter().any(|f| is_stress_median(&f.metric)))
        .copied()
}

fn last_of<'a>(runs: &[&'a NodeRun], metric: &str) -> Option<&'a NodeRun> {
    runs.iter()
        .rev()
        .find(|r| r.figures.iter().any(|f| f.metric == metric))
        .copied()
}

/// One row per node from its runs (any order); `tolerance` flags drift.
pub fn rows(runs: &[NodeRun], tolerance: f64) -> Vec<FleetRow> {
    let mut by_node: BTreeMap<&str, Vec<&NodeRun>> = BTreeMap::new();
    for r in runs {
        by_node.entry(r.node.as_str()).or_default().push(r);
    }
    by_node
        .into_iter()
        .map(|(node, mut rs)| {
            rs.sort_by_key(|r| (r.finished_unix_ms, r.job_id.clone()));
            let last = rs[rs.len() - 1];
            let mut row = FleetRow {
                node: node.to_string(),
                last_verdict: last.verdict,
                last_unix_ms: last.finished_unix_ms,
                last_job: last.job_id.clone(),
                runs: rs.len() as u32,
                drift: drift(&rs, tolerance),
                gpus: gpu_rows(&rs),
                ..Default::default()
            };
            if let Some(r) = last_stress(&rs) {
                let mut v: Vec<f64> = stress_medians(r).iter().map(|f| f.value).collect();
                row.stress_tflops_worst = v.iter().copied().fold(f64::INFINITY, f64::min);
                row.stress_tflops_median = median(std::mem::take(&mut v)).unwrap_or(0.0);
            }
            if let Some(r) = last_of(&rs, Metric::Busbw.name()) {
                row.all_reduce_busbw_gbps = r
                    .figures
                    .iter()
                    .filter(|f| {
                        f.metric == Metric::Busbw.name() && f.key.starts_with("all_reduce ")
                    })
                    .map(|f| f.value)
                    .fold(0.0, f64::max);
            }
            if let Some(r) = rs.iter().rev().find(|r| !r.links.is_empty()) {
                row.median_link_gbps =
                    median(r.links.iter().map(|l| l.busbw_gbps).collect()).unwrap_or(0.0);
            }
            for (metric, into) in [
                (Metric::P2pGbps, &mut row.p2p_gbps_worst),
                (Metric::H2dGbps, &mut row.h2d_gbps_worst),
                (Metric::D2hGbps, &mut row.d2h_gbps_worst),
            ] {
                if let Some(r) = last_of(&rs, metric.name()) {
                    *into = r
                        .figures
                        .iter()
                        .filter(|f| f.metric == metric.name())
                        .map(|f| f.value)
                        .fold(f64::INFINITY, f64::min);
                }
            }
            if let Some(r) = last_of(&rs, Metric::SamplesPerS.name()) {
                row.samples_per_s = r
                    .figures
                    .iter()
                    .find(|f| f.metric == Metric::SamplesPerS.name())
                    .map_or(0.0, |f| f.value);
            }
            row
        })
        .collect()
}

/// The latest measurement of every pair of nodes, from the runs' links,
/// given a node's runs at a time.
#[derive(Default)]
pub struct LatestLinks(BTreeMap<(String, String, String), (u64, Link)>);

impl LatestLinks {
    pub fn add(&mut self, runs: &[NodeRun]) {
        for r in runs {
            for l in &r.links {
                let key = (l.op.clone(), l.a.clone(), l.b.clone());
                match self.0.get(&key) {
                    Some((t, _)) if *t >= r.finished_unix_ms => {}
                    _ => {
                        let mut l = l.clone();
                        l.measured_unix_ms = r.finished_unix_ms;
                        self.0.insert(key, (r.finished_unix_ms, l));
                    }
                }
            }
        }
    }

    pub fn finish(self) -> Vec<Link> {
        self.0.into_values().map(|(_, l)| l).collect()
    }
}

/// Whether a run is still kept: at most `keep` runs per node, none older
/// than `max_age_ms`. `runs` is one node's, newest first.
pub fn expired(
    runs_newest_first: &[NodeRun],
    keep: usize,
    max_age_ms: u64,
    now: u64,
) -> Vec<usize> {
    runs_newest_first
        .iter()
        .enumerate()
        .filter(|(i, r)| *i >= keep || now.saturating_sub(r.finished_unix_ms) > max_age_ms)
        .map(|(i, _)| i)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb::Verdict;

    fn run(node: &str, job: u64, tflops: &[f64]) -> NodeRun {
        NodeRun {
            node: node.into(),
            job_id: format!("job-{job:06}"),
            workload: "stress".into(),
            finished_unix_ms: job * 1000,
            verdict: Verdict::Pass as i32,
            figures: tflops
                .iter()
                .enumerate()
                .map(|(i, v)| FigureRecord {
                    metric: "stress_tflops".into(),
                    key: "bf16 8192".into(),
                    value: *v,
                    gpu_index: Some(i as u32),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn gpus_keep_their_floor_failures_until_the_workload_runs_again() {
        let below = |gpu: u32| FigureRecord {
            metric: "stress_tflops".into(),
            key: "bf16 8192".into(),
            value: 100.0,
            gpu_index: Some(gpu),
            device: gpu.to_string(),
            ..Default::default()
        };
        let mut failed = run("a", 1, &[650.0, 100.0]);
        failed.below_floor = vec![below(1), below(1)];
        let nccl = NodeRun {
            workload: "nccl".into(),
            ..run("a", 2, &[])
        };
        let rows = rows(&[failed.clone(), nccl.clone()], 0.9);
        let gpus = &rows[0].gpus;
        assert_eq!(gpus.len(), 2, "{gpus:?}");
        assert_eq!((gpus[0].gpu.as_str(), gpus[0].below_floor), ("0", 0));
        assert_eq!((gpus[1].gpu.as_str(), gpus[1].below_floor), ("1", 2));
        assert_eq!(gpus[1].stress_tflops, 100.0);
        // The next stress run clears it.
        let rows = super::rows(&[failed, nccl, run("a", 3, &[650.0, 640.0])], 0.9);
        assert!(rows[0].gpus.iter().all(|g| g.below_floor == 0), "{rows:?}");
        assert_eq!(rows[0].gpus[1].stress_tflops, 640.0);
    }

    #[test]
    fn rows_show_the_last_run_and_flag_drift() {
        let runs = vec![
            run("a", 1, &[650.0, 660.0]),
            run("a", 2, &[655.0, 665.0]),
            run("a", 3, &[400.0, 660.0]),
            run("b", 1, &[650.0, 650.0]),
        ];
        let rows = rows(&runs, 0.9);
        assert_eq!(rows.len(), 2);
        let a = &rows[0];
        assert_eq!((a.runs, a.last_job.as_str()), (3, "job-000003"));
        assert_eq!(a.stress_tflops_worst, 400.0);
        assert_eq!(a.stress_tflops_median, 530.0);
        let d = &a.drift[0];
        assert_eq!(d.previous_runs, 2);
        assert!(d.flagged && d.ratio < 0.9, "{d:?}");
        assert!(rows[1].drift.is_empty(), "one run: nothing to drift from");
    }

    #[test]
    fn retention_keeps_the_newest_within_age() {
        let runs: Vec<NodeRun> = (1..=5).rev().map(|j| run("a", j, &[1.0])).collect();
        assert_eq!(expired(&runs, 3, u64::MAX, 6000), vec![3, 4]);
        assert_eq!(expired(&runs, 10, 2500, 6000), vec![2, 3, 4]);
    }
}

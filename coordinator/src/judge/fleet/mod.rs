//! The fleet over time. When a job ends each of its nodes gets a [`NodeRun`]:
//! its verdict and its figures (per GPU, and the job's own), kept in the
//! store's history; `gpuctl fleet` reads them back as one row per node with
//! the last verdict, the headline figures and the drift of each figure
//! against the node's own previous runs.

use std::collections::{BTreeMap, HashMap};

use gpuctl_proto::pb::{FigureRecord, Link, NodeRun, Report, Verdict};

use super::figures::{of_report, Figures};

mod digest;
mod fold;

pub use digest::NodeDigest;
pub use fold::{FleetFold, Rebuild};

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
        ranks_of.entry(&*r.node).or_default().push(r);
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
        floors_of.entry(&*f.node).or_default().push(f);
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
                        key: f.key.to_string(),
                        value: f.value,
                        gpu_uuid: r.gpu_uuid.clone(),
                        gpu_index: r.gpu_index,
                        device: devices[&r.rank].clone(),
                    })
                })
                .collect();
            figures.extend(job.figures.iter().map(|f| FigureRecord {
                metric: f.metric.name().to_string(),
                key: f.key.to_string(),
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

/// The latest measurement of every pair of nodes, from the runs' links,
/// given a node's runs at a time.
#[derive(Debug, Clone, Default)]
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

    pub fn list(&self) -> Vec<Link> {
        self.0.values().map(|(_, l)| l.clone()).collect()
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
    use gpuctl_proto::pb::{FleetRow, Verdict};

    /// One row per node from its runs (any order); `tolerance` flags drift.
    fn rows(runs: &[NodeRun], tolerance: f64) -> Vec<FleetRow> {
        let mut by_node: BTreeMap<&str, Vec<&NodeRun>> = BTreeMap::new();
        for r in runs {
            by_node.entry(&*r.node).or_default().push(r);
        }
        by_node
            .into_iter()
            .filter_map(|(node, mut rs)| NodeDigest::of(node, &mut rs).row(tolerance))
            .collect()
    }

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
        let rows = self::rows(&[failed, nccl, run("a", 3, &[650.0, 640.0])], 0.9);
        assert!(rows[0].gpus.iter().all(|g| g.below_floor == 0), "{rows:?}");
        assert_eq!(rows[0].gpus[1].stress_tflops, 640.0);
    }

    /// A run folded takes what it can from the node's last (the devices'
    /// names and UUIDs): a GPU swapped, devices named in another order, or a
    /// run naming none must still show as a fresh read of the runs would.
    #[test]
    fn a_run_folded_shows_its_own_devices_whatever_the_last_one_named() {
        let named = |r: NodeRun, uuids: &[&str], devices: &[&str]| NodeRun {
            figures: (r.figures.into_iter().zip(uuids.iter().zip(devices)))
                .map(|(f, (u, d))| FigureRecord {
                    gpu_uuid: u.to_string(),
                    device: d.to_string(),
                    ..f
                })
                .collect(),
            ..r
        };
        let first = named(run("a", 1, &[600.0, 610.0]), &["U0", "U1"], &["0", "1"]);
        // GPU 1 swapped (a new UUID), and named first.
        let swapped = named(run("a", 2, &[500.0, 620.0]), &["U9", "U0"], &["1", "0"]);
        let gpus = |row: &FleetRow| -> Vec<(String, String, f64)> {
            (row.gpus.iter())
                .map(|g| (g.gpu.clone(), g.gpu_uuid.clone(), g.stress_tflops))
                .collect()
        };
        let as_seen = |v: &[(&str, &str, f64)]| -> Vec<(String, String, f64)> {
            (v.iter())
                .map(|(g, u, t)| (g.to_string(), u.to_string(), *t))
                .collect()
        };
        let mut digest = NodeDigest::of("a", &mut [&first]);
        digest.fold(&swapped);
        let row = digest.row(0.9).unwrap();
        let want = as_seen(&[("0", "U0", 620.0), ("1", "U9", 500.0)]);
        assert_eq!(gpus(&row), want);
        assert_eq!(
            Some(row),
            NodeDigest::of("a", &mut [&first, &swapped]).row(0.9)
        );
        // Named by index only (a run kept before devices were written).
        let by_index = run("a", 3, &[630.0, 640.0]);
        digest.fold(&by_index);
        let row = digest.row(0.9).unwrap();
        assert_eq!(gpus(&row), as_seen(&[("0", "", 630.0), ("1", "", 640.0)]));
        let all = &mut [&first, &swapped, &by_index];
        assert_eq!(Some(row), NodeDigest::of("a", all).row(0.9));
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

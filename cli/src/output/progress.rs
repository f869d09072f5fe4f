//! A running job as plain lines, for logs and CI where nothing is redrawn:
//! `submit --wait`'s line per node (mean progress and a headline figure)
//! and `watch`'s line per rank.

use std::collections::BTreeMap;

use gpuctl_proto::pb;

use crate::output;

/// One node's progress in a plain line.
#[derive(Debug, Clone, PartialEq)]
struct NodeView {
    pub name: String,
    pub fraction: f64,
    pub detail: String,
}

/// Per node: fraction = mean of its ranks' progress (a rank not heard from
/// counts 0); detail = the headline metric, else the ranks' phase.
fn node_views(job: &pb::Job) -> Vec<NodeView> {
    let mut ranks_of: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    if let Some(plan) = &job.plan {
        for n in &plan.nodes {
            ranks_of.entry(n.clone()).or_default();
        }
        for r in &plan.ranks {
            ranks_of.entry(r.node.clone()).or_default().push(r.rank);
        }
    }
    for p in &job.progress {
        let v = ranks_of.entry(p.node.clone()).or_default();
        if !v.contains(&p.rank) {
            v.push(p.rank);
        }
    }
    let progress: BTreeMap<u32, &pb::RankProgress> =
        job.progress.iter().map(|p| (p.rank, p)).collect();
    ranks_of
        .into_iter()
        .map(|(name, ranks)| {
            let mine: Vec<&pb::RankProgress> = ranks
                .iter()
                .filter_map(|r| progress.get(r).copied())
                .collect();
            let fraction = if ranks.is_empty() {
                0.0
            } else {
                mine.iter()
                    .fold(0.0, |acc, p| acc + p.fraction.clamp(0.0, 1.0))
                    / ranks.len() as f64
            };
            NodeView {
                name,
                fraction,
                detail: node_detail(&mine),
            }
        })
        .collect()
}

fn node_detail(ranks: &[&pb::RankProgress]) -> String {
    let values = |key: &str| -> Vec<f64> {
        ranks
            .iter()
            .filter_map(|p| p.metrics.get(key).copied())
            .collect()
    };
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    // Per-GPU TFLOP/s is what operators compare against a spec sheet: the mean.
    let tflops = values("tflops");
    if !tflops.is_empty() {
        return output::fmt_metric("tflops", mean(&tflops));
    }
    // A collective is as fast as its slowest rank: the minimum.
    let busbw = values("busbw_gbps");
    if !busbw.is_empty() {
        return output::fmt_metric(
            "busbw_gbps",
            busbw.iter().cloned().fold(f64::INFINITY, f64::min),
        );
    }
    // Training throughput adds up across the node's ranks.
    let sps = values("samples_per_s");
    if !sps.is_empty() {
        return output::fmt_metric("samples_per_s", sps.iter().sum());
    }
    let mut phases: Vec<&str> = ranks
        .iter()
        .map(|p| p.phase.as_str())
        .filter(|p| !p.is_empty())
        .collect();
    phases.sort();
    phases.dedup();
    if phases.is_empty() {
        "waiting".into()
    } else {
        phases.join(",")
    }
}

/// `submit --wait`'s plain line: the job's state and time, then each
/// node's progress and headline.
pub fn node_line(job: &pb::Job, now: u64) -> String {
    let state = output::job_state(job);
    let elapsed = output::fmt_duration_opt(output::job_duration_ms(job, now));
    let per_node: Vec<String> = node_views(job)
        .iter()
        .map(|v| format!("{} {:.0}% {}", v.name, v.fraction * 100.0, v.detail))
        .collect();
    format!("{} {state} {elapsed} | {}", job.id, per_node.join(" | "))
}

/// One line for logs: state, results, and each rank's phase and fraction.
pub fn summary_line(job: &pb::Job, now: u64) -> String {
    let mut s = format!(
        "{} {} {}",
        job.id,
        output::job_state(job),
        output::fmt_duration_opt(output::job_duration_ms(job, now))
    );
    let mut progress: Vec<&pb::RankProgress> = job.progress.iter().collect();
    progress.sort_by_key(|p| p.rank);
    for p in progress {
        s.push_str(&format!(
            " | rank {} {} {:.0}%",
            p.rank,
            output::dash(&p.phase),
            p.fraction * 100.0
        ));
        if !p.metrics.is_empty() {
            s.push_str(&format!(" {}", output::fmt_metrics(&p.metrics)));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(
        rank: u32,
        node: &str,
        fraction: f64,
        metric: Option<(&str, f64)>,
    ) -> pb::RankProgress {
        pb::RankProgress {
            rank,
            node: node.into(),
            phase: "gemm".into(),
            fraction,
            metrics: metric
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            ..Default::default()
        }
    }

    fn placement(rank: u32, node: &str) -> pb::RankPlacement {
        pb::RankPlacement {
            rank,
            node: node.into(),
            ..Default::default()
        }
    }

    #[test]
    fn node_bars_average_ranks_and_pick_a_headline() {
        let job = pb::Job {
            plan: Some(pb::Plan {
                nodes: vec!["a".into(), "b".into()],
                ranks: vec![placement(0, "a"), placement(1, "a"), placement(2, "b")],
                ..Default::default()
            }),
            progress: vec![
                progress(0, "a", 0.5, Some(("tflops", 10.0))),
                progress(1, "a", 1.0, Some(("tflops", 14.6))),
                progress(2, "b", 0.25, None),
            ],
            ..Default::default()
        };
        let v = node_views(&job);
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].name, "a");
        assert!((v[0].fraction - 0.75).abs() < 1e-9);
        assert_eq!(v[0].detail, "12.3 TFLOP/s");
        assert!((v[1].fraction - 0.25).abs() < 1e-9);
        assert_eq!(v[1].detail, "gemm");

        let job = pb::Job {
            progress: vec![
                progress(0, "a", 0.1, Some(("busbw_gbps", 3.1))),
                progress(1, "a", 0.3, Some(("busbw_gbps", 2.0))),
            ],
            ..Default::default()
        };
        let v = node_views(&job);
        assert_eq!(v[0].detail, "busbw 2.00 GB/s");
        assert!((v[0].fraction - 0.2).abs() < 1e-9);
    }

    #[test]
    fn silent_ranks_pull_the_bar_down() {
        let job = pb::Job {
            plan: Some(pb::Plan {
                nodes: vec!["a".into()],
                ranks: vec![placement(0, "a"), placement(1, "a")],
                ..Default::default()
            }),
            progress: vec![progress(0, "a", 1.0, None)],
            ..Default::default()
        };
        assert!((node_views(&job)[0].fraction - 0.5).abs() < 1e-9);
    }
}

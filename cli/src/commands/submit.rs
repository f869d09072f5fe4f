//! `gpuctl submit WORKLOAD ...`: sends a checked spec; with `--wait` follows the
//! job (on a terminal with the live view `watch` shows, else with a line per
//! node now and then) and prints the report when it ends. The
//! exit code then carries the verdict (0 only for succeeded + pass), so CI can
//! gate on it.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Args;
use gpuctl_core::pb;
use tonic::Code;

use crate::client::Coordinator;
use crate::commands::job_spec::JobArgs;
use crate::exit::Exit;
use crate::output::{self, live, OutputFormat};

pub const EXAMPLES: &str = "\
Examples:
  gpuctl submit stress --duration 15m --nodes 4 --wait
  gpuctl submit nccl --nodes all --min-bytes 1M --max-bytes 1G --wait
  gpuctl submit nccl --nodes all --pattern pairs --wait      # every link between nodes
  gpuctl submit ddp --nodes 2 --model resnet50 --batch-size 256 --wait
  gpuctl submit stress --nodes all --baseline h200-ref --hang-timeout 60s --wait -o junit > results.xml";

#[derive(Debug, Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    pub job: JobArgs,
    /// Wait for the job to end, showing progress, then print its report.
    #[arg(long)]
    pub wait: bool,
}

const POLL: Duration = Duration::from_millis(500);
/// Without a terminal, a progress line this often (and on every state change).
const PLAIN_EVERY: Duration = Duration::from_secs(5);
/// How long a coordinator may be unreachable mid-wait (a restart) before we give up.
const UNREACHABLE_GRACE: Duration = Duration::from_secs(30);
/// The report is stored just before the job turns terminal; allow a little slack anyway.
const REPORT_GRACE: Duration = Duration::from_secs(5);

pub async fn run(
    c: &mut Coordinator,
    spec: pb::JobSpec,
    wait: bool,
    out: OutputFormat,
) -> Result<Exit> {
    let job = c.submit(spec).await?;
    if !wait {
        match out {
            OutputFormat::Json => output::print_json(&output::json::job(&job)),
            // Only the id on stdout, so `JOB=$(gpuctl submit ...)` works.
            _ => println!("{}", job.id),
        }
        return Ok(Exit::Ok);
    }
    eprintln!("submitted {} ({})", job.id, output::job_state(&job));
    let job = tokio::select! {
        r = follow(c, job) => r?,
        _ = tokio::signal::ctrl_c() => {
            // Detach, don't cancel: a long burn-in should survive a closed laptop lid.
            eprintln!("\nstopped waiting; the job goes on. Follow it with `gpuctl watch ID`, stop it with `gpuctl cancel ID`");
            return Ok(Exit::Interrupted);
        }
    };
    finish(c, &job, out).await
}

/// The live view on stderr (terminal) or periodic plain lines (no terminal).
struct Display {
    /// Some on a terminal: the live view, redrawn in place.
    screen: Option<live::Screen>,
    last_plain: Option<Instant>,
    last_state: i32,
}

impl Display {
    fn new() -> Self {
        // Redraws only where a person watches: piped into a file or CI, a line
        // now and then is history a log can keep.
        let tty = std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
        Display {
            screen: tty.then(live::Screen::default),
            last_plain: None,
            last_state: -1,
        }
    }

    fn live(&self) -> bool {
        self.screen.is_some()
    }

    fn update(&mut self, job: &pb::Job, latest: &[pb::TelemetryBatch]) {
        let now = gpuctl_core::now_ms();
        if let Some(screen) = &mut self.screen {
            let rows = live::rows_for(console::Term::stderr().size_checked().map(|s| s.0));
            screen.draw(
                &mut std::io::stderr().lock(),
                &live::render(job, now, latest, rows),
            );
        } else {
            let due = self.last_plain.is_none_or(|t| t.elapsed() >= PLAIN_EVERY);
            if due || job.state != self.last_state {
                let state = output::job_state(job);
                let elapsed = output::fmt_duration_opt(output::job_duration_ms(job, now));
                let per_node: Vec<String> = node_views(job)
                    .iter()
                    .map(|v| format!("{} {:.0}% {}", v.name, v.fraction * 100.0, v.detail))
                    .collect();
                eprintln!("{} {state} {elapsed} | {}", job.id, per_node.join(" | "));
                self.last_plain = Some(Instant::now());
            }
        }
        self.last_state = job.state;
    }

    /// Leaves the last view on screen; the report prints below it, after a
    /// blank line.
    fn finish(&mut self) {
        if let Some(s) = &mut self.screen {
            s.keep();
            eprintln!();
        }
    }
}

/// One node's progress in a plain line.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    pub name: String,
    pub fraction: f64,
    pub detail: String,
}

/// Per node: fraction = mean of its ranks' progress (a rank not heard from
/// counts 0); detail = the headline metric, else the ranks' phase.
pub fn node_views(job: &pb::Job) -> Vec<NodeView> {
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

/// Polls until the job is terminal; tolerates a coordinator restart for a while.
async fn follow(c: &mut Coordinator, mut job: pb::Job) -> Result<pb::Job> {
    let mut display = Display::new();
    let mut unreachable_since: Option<Instant> = None;
    let mut latest = Vec::new();
    loop {
        display.update(&job, &latest);
        if job.state().is_terminal() {
            display.finish();
            return Ok(job);
        }
        tokio::time::sleep(POLL).await;
        match c.job(&job.id, gpuctl_core::VIEW_RANKS).await {
            Ok(j) => {
                job = j;
                unreachable_since = None;
                // Telemetry is a nicety of the live view: a CPU job has none.
                if display.live() && !job.state().is_terminal() {
                    latest = c.telemetry(&job.id).await.unwrap_or_default();
                }
            }
            Err(e) => {
                let since = *unreachable_since.get_or_insert_with(Instant::now);
                if since.elapsed() > UNREACHABLE_GRACE {
                    display.finish();
                    return Err(e.context(format!("lost track of {}", job.id)));
                }
                tracing::warn!("polling {}: {e:#}", job.id);
            }
        }
    }
}

async fn finish(c: &mut Coordinator, job: &pb::Job, out: OutputFormat) -> Result<Exit> {
    let deadline = Instant::now() + REPORT_GRACE;
    loop {
        match c.report_raw(&job.id).await {
            Ok(report) => {
                output::report::print(&report, out)?;
                return Ok(Exit::of_report(&report));
            }
            Err(s)
                if matches!(
                    s.code(),
                    Code::NotFound | Code::FailedPrecondition | Code::Unavailable
                ) && Instant::now() < deadline =>
            {
                tokio::time::sleep(POLL).await;
            }
            Err(s) => {
                // No report (e.g. cancelled before it started): the job itself is the answer.
                tracing::debug!("no report for {}: {s}", job.id);
                match out {
                    OutputFormat::Json => output::print_json(&output::json::job(job)),
                    _ => output::print_text(&output::status::render(
                        job,
                        gpuctl_core::now_ms(),
                        &Default::default(),
                    )),
                }
                if job.state() == pb::JobState::Succeeded {
                    bail!(
                        "{} succeeded but its report could not be read: {}",
                        job.id,
                        s.message()
                    );
                }
                return Ok(Exit::Failed);
            }
        }
    }
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

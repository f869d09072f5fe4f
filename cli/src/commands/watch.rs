//! `gpuctl watch JOB`: redraws the job's status table in place until the job
//! ends, then points at the report. Without a terminal it prints a line per
//! change instead (logs and CI want history, not redraws).

use std::io::{IsTerminal, Write};
use std::time::Duration;

use anyhow::Result;
use gpuctl_proto::pb;

use super::status::{self, ExtraColumns};
use crate::args::OutputFormat;
use crate::client::Coordinator;
use crate::output;

/// Per-rank GPU telemetry (utilisation, temperature, power, clocks, throttle
/// reasons, XIDs) belongs here once the coordinator serves the agents'
/// `TelemetryBatch` samples through `JobService` (issue 4). The rank table
/// already takes extra columns; this is the one place to fill them.
fn telemetry_columns(_job: &pb::Job) -> ExtraColumns {
    ExtraColumns::default()
}

/// What changes between two polls; a non-terminal prints a line only then.
fn fingerprint(job: &pb::Job) -> String {
    let mut parts = vec![format!("{}:{}", job.state, job.results_in)];
    let mut progress: Vec<&pb::RankProgress> = job.progress.iter().collect();
    progress.sort_by_key(|p| p.rank);
    for p in progress {
        parts.push(format!("{}:{}:{:.0}", p.rank, p.phase, p.fraction * 20.0));
    }
    parts.join(",")
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

pub async fn run(
    c: &mut Coordinator,
    id: &str,
    interval: Duration,
    out: OutputFormat,
) -> Result<i32> {
    let tty = std::io::stdout().is_terminal();
    let mut last = String::new();
    loop {
        let job = c.job(id).await?;
        let now = gpuctl_proto::now_ms();
        let done = job.state().is_terminal();
        let fp = fingerprint(&job);
        match out {
            // One compact job object per change: easy to consume line by line.
            OutputFormat::Json => {
                if fp != last || done {
                    println!("{}", output::json::job(&job));
                }
            }
            OutputFormat::Table if tty => {
                let body = status::render(&job, now, &telemetry_columns(&job));
                let mut o = std::io::stdout().lock();
                // Home + clear screen: redraw in place like `watch(1)`.
                let _ = write!(o, "\x1b[H\x1b[2J{body}");
                if !done {
                    let _ = writeln!(
                        o,
                        "\nrefreshing every {}; Ctrl-C to stop watching (the job goes on)",
                        humanize(interval)
                    );
                }
                let _ = o.flush();
            }
            OutputFormat::Table => {
                if fp != last || done {
                    println!("{}", summary_line(&job, now));
                }
            }
        }
        last = fp;
        if done {
            if out == OutputFormat::Table {
                eprintln!(
                    "job {} {}; see `gpuctl report {}`",
                    job.id,
                    output::job_state(&job),
                    job.id
                );
            }
            return Ok(if job.state() == pb::JobState::Succeeded {
                0
            } else {
                1
            });
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = tokio::signal::ctrl_c() => {
                eprintln!("stopped watching; {id} goes on");
                return Ok(130);
            }
        }
    }
}

fn humanize(d: Duration) -> String {
    gpuctl_proto::units::format_duration_ms(d.as_millis() as u64)
}

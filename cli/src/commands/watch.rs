//! `gpuctl watch JOB`: redraws the live view (the one `submit --wait` shows)
//! in place until the job ends, then points at the report. Without a terminal
//! it prints a line per change instead (logs and CI want history, not
//! redraws). `status` prints the full rank table once.

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use gpuctl_core::clock::Clock;
use gpuctl_proto::pb;

use crate::client::Coordinator;
use crate::exit::Exit;
use crate::output::{self, live, OutputFormat};

#[derive(Debug, Args)]
pub struct WatchArgs {
    pub job: String,
    /// Refresh interval.
    #[arg(long, default_value = "1s")]
    pub interval: String,
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

pub async fn run(
    c: &mut Coordinator,
    id: &str,
    interval: Duration,
    out: OutputFormat,
    clock: &Clock,
) -> Result<Exit> {
    let tty = std::io::stdout().is_terminal();
    let mut last = String::new();
    let mut screen = live::Screen::default();
    loop {
        let max_ranks = match out {
            OutputFormat::Table if tty => gpuctl_proto::VIEW_RANKS,
            _ => 0,
        };
        let job = c.job(id, max_ranks).await?;
        let now = clock.now_ms();
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
                // Telemetry is a nicety: an older coordinator or a CPU job has none.
                let latest = if done {
                    Vec::new()
                } else {
                    c.telemetry(id).await.unwrap_or_default()
                };
                let rows = live::rows_for(console::Term::stdout().size_checked().map(|s| s.0));
                let mut lines = live::render(&job, now, &latest, rows);
                if !done {
                    lines.push(format!(
                        "refreshing every {}; Ctrl-C stops watching, not the job",
                        humanize(interval)
                    ));
                }
                screen.draw(&mut std::io::stdout().lock(), &lines);
            }
            _ => {
                if fp != last || done {
                    println!("{}", output::progress::summary_line(&job, now));
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
            return Ok(Exit::of_job(&job));
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = tokio::signal::ctrl_c() => {
                eprintln!("stopped watching; {id} goes on");
                return Ok(Exit::Interrupted);
            }
        }
    }
}

fn humanize(d: Duration) -> String {
    gpuctl_core::units::format_duration_ms(d.as_millis() as u64)
}

//! `gpuctl submit WORKLOAD ...`: sends a checked spec; with `--wait` follows the
//! job (on a terminal with the live view `watch` shows, else with a line per
//! node now and then) and prints the report when it ends. The
//! exit code then carries the verdict (0 only for succeeded + pass), so CI can
//! gate on it.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Args;
use gpuctl_core::clock::Clock;
use gpuctl_proto::pb;
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
    clock: &Clock,
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
        r = follow(c, job, clock) => r?,
        _ = tokio::signal::ctrl_c() => {
            // Detach, don't cancel: a long burn-in should survive a closed laptop lid.
            eprintln!("\nstopped waiting; the job goes on. Follow it with `gpuctl watch ID`, stop it with `gpuctl cancel ID`");
            return Ok(Exit::Interrupted);
        }
    };
    finish(c, &job, out, clock).await
}

/// The live view on stderr (terminal) or periodic plain lines (no terminal).
struct Display {
    /// Some on a terminal: the live view, redrawn in place.
    screen: Option<live::Screen>,
    last_plain: Option<Instant>,
    last_state: i32,
    /// What the views' ages are told from.
    clock: Clock,
}

impl Display {
    fn new(clock: &Clock) -> Self {
        // Redraws only where a person watches: piped into a file or CI, a line
        // now and then is history a log can keep.
        let tty = std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
        Display {
            screen: tty.then(live::Screen::default),
            last_plain: None,
            last_state: -1,
            clock: clock.clone(),
        }
    }

    fn live(&self) -> bool {
        self.screen.is_some()
    }

    fn update(&mut self, job: &pb::Job, latest: &[pb::TelemetryBatch]) {
        let now = self.clock.now_ms();
        if let Some(screen) = &mut self.screen {
            let rows = live::rows_for(console::Term::stderr().size_checked().map(|s| s.0));
            screen.draw(
                &mut std::io::stderr().lock(),
                &live::render(job, now, latest, rows),
            );
        } else {
            let due = self.last_plain.is_none_or(|t| t.elapsed() >= PLAIN_EVERY);
            if due || job.state != self.last_state {
                eprintln!("{}", output::progress::node_line(job, now));
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

/// Polls until the job is terminal; tolerates a coordinator restart for a while.
async fn follow(c: &mut Coordinator, mut job: pb::Job, clock: &Clock) -> Result<pb::Job> {
    let mut display = Display::new(clock);
    let mut unreachable_since: Option<Instant> = None;
    let mut latest = Vec::new();
    loop {
        display.update(&job, &latest);
        if job.state().is_terminal() {
            display.finish();
            return Ok(job);
        }
        tokio::time::sleep(POLL).await;
        match c.job(&job.id, gpuctl_proto::VIEW_RANKS).await {
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

async fn finish(
    c: &mut Coordinator,
    job: &pb::Job,
    out: OutputFormat,
    clock: &Clock,
) -> Result<Exit> {
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
                        clock.now_ms(),
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

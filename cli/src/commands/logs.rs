//! `gpuctl logs JOB [--rank N] [--tail N] [-f]`: worker output stored by the
//! coordinator, prefixed with the rank when more than one rank is shown. A
//! `--rank` the job does not have is bad input (exit 2), not an empty log.
//! `-f` keeps printing new lines until the job ends and its workers' last
//! lines are in.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use gpuctl_proto::pb::LogLine;

use crate::client::Coordinator;
use crate::error::UsageError;
use crate::exit::Exit;
use crate::output::{self, OutputFormat};

#[derive(Debug, Args)]
pub struct LogsArgs {
    pub job: String,
    /// Only this rank.
    #[arg(long)]
    pub rank: Option<u32>,
    /// Only the last N lines (per the whole selection).
    #[arg(long)]
    pub tail: Option<u32>,
    /// Keep printing new lines until the job ends (text output only).
    #[arg(short, long)]
    pub follow: bool,
}

pub async fn run(
    c: &mut Coordinator,
    id: &str,
    rank: Option<u32>,
    tail: Option<u32>,
    out: OutputFormat,
) -> Result<Exit> {
    let lines = c.logs(id, rank, tail.unwrap_or(0)).await?.lines;
    if let (Some(r), true) = (rank, lines.is_empty()) {
        check_rank(c, id, r).await?;
    }
    match out {
        OutputFormat::Json => output::print_json(&serde_json::Value::Array(
            lines.iter().map(output::json::log_line).collect(),
        )),
        _ => {
            output::print_text(&output::logs::text(&lines, rank.is_some()));
            if lines.is_empty() {
                eprintln!(
                    "no log lines for {id}{}",
                    rank.map(|r| format!(" rank {r}")).unwrap_or_default()
                );
            }
        }
    }
    Ok(Exit::Ok)
}

/// How often `-f` asks for new lines.
const FOLLOW_EVERY: Duration = Duration::from_secs(1);
/// How long `-f` waits, once the job has ended, for the coordinator to hear
/// every worker's end (its agent sends the worker's last lines before it):
/// a node lost with the job sends none.
const SETTLE_WAIT: Duration = Duration::from_secs(10);

/// Prints the lines there are (the last `tail`), then each new one as it
/// arrives, until the job has ended and its last lines are out.
pub async fn follow(
    c: &mut Coordinator,
    id: &str,
    rank: Option<u32>,
    tail: Option<u32>,
) -> Result<Exit> {
    let first = c.logs(id, rank, 0).await?;
    if let (Some(r), true) = (rank, first.lines.is_empty()) {
        check_rank(c, id, r).await?;
    }
    let skip = tail.map_or(0, |t| first.lines.len().saturating_sub(t as usize));
    output::print_text(&output::logs::text(&first.lines[skip..], rank.is_some()));
    // Lines come back grouped by rank, each rank's in order: new lines are
    // those past what was shown of their rank.
    let mut shown: HashMap<u32, usize> = HashMap::new();
    for l in &first.lines {
        *shown.entry(l.rank).or_default() += 1;
    }
    let mut settled = first.settled;
    let mut ended: Option<Instant> = None;
    while !settled {
        if c.job(id, 1).await?.state().is_terminal() {
            let since = *ended.get_or_insert_with(Instant::now);
            if since.elapsed() >= SETTLE_WAIT {
                eprintln!(
                    "{id} has ended, but not every worker's end was heard: \
                     later lines, if any, show in `gpuctl logs {id}`"
                );
                break;
            }
        }
        tokio::time::sleep(FOLLOW_EVERY).await;
        let got = c.logs(id, rank, 0).await?;
        settled = got.settled;
        let mut seen: HashMap<u32, usize> = HashMap::new();
        let fresh: Vec<LogLine> = got
            .lines
            .into_iter()
            .filter(|l| {
                let n = seen.entry(l.rank).or_default();
                *n += 1;
                *n > shown.get(&l.rank).copied().unwrap_or(0)
            })
            .collect();
        output::print_text(&output::logs::text(&fresh, rank.is_some()));
        for (r, n) in seen {
            let s = shown.entry(r).or_default();
            *s = (*s).max(n);
        }
    }
    Ok(Exit::Ok)
}

/// A rank the job does not have is bad input, not an empty log: asked only
/// when no line came back, so a normal call costs one request.
async fn check_rank(c: &mut Coordinator, id: &str, rank: u32) -> Result<()> {
    let job = c.job(id, 1).await?;
    let world = job.plan.as_ref().map(|p| p.world_size).unwrap_or(0);
    // Not planned yet: no ranks to name, and the rank may still come.
    if world > 0 && rank >= world {
        let ranks = if world == 1 {
            "rank 0".to_string()
        } else {
            format!("ranks 0-{}", world - 1)
        };
        return Err(UsageError(format!("--rank {rank}: {id} has {ranks}")).into());
    }
    Ok(())
}

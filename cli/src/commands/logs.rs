//! `gpuctl logs JOB [--rank N] [--tail N]`: worker output stored by the
//! coordinator, prefixed with the rank when more than one rank is shown. A
//! `--rank` the job does not have is bad input (exit 2), not an empty log.

use anyhow::Result;

use crate::args::{OutputFormat, UsageError};
use crate::client::Coordinator;
use crate::exit::Exit;
use crate::output;

pub async fn run(
    c: &mut Coordinator,
    id: &str,
    rank: Option<u32>,
    tail: Option<u32>,
    out: OutputFormat,
) -> Result<Exit> {
    let lines = c.logs(id, rank, tail.unwrap_or(0)).await?;
    if let (Some(r), true) = (rank, lines.is_empty()) {
        check_rank(c, id, r).await?;
    }
    match out {
        OutputFormat::Json => output::print_json(&serde_json::Value::Array(
            lines.iter().map(output::json::log_line).collect(),
        )),
        _ => {
            let mut text = String::new();
            for l in &lines {
                if rank.is_some() {
                    text.push_str(&l.line);
                } else {
                    // Like `docker compose logs`: who said it, then what.
                    text.push_str(&format!("[rank {} {}] {}", l.rank, l.node, l.line));
                }
                text.push('\n');
            }
            output::print_text(&text);
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

/// A rank the job does not have is bad input, not an empty log: asked only
/// when no line came back, so a normal call costs one request.
async fn check_rank(c: &mut Coordinator, id: &str, rank: u32) -> Result<()> {
    let job = c.job(id).await?;
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

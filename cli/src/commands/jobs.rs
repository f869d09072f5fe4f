//! `gpuctl jobs`: recent jobs, newest first, one line each.

use anyhow::Result;
use clap::Args;
use gpuctl_core::clock::Clock;

use crate::client::Coordinator;
use crate::exit::Exit;
use crate::output::{self, OutputFormat};

#[derive(Debug, Args)]
pub struct JobsArgs {
    /// Show at most this many jobs (0 = all).
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
}

pub async fn run(
    c: &mut Coordinator,
    limit: u32,
    out: OutputFormat,
    clock: &Clock,
) -> Result<Exit> {
    let mut jobs = c.jobs(limit).await?;
    // The coordinator's order is not part of the contract; newest first is what people expect.
    jobs.sort_by(|a, b| {
        b.created_unix_ms
            .cmp(&a.created_unix_ms)
            .then(b.id.cmp(&a.id))
    });
    match out {
        OutputFormat::Json => output::print_json(&serde_json::Value::Array(
            jobs.iter().map(output::json::job).collect(),
        )),
        out if out.is_grid() => {
            output::grid::print(&output::jobs::grid(&jobs, clock.now_ms()), out)?
        }
        _ => {
            if jobs.is_empty() {
                eprintln!("no jobs yet; submit one with `gpuctl submit stress --duration 30s`");
            } else {
                output::print_text(&output::jobs::render(&jobs, clock.now_ms()));
            }
        }
    }
    Ok(Exit::Ok)
}

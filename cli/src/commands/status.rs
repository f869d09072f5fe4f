//! `gpuctl status JOB`: one job, its plan and each rank's latest progress.
//! A running job's ranks show their GPU's latest telemetry beside them.

use anyhow::Result;
use clap::Args;
use gpuctl_core::clock::Clock;

use crate::client::Coordinator;
use crate::exit::Exit;
use crate::output::{self, OutputFormat};

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Job id, as `gpuctl submit` or `gpuctl jobs` print it.
    pub job: String,
}

pub async fn run(c: &mut Coordinator, id: &str, out: OutputFormat, clock: &Clock) -> Result<Exit> {
    // A person's table shows the ranks furthest behind; JSON has them all.
    let max_ranks = match out {
        OutputFormat::Json => 0,
        _ => gpuctl_proto::VIEW_RANKS,
    };
    let job = c.job(id, max_ranks).await?;
    match out {
        OutputFormat::Json => output::print_json(&output::json::job(&job)),
        _ => {
            // Telemetry is a nicety: an older coordinator or a CPU job has none.
            let latest = if job.state().is_terminal() {
                Vec::new()
            } else {
                c.telemetry(id).await.unwrap_or_default()
            };
            output::print_text(&output::status::render(
                &job,
                clock.now_ms(),
                &output::status::telemetry_columns(&job, &latest),
            ))
        }
    }
    Ok(Exit::of_job(&job))
}

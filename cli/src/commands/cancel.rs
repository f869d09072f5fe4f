//! `gpuctl cancel JOB`: asks the coordinator to stop a job; agents kill its
//! workers. An acceptance suite's id (`acc-…`) cancels the suite: its running
//! stage stops and no later stage starts.

use anyhow::Result;
use clap::Args;

use crate::client::Coordinator;
use crate::exit::Exit;
use crate::output::{self, OutputFormat};

#[derive(Debug, Args)]
pub struct CancelArgs {
    pub job: String,
    /// Why, recorded with the job.
    #[arg(long, default_value = "cancelled by user")]
    pub reason: String,
}

pub async fn run(c: &mut Coordinator, id: &str, reason: &str, out: OutputFormat) -> Result<Exit> {
    if id.starts_with("acc-") {
        let suite = c.cancel_suite(id).await?;
        match out {
            OutputFormat::Json => output::print_json(&serde_json::json!({
                "suite": suite.id,
                "state": suite.state().label(),
            })),
            _ => println!("{} {}", suite.id, suite.state().label()),
        }
        return Ok(Exit::Ok);
    }
    let job = c.cancel(id, reason).await?;
    match out {
        OutputFormat::Json => output::print_json(&output::json::job(&job)),
        _ => {
            // A job that had already ended keeps its state; say so rather than pretend.
            let state = output::job_state(&job);
            if job.state().is_terminal() && state != "cancelled" {
                println!("{} had already ended ({state})", job.id);
            } else {
                println!("{} {state}", job.id);
            }
        }
    }
    Ok(Exit::Ok)
}

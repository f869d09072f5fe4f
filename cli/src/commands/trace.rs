//! `gpuctl trace JOB`: the job's timeline as a Chrome trace (JSON), built from
//! its report and its stored telemetry ([`crate::output::trace`]).

use std::path::Path;

use anyhow::{Context, Result};
use clap::Args;

use crate::client::Coordinator;
use crate::exit::Exit;
use crate::output;

pub const EXAMPLES: &str = "\
Examples:
  gpuctl trace job-000042 > trace.json     # open in https://ui.perfetto.dev or chrome://tracing
  gpuctl trace job-000042 --out trace.json";

#[derive(Debug, Args)]
pub struct TraceArgs {
    /// Job id, as `gpuctl submit` or `gpuctl jobs` print it.
    pub job: String,
    /// Write the trace to this file instead of standard output.
    #[arg(long, value_name = "FILE")]
    pub out: Option<std::path::PathBuf>,
}

pub async fn run(c: &mut Coordinator, id: &str, out: Option<&Path>) -> Result<Exit> {
    let report = c.report(id).await?;
    let timeline = c.timeline(id).await?;
    let trace = output::trace::build(&report, &timeline);
    let text = serde_json::to_string(&trace)?;
    match out {
        Some(path) => {
            std::fs::write(path, text + "\n")
                .with_context(|| format!("--out: cannot write {}", path.display()))?;
            let events = trace["traceEvents"].as_array().map_or(0, Vec::len);
            eprintln!(
                "wrote {} ({events} events); open it in https://ui.perfetto.dev or chrome://tracing",
                path.display()
            );
        }
        None => output::print_text(&(text + "\n")),
    }
    Ok(Exit::Ok)
}

//! `gpuctl trace JOB`: the job's timeline as a Chrome trace (JSON), built from
//! its report and its stored telemetry ([`crate::output::trace`]).

use std::path::Path;

use anyhow::{Context, Result};

use crate::client::Coordinator;
use crate::exit::Exit;
use crate::output;

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

//! `gpuctl report JOB`: fetches a job's report and prints it
//! ([`crate::output::report`] lays it out); the exit code carries the verdict.

use anyhow::Result;

use crate::args::OutputFormat;
use crate::client::Coordinator;
use crate::exit::Exit;
use crate::output;

pub async fn run(c: &mut Coordinator, id: &str, out: OutputFormat) -> Result<Exit> {
    let report = c.report(id).await?;
    if out == OutputFormat::Html {
        // The page plots the job's telemetry over time, which the report
        // itself only summarises.
        let timeline = c.timeline(id).await?;
        output::print_text(&output::html::page(&report, &timeline)?);
    } else {
        output::report::print(&report, out)?;
    }
    // Like `submit --wait`, the exit code carries the verdict, so a script can
    // gate on `gpuctl report JOB` alone.
    Ok(Exit::of_report(&report))
}

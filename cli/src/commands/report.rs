//! `gpuctl report JOB`: fetches a job's report and prints it
//! ([`crate::output::report`] lays it out); the exit code carries the verdict.

use anyhow::Result;
use clap::Args;

use crate::client::Coordinator;
use crate::exit::Exit;
use crate::output::{self, OutputFormat};

pub const EXAMPLES: &str = "\
Examples:
  gpuctl report job-000042                 # verdict and findings first, then the tables
  gpuctl report job-000042 -o json         # for machines
  gpuctl report job-000042 -o junit > results.xml
  gpuctl report job-000042 -o md           # to paste into a ticket
  gpuctl report job-000042 -o html > report.html   # plots; opens offline in a browser";

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Job id, as `gpuctl submit` or `gpuctl jobs` print it.
    pub job: String,
}

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

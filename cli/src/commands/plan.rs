//! `gpuctl plan WORKLOAD ...`: the dry run. Shows which nodes and devices the job
//! would get, rank by rank, the planned environment with a reason per variable,
//! and the preflight checks. Nothing is stored or started. A person's table
//! of a big plan shows its first ranks and the checks that did not pass;
//! JSON has the whole plan.

use anyhow::Result;
use gpuctl_proto::pb;

use crate::client::Coordinator;
use crate::exit::Exit;
use crate::output::{self, OutputFormat};

pub async fn run(c: &mut Coordinator, spec: pb::JobSpec, out: OutputFormat) -> Result<Exit> {
    let max_ranks = match out {
        OutputFormat::Json => 0,
        _ => gpuctl_proto::VIEW_RANKS,
    };
    let plan = c.plan(spec, max_ranks).await?;
    match out {
        OutputFormat::Json => output::print_json(&output::json::plan(&plan)),
        _ => output::print_text(&output::plan::render(&plan)),
    }
    // A plan whose preflight already fails would fail as a job: say so in the
    // exit code. A bounded answer keeps the worst checks first, so a failing
    // one is never the one left out.
    let failing = plan
        .checks
        .iter()
        .any(|ch| ch.verdict() == pb::Verdict::Fail);
    Ok(Exit::failed_if(failing))
}

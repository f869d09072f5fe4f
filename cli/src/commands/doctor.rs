//! `gpuctl doctor`: the agent's preflight checks, run on this machine with no
//! coordinator (the agent crate as a library), so an operator can see what a
//! host lacks before starting an agent on it. Exit 1 when a check fails.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use gpuctl_agent::preflight::{self, verdict_of};
use gpuctl_proto::pb::Verdict;

use crate::exit::Exit;
use crate::output::{self, OutputFormat};

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// libtorch the workers would use (default: the install script's folder).
    #[arg(long, env = "GPUCTL_LIBTORCH")]
    pub libtorch: Option<PathBuf>,
    /// Where the host's /proc, /sys and /dev/shm are (an agent container's view).
    #[arg(long, default_value = "/")]
    pub host_root: PathBuf,
    /// CPU ranks the agent would offer without GPUs.
    #[arg(long, default_value_t = 1)]
    pub cpu_ranks: u32,
}

pub fn run(a: &DoctorArgs, out: OutputFormat) -> Result<Exit> {
    let local = preflight::run_local(&a.host_root, a.libtorch.as_deref(), a.cpu_ranks);
    let failed = local.checks.iter().any(|c| verdict_of(c) == Verdict::Fail);
    match out {
        OutputFormat::Json => {
            output::print_json(&output::doctor::json(&local, !failed));
        }
        _ => {
            output::print_text(&output::doctor::render(&local.checks));
            let count = |v: Verdict| local.checks.iter().filter(|c| verdict_of(c) == v).count();
            eprintln!(
                "{}: {} pass, {} warn, {} fail",
                local.facts.hostname,
                count(Verdict::Pass),
                count(Verdict::Warn),
                count(Verdict::Fail)
            );
        }
    }
    Ok(Exit::failed_if(failed))
}

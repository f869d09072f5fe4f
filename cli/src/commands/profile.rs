//! `gpuctl profile JOB`: the operator profile of a job run with `--profile`
//! (ddp, fsdp): every rank's top 10 operators by self CPU time, GPU time and
//! memory, and where each rank's Chrome trace lies. `--trace DIR` copies the
//! traces that this host can read (a local fleet, a shared file system) and
//! says how to fetch the others, which stay on their node in the agent's
//! folder of the job.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;

use crate::client::Coordinator;
use crate::exit::Exit;
use crate::output;
use crate::output::OutputFormat;

pub const EXAMPLES: &str = "\
Examples:
  gpuctl submit ddp --model mobilenet_v2 --profile --nodes 1 --wait
  gpuctl profile job-000042                    # top 10 operators per rank, trace paths
  gpuctl profile job-000042 --rank 0 --trace traces/   # and copy rank 0's Chrome trace
  gpuctl profile job-000042 -o json";

#[derive(Debug, Args)]
pub struct ProfileArgs {
    /// Job id, as `gpuctl submit` or `gpuctl jobs` print it.
    pub job: String,
    /// Only this rank.
    #[arg(long)]
    pub rank: Option<u32>,
    /// Copy each rank's Chrome trace into this folder (open them in https://ui.perfetto.dev).
    #[arg(long, value_name = "DIR")]
    pub trace: Option<PathBuf>,
}

pub async fn run(c: &mut Coordinator, a: &ProfileArgs, out: OutputFormat) -> Result<Exit> {
    let report = c.report(&a.job).await?;
    let all: Vec<_> = output::profile::profiles(&report)
        .into_iter()
        .filter(|(_, rank, _, _)| a.rank.is_none_or(|r| r == *rank))
        .collect();
    if all.is_empty() {
        eprintln!(
            "{}: no operator profile{} (submit ddp or fsdp with --profile)",
            a.job,
            a.rank.map(|r| format!(" of rank {r}")).unwrap_or_default()
        );
        return Ok(Exit::Failed);
    }
    let mut copied = Vec::new();
    if let Some(dir) = &a.trace {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("--trace: cannot create {}", dir.display()))?;
        for (node, rank, _, p) in &all {
            copied.push(copy_trace(node, *rank, &p.trace_path, dir));
        }
    }
    match out {
        OutputFormat::Json => {
            let v: Vec<_> = all
                .iter()
                .zip(copied.iter().map(Some).chain(std::iter::repeat(None)))
                .map(|((node, rank, model, p), copied)| {
                    let t = gpuctl_core::pb::TrainResult {
                        profile: Some(Box::new((*p).clone())),
                        ..Default::default()
                    };
                    json!({
                        "node": node,
                        "rank": rank,
                        "model": model,
                        "profile": output::profile::json(&t),
                        "copied_to": copied.and_then(|c| c.as_ref().ok()).map(|p| p.display().to_string()),
                    })
                })
                .collect();
            output::print_json(&json!(v));
        }
        _ => {
            let text: String = all
                .iter()
                .map(|(node, rank, model, p)| output::profile::rank_text(node, *rank, model, p))
                .collect();
            output::print_text(&text);
        }
    }
    let mut missing = false;
    for c in &copied {
        match c {
            Ok(p) => eprintln!("copied {}", p.display()),
            Err(e) => {
                missing = true;
                eprintln!("{e}");
            }
        }
    }
    Ok(Exit::failed_if(missing))
}

/// Copies one rank's trace into `dir` when this host can read it; otherwise
/// says how to fetch it from its node.
fn copy_trace(node: &str, rank: u32, path: &str, dir: &Path) -> Result<PathBuf, String> {
    if path.is_empty() {
        return Err(format!("rank {rank}: no trace was written"));
    }
    let src = Path::new(path);
    let name = src
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| format!("profile-rank{rank}.json").into());
    let dst = dir.join(name);
    match std::fs::copy(src, &dst) {
        Ok(_) => Ok(dst),
        Err(e) => Err(format!(
            "rank {rank}: {path} is on {node} and not readable here ({e}); fetch it with: scp {node}:{path} {}",
            dir.display()
        )),
    }
}

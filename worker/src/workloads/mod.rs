//! The workloads one rank can run. Each takes the rank's [`Ctx`] and returns the
//! workload's part of the `RankResult`.

pub mod nccl;
pub mod stress;

use anyhow::{bail, Result};
use gpuctl_proto::pb::rank_result::Detail;

use crate::context::Ctx;

/// What a workload hands back for the `RankResult`.
pub struct Outcome {
    pub detail: Detail,
    /// The NCCL version (or backend name) when the workload made a communicator.
    pub nccl_version: Option<String>,
    /// Set when the workload ran to the end but found a fault (wrong elements,
    /// silent data corruption): the result carries both the detail and the error.
    pub error: Option<String>,
}

/// Workloads of the job spec that this worker does not run yet.
pub const NOT_YET: &[&str] = &["ddp", "fsdp", "maxbatch"];

pub fn run(ctx: &Ctx) -> Result<Outcome> {
    match ctx.args.workload.as_str() {
        "stress" => stress::run(ctx),
        "nccl" => nccl::run(ctx),
        w if NOT_YET.contains(&w) => bail!("workload {w} is not implemented yet"),
        w => bail!(
            "unknown workload `{w}`; this worker runs {}",
            gpuctl_proto::spec::workload_names().join(", ")
        ),
    }
}

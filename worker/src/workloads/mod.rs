//! The workloads one rank can run. Each takes the rank's [`Ctx`] and returns the
//! workload's part of the `RankResult`.

pub mod ddp;
pub mod fsdp;
pub mod maxbatch;
pub mod memory;
pub mod models;
pub mod nccl;
pub mod stress;
pub mod train;

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

pub fn run(ctx: &Ctx) -> Result<Outcome> {
    match ctx.args.workload.as_str() {
        "stress" => stress::run(ctx),
        "nccl" => nccl::run(ctx),
        "ddp" => ddp::run(ctx),
        "fsdp" => fsdp::run(ctx),
        "maxbatch" => maxbatch::run(ctx),
        w => bail!(
            "unknown workload `{w}`; this worker runs {}",
            gpuctl_proto::spec::workload_names().join(", ")
        ),
    }
}

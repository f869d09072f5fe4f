//! The workloads one rank can run. Each takes the rank's [`Ctx`] and returns the
//! workload's part of the `RankResult`.

pub mod budget;
pub mod busy;
pub mod ddp;
pub mod fsdp;
pub mod maxbatch;
pub mod memory;
pub mod models;
pub mod nccl;
pub mod p2p;
pub mod stress;
pub mod train;

use anyhow::Result;
use gpuctl_core::catalogue::TypedParams;
use gpuctl_proto::pb::{rank_result::Detail, TrainResult};

use crate::context::Ctx;

/// What a workload hands back for the `RankResult`.
pub struct Outcome {
    pub detail: Detail,
    /// The NCCL version (or backend name) when the workload made a communicator.
    pub nccl_version: Option<String>,
    /// Set when the workload ran to the end but found a fault (wrong elements,
    /// silent data corruption): the result carries both the detail and the error.
    pub error: Option<String>,
    /// ddp/fsdp with `--model a,b,c`: the second and later models' results.
    pub more_train: Vec<TrainResult>,
}

/// Runs the workload whose typed parameters the rank was built with.
pub fn run(ctx: &Ctx) -> Result<Outcome> {
    match &ctx.params {
        TypedParams::Stress(p) => stress::run(ctx, p),
        TypedParams::Nccl(p) => nccl::run(ctx, p),
        TypedParams::Ddp(p) => ddp::run(ctx, p),
        TypedParams::Fsdp(p) => fsdp::run(ctx, p),
        TypedParams::MaxBatch(p) => maxbatch::run(ctx, p),
        TypedParams::P2p(p) => p2p::run(ctx, p),
    }
}

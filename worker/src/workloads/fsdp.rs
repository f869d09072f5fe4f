//! `fsdp`: sharded data parallelism on flat parameters (`train.rs`, mode
//! [`Mode::Fsdp`]): each rank keeps 1/world of the fp32 master parameters and
//! of the momentum; gradients are reduce-scattered into the shard and the
//! compute parameters all-gathered from the shards after each update.
//!
//! tch has no per-module hooks, so the gathered parameters stay whole for the
//! forward and backward (the memory of ZeRO stage 2, not of per-layer
//! re-gathering): the saving against ddp is the master weights and the
//! optimizer state, which the peak memory in the result shows beside ddp's.

use anyhow::Result;
use gpuctl_proto::catalogue::TrainParams;

use super::train::Mode;
use super::Outcome;
use crate::context::Ctx;

pub fn run(ctx: &Ctx, params: &TrainParams) -> Result<Outcome> {
    super::ddp::run_mode(ctx, params, Mode::Fsdp)
}

//! `fsdp`: sharded data parallelism (`train/sharded.rs`, mode
//! [`Mode::Fsdp`]): each rank keeps 1/world of every unit's fp32 master
//! parameters and momentum; a block's parameters are all-gathered before its
//! forward and again for its backward, and its gradients reduce-scattered as
//! soon as its backward is queued, overlapping the rest of backward.

use anyhow::Result;
use gpuctl_core::catalogue::TrainParams;

use super::train::Mode;
use super::Outcome;
use crate::context::Ctx;

pub fn run(ctx: &Ctx, params: &TrainParams) -> Result<Outcome> {
    super::ddp::run_mode(ctx, params, Mode::Fsdp)
}

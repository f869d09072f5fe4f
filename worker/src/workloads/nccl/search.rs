//! `--pattern search`: every slow node and every slow link among the job's
//! nodes, by the adaptive group testing of [`gpuctl_core::search`], each
//! blamed only after a second measurement with another partner agrees. The
//! rounds are measured as bisect's are ([`super::bisect::run_rounds`]):
//! all_reduce at `max_bytes` over each group, GPU i of every node together.

use std::cell::RefCell;

use anyhow::Result;
use gpuctl_core::catalogue::{NcclParams, NcclPattern};
use gpuctl_core::search::Search;

use super::bisect::{run_rounds, Bisected, RoundsEnv};
use super::pairs::{check_shape, opener, round_timeout, Place};
use super::report_progress;
use super::sweep::config;
use crate::context::Ctx;
use crate::workloads::Outcome;

/// The healthy spread of one group's busbw: NCCL over NVLink or InfiniBand
/// (±5 %), and the TCP ring of CPU ranks, or NCCL over sockets (±20 %).
fn spread(ctx: &Ctx) -> f64 {
    if ctx.dev.is_cuda() && std::env::var_os("NCCL_HOSTID").is_none() {
        0.05
    } else {
        0.2
    }
}

pub fn run(ctx: &Ctx, params: &NcclParams) -> Result<Outcome> {
    let cfg = config(params)?;
    let place = Place::from_env(NcclPattern::Search, &ctx.env)?;
    let version = RefCell::new(None);
    let open = opener(ctx, &version);
    let progress = report_progress(ctx);
    let env = RoundsEnv {
        place: &place,
        cfg: &cfg,
        rdzv: ctx.rdzv.as_ref(),
        open: &open,
        dev: ctx.dev.device,
        round_timeout: round_timeout(ctx),
        progress: &progress,
    };
    let out = search(&env, params.slow_ratio, spread(ctx))?;
    Ok(out
        .rounds_if_carried(&place)
        .into_outcome("search's", version.take()))
}

/// The whole search on this rank: `slow_ratio` of the upper-quartile group
/// is slow, `spread` the fabric's healthy spread of one measurement.
pub fn search(env: &RoundsEnv, slow_ratio: f64, spread: f64) -> Result<Bisected> {
    let place = env.place;
    check_shape(NcclPattern::Search, place, env.rdzv, env.round_timeout)?;
    let mut search = Search::new(place.nnodes, slow_ratio, None).with_spread(spread);
    let expect = (usize::BITS - (place.nnodes - 1).leading_zeros()) as f64 + 2.0;
    let out = run_rounds(env, &mut search, NcclPattern::Search, expect)?;
    Ok(with_outcome(out, &search))
}

/// The search's verdict in the result: blamed, cleared, undecided.
pub fn with_outcome(mut out: Bisected, search: &Search) -> Bisected {
    gpuctl_core::search::wire::verdict(&mut out.result, search);
    out
}

//! `p2p`: copies between host and GPU, and the median of a rank's GPU pairs,
//! each the better of two passes. The pairs themselves are judged against
//! each other by `judge::checks::p2p`; here only what a rank's figures are.

use gpuctl_core::catalogue::P2pParams;
use gpuctl_core::stats::median;
use gpuctl_proto::pb::P2pResult;

use super::{Expected, Figure, Metric, Name};

/// `pinned 268435456` (GPU ranks) or `host 16777216` (CPU ranks).
pub fn copy_key(method: &str, bytes: u64) -> String {
    format!("{method} {bytes}")
}

/// `send 268435456`: one GPU sending to another.
pub fn p2p_key(bytes: u64) -> String {
    format!("send {bytes}")
}

/// How a rank copies between host and device: pinned host memory to a GPU,
/// or one host buffer to another on a CPU rank.
pub fn copy_method(gpu: bool) -> &'static str {
    if gpu {
        "pinned"
    } else {
        "host"
    }
}

/// The figure of two passes: the better one, so that one slow pass never
/// blames a link (a second that agrees does).
pub fn better_pass(first: f64, repeat: f64) -> f64 {
    first.max(repeat)
}

pub(super) fn rank_figures(p: &P2pResult) -> Vec<Figure> {
    let fig = |metric, key: Name, value| Figure { metric, key, value };
    let key: Name = copy_key(&p.method, p.bytes).into();
    let mut out = Vec::new();
    for (metric, a, b) in [
        (Metric::H2dGbps, p.h2d_gbps, p.h2d_repeat_gbps),
        (Metric::D2hGbps, p.d2h_gbps, p.d2h_repeat_gbps),
    ] {
        if better_pass(a, b) > 0.0 {
            out.push(fig(metric, key.clone(), better_pass(a, b)));
        }
    }
    let pairs: Vec<f64> = p
        .peers
        .iter()
        .map(|c| better_pass(c.gbps, c.repeat_gbps))
        .collect();
    if let Some(m) = median(pairs) {
        out.push(fig(Metric::P2pGbps, p2p_key(p.bytes).into(), m));
    }
    out
}

/// GPU pairs exist only on nodes of two GPUs or more: a floor on them
/// applies where they were measured, never by their absence.
pub(super) fn expected(p: &P2pParams, gpu: bool, out: &mut Expected) {
    let key = copy_key(copy_method(gpu), p.bytes / 4 * 4);
    out.insert((Metric::H2dGbps, key.clone()));
    out.insert((Metric::D2hGbps, key));
}

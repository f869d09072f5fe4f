//! GPU health onto ranks and nodes: a GPU with a failing health finding fails
//! the ranks that ran on it, matched by UUID, else by NVML index;
//! a failing GPU that no rank ran on fails its node. Also what the health
//! rules need from the ranks: when each GPU ran its measured phase, and
//! whether the job's bandwidth confirms a link down.

use std::collections::BTreeMap;

use gpuctl_proto::pb::{Finding, HealthFinding, Plan, RankResult, Verdict};

use super::ranks::{RankStates, Source};
use crate::judge::health::{HealthRules, Level};
use crate::judge::telemetry::Windows;

/// When each GPU's rank ran its measured phase: from its first timeline mark
/// with work counted (GEMMs, collectives, steps: after libtorch, NCCL and the
/// model were set up) to its last mark. A rank with no such mark gives none,
/// and its GPU's `idle` is not judged.
pub(super) fn measured_windows(plan: &Plan, results: &BTreeMap<u32, RankResult>) -> Windows {
    let mut out = Windows::new();
    for p in &plan.ranks {
        let (Some(gpu), Some(r)) = (p.gpu_index, results.get(&p.rank)) else {
            continue;
        };
        let Some(from) = r.phases.iter().find(|m| m.iterations > 0) else {
            continue;
        };
        let to = r.phases.last().map_or(from.unix_ms, |m| m.unix_ms);
        if to > from.unix_ms {
            out.insert((p.node.clone(), gpu), (from.unix_ms, to));
        }
    }
    out
}

/// Raises `nvlink` findings to the `nvlink_down` level on nodes whose
/// bandwidth failed in this job (a job-wide figure counts for a job of one
/// node); elsewhere they stay at `nvlink_down_unconfirmed`, saying so.
pub(super) fn confirm_nvlink<'a>(
    health: &mut [HealthFinding],
    bandwidth: impl Iterator<Item = &'a Finding>,
    nodes: &[String],
    rules: &HealthRules,
) {
    let mut slow: BTreeMap<&str, String> = BTreeMap::new();
    for f in bandwidth.filter(|f| {
        f.level() == Verdict::Fail && matches!(f.metric.as_str(), "busbw" | "link_busbw")
    }) {
        let node = match (f.node.as_str(), nodes) {
            ("", [only]) => only.as_str(),
            (n, _) => n,
        };
        slow.entry(node).or_insert_with(|| f.detail.clone());
    }
    for h in health.iter_mut().filter(|h| h.rule == "nvlink") {
        match slow.get(h.node.as_str()) {
            Some(why) if rules.nvlink_down != Level::Off => {
                h.verdict = match rules.nvlink_down {
                    Level::Fail => Verdict::Fail,
                    _ => Verdict::Warn,
                } as i32;
                h.detail = format!("{}; confirmed by this job's bandwidth: {why}", h.detail);
            }
            _ => {
                h.detail = format!(
                    "{}; not confirmed by a bandwidth measurement in this job (`gpuctl submit nccl` on the node measures it)",
                    h.detail
                )
            }
        }
    }
}

/// Fails the ranks on failing GPUs; returns, per node, the failures of GPUs
/// that no rank ran on.
pub(super) fn apply(
    health: &[HealthFinding],
    plan: &Plan,
    states: &mut RankStates,
) -> BTreeMap<String, Vec<String>> {
    let mut node_faults: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in health.iter().filter(|f| f.verdict() == Verdict::Fail) {
        let why = format!("GPU {} health `{}`: {}", f.gpu_index, f.rule, f.detail);
        let on_gpu: Vec<u32> = plan
            .ranks
            .iter()
            .filter(|p| {
                p.node == f.node
                    && if !f.uuid.is_empty() && !p.gpu_uuid.is_empty() {
                        p.gpu_uuid == f.uuid
                    } else {
                        p.gpu_index == Some(f.gpu_index)
                    }
            })
            .map(|p| p.rank)
            .collect();
        for rank in &on_gpu {
            if let Some(st) = states.get_mut(rank) {
                st.fail_from(Source::Health, why.clone());
            }
        }
        if on_gpu.is_empty() {
            node_faults.entry(f.node.clone()).or_default().push(why);
        }
    }
    node_faults
}

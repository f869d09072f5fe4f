//! GPU health onto ranks and nodes: a GPU with a failing health finding fails
//! the ranks that ran on it, matched by UUID, else by NVML index;
//! a failing GPU that no rank ran on fails its node.

use std::collections::BTreeMap;

use gpuctl_proto::pb::{HealthFinding, Plan, Verdict};

use super::ranks::{RankStates, Source};

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

//! The checks' answers placed on ranks and nodes: a failing GPU fails the
//! ranks that ran on it (matched by UUID, else by NVML index) or, where no
//! rank ran, its node; a figure or a GPU pair that misses fails (or warns)
//! the rank it names. The checks decided; this only says whom it touches.

use std::collections::BTreeMap;

use gpuctl_proto::pb::{GpuTelemetrySummary, Plan, Verdict};

use super::ranks::{RankStates, Source};
use crate::judge::checks::perf::{fmt_value, Metric};
use crate::judge::checks::{Check, Level};

/// A GPU summary's verdict after `nvlink::confirm_nvlink` raised a finding of it.
pub(super) fn fail_summaries(health: &[Check], summaries: &mut [GpuTelemetrySummary]) {
    for h in health.iter().filter(|h| h.level == Level::Fail) {
        for s in summaries
            .iter_mut()
            .filter(|s| s.node == h.node && Some(s.index) == h.gpu_index)
        {
            s.verdict = Verdict::Fail as i32;
        }
    }
}

/// Fails the ranks on failing GPUs; returns, per node, the failures of GPUs
/// that no rank ran on.
pub(super) fn health(
    health: &[Check],
    plan: &Plan,
    states: &mut RankStates,
) -> BTreeMap<String, Vec<String>> {
    let mut node_faults: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in health.iter().filter(|f| f.level == Level::Fail) {
        let index = f.gpu_index.unwrap_or_default();
        let why = format!("GPU {index} health `{}`: {}", f.rule, f.detail);
        let on_gpu: Vec<u32> = plan
            .ranks
            .iter()
            .filter(|p| {
                p.node == f.node
                    && if !f.gpu_uuid.is_empty() && !p.gpu_uuid.is_empty() {
                        p.gpu_uuid == f.gpu_uuid
                    } else {
                        p.gpu_index == f.gpu_index
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

/// Fails or warns the rank each performance check names.
pub(super) fn performance(found: &[Check], states: &mut RankStates) {
    for f in found {
        let Some(st) = f.rank.and_then(|r| states.get_mut(&r)) else {
            continue;
        };
        match f.level {
            Level::Fail => st.fail_from(Source::Performance, reason(f)),
            _ => st.warn_from(Source::Performance, reason(f)),
        }
    }
}

/// Fails the rank a failing pair check names (a culprit GPU, a slow
/// direction's sender), and so its node, as performance checks do.
pub(super) fn pairs(found: &[Check], states: &mut RankStates) {
    for f in found.iter().filter(|f| f.level == Level::Fail) {
        if let Some(st) = f.rank.and_then(|r| states.get_mut(&r)) {
            st.fail_from(Source::Performance, f.detail.clone());
        }
    }
}

/// "stress_tflops bf16 8192 = 3.1 TFLOP/s, fleet 6.8 (0.46×)": a finding as
/// a rank's reason, the rank being named already.
fn reason(f: &Check) -> String {
    let what = format!("{} {}", f.metric, f.key);
    let Some(metric) = Metric::from_name(&f.metric) else {
        return f.detail.clone();
    };
    let reference = fmt_value(metric, f.reference);
    if f.missing {
        format!("no {what} ({} reference {reference})", f.reference_kind)
    } else {
        format!(
            "{what} = {} against {} reference {reference}",
            fmt_value(metric, f.value),
            f.reference_kind
        )
    }
}

//! Planning, free of I/O and of scheduler state: which nodes a job gets, its
//! rank table and environment, and the preflight checks that decide whether
//! the plan can run. The scheduler asks; nothing here schedules.

pub mod memory;
pub mod nccl_env;
pub mod planner;
pub mod preflight;

use std::collections::HashMap;

use gpuctl_core::catalogue::{check_placed, Placed, SpecError};
use gpuctl_proto::pb::{JobSpec, Plan, PreflightCheck, Verdict};

use crate::judge::checks::preflight::wire;
use crate::judge::checks::{Check, Level, Phase};

/// The rules of the request that only its nodes tell
/// (`catalogue::check_placed`: ranks per node, each device's defaults),
/// on a plan: what refuses it naming the flag, before anything runs.
pub fn check_request(spec: &JobSpec, plan: &Plan) -> Result<(), SpecError> {
    let mut per_node: HashMap<&str, (u32, bool)> = HashMap::new();
    for r in &plan.ranks {
        let e = per_node.entry(r.node.as_str()).or_default();
        e.0 += 1;
        e.1 |= r.gpu_index.is_some();
    }
    let placed = Placed {
        nodes: plan
            .nodes
            .iter()
            .map(|n| {
                let (ranks, gpu) = per_node.get(n.as_str()).copied().unwrap_or_default();
                (n.clone(), ranks, gpu)
            })
            .collect(),
    };
    check_placed(&spec.workload, &spec.params, &placed)
}

/// One preflight check of the plan, made as every check is
/// ([`Check`]) and stored as the wire's `PreflightCheck` in the
/// plan; `node` is empty for a check about the whole plan.
fn check(node: &str, name: &str, verdict: Verdict, detail: String, fix: &str) -> PreflightCheck {
    wire(&Check {
        level: Level::of(verdict),
        node: node.into(),
        metric: "preflight".into(),
        key: name.into(),
        rule: name.into(),
        detail,
        fix: fix.into(),
        phase: Phase::Plan,
        ..Default::default()
    })
}

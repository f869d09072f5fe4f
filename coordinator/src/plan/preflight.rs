//! Preflight checks of a plan: what the agents' facts say about the chosen
//! nodes (room in /dev/shm, mixed GPU models, NCCL and libtorch versions that
//! must agree), and which failures stop a job from starting.

use gpuctl_proto::pb::{Node, Plan, PreflightCheck, Verdict};

use super::{check, nccl_env};
use crate::error::CoordinatorError;

/// NCCL wants room in /dev/shm for its intra-node buffers; Docker's default 64 MiB
/// is the classic failure on multi-GPU hosts.
const SHM_MIN_BYTES: u64 = 512 << 20;
const SHM_PER_GPU_BYTES: u64 = 64 << 20;

/// Checks that stop a job from starting. Others (and every check an agent
/// reports about itself) are shown in the plan and the report but do not block:
/// an acceptance run should report a weak node, not refuse to test it.
const BLOCKING_CHECKS: &[&str] = &[
    "shm",
    nccl_env::ENV_CHECK,
    nccl_env::NCCL_VERSION_CHECK,
    nccl_env::TORCH_VERSION_CHECK,
    super::memory::MEMORY_CHECK,
];

/// Preflight checks from the facts the agents reported.
pub fn checks(nodes: &[&Node]) -> Vec<PreflightCheck> {
    let mut out = Vec::new();
    for n in nodes {
        out.extend(n.preflight.iter().cloned().map(|mut c| {
            if c.node.is_empty() {
                c.node = n.name.clone();
            }
            c
        }));
        let Some(f) = n.facts.as_ref() else { continue };
        let gpus = n.gpus.len() as u64;
        if gpus > 1 && f.shm_bytes > 0 {
            let need = SHM_MIN_BYTES.max(SHM_PER_GPU_BYTES * gpus);
            let have = gpuctl_core::units::format_bytes(f.shm_bytes);
            let want = gpuctl_core::units::format_bytes(need);
            out.push(if f.shm_bytes < need {
                check(
                    &n.name,
                    "shm",
                    Verdict::Fail,
                    format!("/dev/shm is {have}; NCCL needs at least {want} for {gpus} GPUs"),
                    "run the agent with --ipc=host or --shm-size=1g (Kubernetes: an emptyDir with medium: Memory at /dev/shm)",
                )
            } else {
                check(&n.name, "shm", Verdict::Pass, format!("/dev/shm is {have}"), "")
            });
        }
    }
    // Mixed fleets still run, but their numbers do not compare like for like.
    let distinct = |f: &dyn Fn(&Node) -> String| -> Vec<String> {
        let mut v: Vec<String> = nodes
            .iter()
            .map(|n| f(n))
            .filter(|s| !s.is_empty())
            .collect();
        v.sort();
        v.dedup();
        v
    };
    let models = distinct(&|n| n.gpus.first().map(|g| g.name.clone()).unwrap_or_default());
    if models.len() > 1 {
        out.push(check(
            "",
            "gpu-models",
            Verdict::Warn,
            format!(
                "mixed GPU models: {}; results are compared within each model",
                models.join(", ")
            ),
            "select one model with --selector gpu=MODEL",
        ));
    }
    out.extend(nccl_env::consistency(nodes));
    out
}

/// The first failing check as an error, naming the node and the fix.
pub fn preflight_error(plan: &Plan) -> Option<CoordinatorError> {
    let failed: Vec<String> = plan
        .checks
        .iter()
        .filter(|c| c.verdict() == Verdict::Fail && BLOCKING_CHECKS.contains(&c.name.as_str()))
        .map(|c| {
            let on = if c.node.is_empty() {
                String::new()
            } else {
                format!(" on {}", c.node)
            };
            format!(
                "preflight `{}` failed{on}: {}; fix: {}",
                c.name, c.detail, c.fix
            )
        })
        .collect();
    (!failed.is_empty()).then(|| CoordinatorError::PlanRefused(failed.join("; ")))
}

//! Preflight: a host looked at before the job, as checks. They are made
//! where the facts are: the plan's in `plan/preflight.rs` (from what the
//! agents registered with: /dev/shm, mixed GPU models, NCCL and libtorch
//! versions) and the agent's own in `agent/src/preflight/checks/` (driver,
//! GPUs, topology, libraries, limits, network), run again when an
//! assignment arrives. Both travel as the wire's `PreflightCheck` ([`wire`]:
//! the plan's are made as [`Check`]s and stored so); here they become
//! [`Check`]s again, the job's set picked from the two.

use std::collections::BTreeSet;

use gpuctl_proto::pb::{Job, PreflightCheck};

use super::{Check, Level, Phase};

/// The preflight checks of a job, each with the phase that made it: the
/// plan's, with each node's replaced by those its agent ran when the
/// assignment arrived.
fn picked(job: &Job) -> impl Iterator<Item = (&PreflightCheck, Phase)> {
    let fresh: BTreeSet<&str> = job.start_checks.iter().map(|c| c.node.as_str()).collect();
    let plan = job
        .plan
        .as_ref()
        .map(|p| p.checks.as_slice())
        .unwrap_or_default();
    plan.iter()
        .filter(move |c| c.node.is_empty() || !fresh.contains(c.node.as_str()))
        .map(|c| (c, Phase::Plan))
        .chain(job.start_checks.iter().map(|c| (c, Phase::Start)))
}

/// The job's preflight checks as the wire shows them (`Report.preflight`).
pub fn of_job(job: &Job) -> Vec<PreflightCheck> {
    picked(job).map(|(c, _)| c.clone()).collect()
}

/// The job's preflight checks as [`Check`]s.
pub fn checks(job: &Job) -> Vec<Check> {
    picked(job).map(|(c, phase)| check(c, phase)).collect()
}

/// A preflight check as the wire carries it (in the plan, from the agent).
/// What the wire cannot say reads as unspecified: an unknown level.
pub fn wire(c: &Check) -> PreflightCheck {
    PreflightCheck {
        node: c.node.clone(),
        name: c.rule.clone(),
        verdict: c.level.verdict() as i32,
        detail: c.detail.clone(),
        fix: c.fix.clone(),
    }
}

/// One preflight check as a [`Check`]: `phase` says whether the plan or the
/// agent at start made it.
pub fn check(c: &PreflightCheck, phase: Phase) -> Check {
    Check {
        level: Level::of(c.verdict()),
        node: c.node.clone(),
        metric: "preflight".into(),
        key: c.name.clone(),
        rule: c.name.clone(),
        detail: c.detail.clone(),
        fix: c.fix.clone(),
        phase,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;

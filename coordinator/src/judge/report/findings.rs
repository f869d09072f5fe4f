//! One list of everything that failed or warned, so that a report leads
//! with the same rows whatever found them: a rank's own failure (crash,
//! corruption, wrong elements), a performance figure, a GPU health rule, a
//! preflight check at job start. Every one is a [`Check`]; here they become
//! the wire's [`Finding`] (and a health check its GPU's [`HealthFinding`]),
//! once and in one place. Worst first; a finding of level pass only says
//! what a figure could not be judged against.

use gpuctl_proto::pb::{Finding, HealthFinding, Plan};

use super::ranks::{RankStates, Source};
use crate::judge::checks::{Check, Level, Phase};

/// A check as the wire's finding. Health and preflight checks say their
/// sentence about what they looked at alone (the report shows them under
/// their GPU and node); in the one list of findings they say whom.
pub(super) fn finding(c: &Check) -> Finding {
    let detail = match c.metric.as_str() {
        "health" => format!(
            "node {} GPU {}: health `{}`: {}",
            c.node,
            c.gpu_index.unwrap_or_default(),
            c.rule,
            c.detail
        ),
        "preflight" => {
            let at = if c.node.is_empty() {
                "across nodes".to_string()
            } else {
                format!("node {}", c.node)
            };
            let mut d = format!("{at}: preflight `{}`: {}", c.rule, c.detail);
            if !c.fix.is_empty() {
                d.push_str(&format!(" (fix: {})", c.fix));
            }
            d
        }
        _ => c.detail.clone(),
    };
    Finding {
        node: c.node.clone(),
        rank: c.rank,
        gpu_index: c.gpu_index,
        gpu_uuid: c.gpu_uuid.clone(),
        metric: c.metric.clone(),
        key: c.key.clone(),
        value: c.value,
        missing: c.missing,
        reference: c.reference,
        reference_kind: c.reference_kind.clone(),
        rule: c.rule.clone(),
        level: c.level.verdict() as i32,
        unit: c.unit.clone(),
        detail,
        phase: c.phase.name().to_string(),
    }
}

/// A health check as its GPU's entry in the report's health list.
pub(super) fn health(c: &Check) -> HealthFinding {
    HealthFinding {
        node: c.node.clone(),
        gpu_index: c.gpu_index.unwrap_or_default(),
        uuid: c.gpu_uuid.clone(),
        verdict: c.level.verdict() as i32,
        rule: c.rule.clone(),
        detail: c.detail.clone(),
    }
}

/// Failures that ranks reported or that the result checks found.
pub(super) fn of_ranks(plan: &Plan, states: &RankStates) -> Vec<Check> {
    let mut out = Vec::new();
    for p in &plan.ranks {
        let Some(st) = states.get(&p.rank) else {
            continue;
        };
        if st.verdict != gpuctl_proto::pb::Verdict::Fail {
            continue;
        }
        for (_, why) in st.reasons.iter().filter(|(s, _)| *s == Source::Result) {
            out.push(Check {
                level: Level::Fail,
                node: p.node.clone(),
                rank: Some(p.rank),
                gpu_index: p.gpu_index,
                gpu_uuid: p.gpu_uuid.clone(),
                metric: "result".into(),
                detail: format!("rank {} on node {}: {why}", p.rank, p.node),
                phase: Phase::Result,
                ..Default::default()
            });
        }
    }
    out
}

/// Only what failed or warned goes in the list.
pub(super) fn fired(checks: &[Check]) -> impl Iterator<Item = Check> + '_ {
    checks
        .iter()
        .filter(|c| matches!(c.level, Level::Fail | Level::Warn))
        .cloned()
}

/// The job's own failure when it failed for its request (`why`, the job's
/// message): the job's, naming no node.
pub(super) fn of_request(why: &str) -> Check {
    Check {
        level: Level::Fail,
        metric: gpuctl_core::request::FINDING_METRIC.into(),
        rule: "a request that cannot run fails its job and no node: fix the request".into(),
        detail: why.to_string(),
        phase: Phase::Result,
        ..Default::default()
    }
}

/// Fail before warn, and both before what is only said (a pass-level
/// finding: what a figure was and was not judged against); then by node
/// (the job's own first), rank and GPU.
pub(super) fn sort(findings: &mut [Check]) {
    findings.sort_by(|a, b| {
        let rank = |f: &Check| match f.level {
            Level::Fail => 0,
            Level::Warn => 1,
            _ => 2,
        };
        rank(a)
            .cmp(&rank(b))
            .then_with(|| a.node.cmp(&b.node))
            .then_with(|| a.rank.cmp(&b.rank))
            .then_with(|| a.gpu_index.cmp(&b.gpu_index))
    });
}

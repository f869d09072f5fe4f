//! One list of everything that failed or warned, in the [`Finding`] form, so
//! that a report leads with the same rows whatever found them: a rank's own
//! failure (crash, corruption, wrong elements), a performance figure, a GPU
//! health rule, a preflight check at job start. Worst first; a finding of
//! level pass only says what a figure could not be judged against.

use gpuctl_proto::pb::{Finding, HealthFinding, Plan, PreflightCheck, Verdict};

use super::ranks::{RankStates, Source};

fn base(node: &str, level: Verdict, metric: &str, key: &str, detail: String) -> Finding {
    Finding {
        node: node.to_string(),
        metric: metric.to_string(),
        key: key.to_string(),
        level: level as i32,
        detail,
        ..Default::default()
    }
}

/// Failures that ranks reported or that the result checks found.
pub(super) fn of_ranks(plan: &Plan, states: &RankStates) -> Vec<Finding> {
    let mut out = Vec::new();
    for p in &plan.ranks {
        let Some(st) = states.get(&p.rank) else {
            continue;
        };
        if st.verdict != Verdict::Fail {
            continue;
        }
        for (_, why) in st.reasons.iter().filter(|(s, _)| *s == Source::Result) {
            let mut f = base(
                &p.node,
                Verdict::Fail,
                "result",
                "",
                format!("rank {} on node {}: {why}", p.rank, p.node),
            );
            f.rank = Some(p.rank);
            f.gpu_index = p.gpu_index;
            f.gpu_uuid = p.gpu_uuid.clone();
            out.push(f);
        }
    }
    out
}

/// GPU health rules that fired (fail or warn).
pub(super) fn of_health(health: &[HealthFinding]) -> Vec<Finding> {
    health
        .iter()
        .filter(|h| matches!(h.verdict(), Verdict::Fail | Verdict::Warn))
        .map(|h| {
            let mut f = base(
                &h.node,
                h.verdict(),
                "health",
                &h.rule,
                format!(
                    "node {} GPU {}: health `{}`: {}",
                    h.node, h.gpu_index, h.rule, h.detail
                ),
            );
            f.gpu_index = Some(h.gpu_index);
            f.gpu_uuid = h.uuid.clone();
            f.rule = h.rule.clone();
            f
        })
        .collect()
}

/// Preflight checks that did not pass.
pub(super) fn of_preflight(checks: &[PreflightCheck]) -> Vec<Finding> {
    checks
        .iter()
        .filter(|c| matches!(c.verdict(), Verdict::Fail | Verdict::Warn))
        .map(|c| {
            let at = if c.node.is_empty() {
                "across nodes".to_string()
            } else {
                format!("node {}", c.node)
            };
            let mut detail = format!("{at}: preflight `{}`: {}", c.name, c.detail);
            if !c.fix.is_empty() {
                detail.push_str(&format!(" (fix: {})", c.fix));
            }
            let mut f = base(&c.node, c.verdict(), "preflight", &c.name, detail);
            f.rule = c.name.clone();
            f
        })
        .collect()
}

/// The job's own failure when it failed for its request (`why`, the job's
/// message): the job's, naming no node.
pub(super) fn of_request(why: &str) -> Finding {
    let mut f = base(
        "",
        Verdict::Fail,
        gpuctl_core::request::FINDING_METRIC,
        "",
        why.to_string(),
    );
    f.rule = "a request that cannot run fails its job and no node: fix the request".into();
    f
}

/// Fail before warn, and both before what is only said (a pass-level
/// finding: what a figure was and was not judged against); then by node
/// (the job's own first), rank and GPU.
pub(super) fn sort(findings: &mut [Finding]) {
    findings.sort_by(|a, b| {
        let rank = |f: &Finding| match f.level() {
            Verdict::Fail => 0,
            Verdict::Warn => 1,
            _ => 2,
        };
        rank(a)
            .cmp(&rank(b))
            .then_with(|| a.node.cmp(&b.node))
            .then_with(|| a.rank.cmp(&b.rank))
            .then_with(|| a.gpu_index.cmp(&b.gpu_index))
    });
}

//! The verdict of a job: from its ranks alone (what decides whether a job
//! that ran to the end succeeded), and for the whole report, where the job's
//! own end (failed, cancelled, still running) has its say.

use gpuctl_proto::pb::{Job, JobState, NodeReport, RankReport, Report, Verdict};

use super::ranks::is_unreached;

/// The findings of the job as a whole (a job figure of several nodes, a
/// slow link between two good nodes) at `level`.
fn job_level(report: &Report, level: Verdict) -> Vec<&str> {
    report
        .findings
        .iter()
        .filter(|f| f.node.is_empty() && f.metric != "preflight" && f.level() == level)
        .map(|f| f.detail.as_str())
        .collect()
}

/// A job that ran to its end and passed: `warn` when anything warned.
fn with_warnings(report: &Report, verdict: Verdict, reason: String) -> (Verdict, String) {
    if verdict != Verdict::Pass {
        return (verdict, reason);
    }
    let warned: Vec<&str> = report
        .nodes
        .iter()
        .filter(|n| n.verdict() == Verdict::Warn)
        .map(|n| n.name.as_str())
        .collect();
    let job_warns = job_level(report, Verdict::Warn).len();
    if warned.is_empty() && job_warns == 0 {
        return (verdict, reason);
    }
    let mut parts = Vec::new();
    if !warned.is_empty() {
        parts.push(format!(
            "warnings on {}",
            gpuctl_core::listing::names(&warned)
        ));
    }
    if job_warns > 0 {
        parts.push(format!("{job_warns} warning(s) on the job's figures"));
    }
    (
        Verdict::Warn,
        format!("{reason}, with {}", parts.join(" and ")),
    )
}

/// Sets the report's verdict and reason; a job still running gets a note
/// saying the report is partial. `reported`: how many ranks sent a result.
pub(super) fn judge_job(report: &mut Report, job: &Job, reported: usize) {
    let state = job.state();
    let (ranks_verdict, ranks_reason) = ranks_verdict(report);
    let (verdict, reason) = match state {
        JobState::Succeeded => with_warnings(report, ranks_verdict, ranks_reason),
        // Ended only because results did not reach this coordinator: no
        // rank or node failed, so neither does the job (`ranks::is_unreached`).
        JobState::Failed if ranks_verdict != Verdict::Fail && unreached_only(report) => {
            (Verdict::Incomplete, ranks_reason)
        }
        JobState::Failed => {
            let why = if ranks_verdict == Verdict::Fail && job.message.is_empty() {
                ranks_reason
            } else {
                job.message.clone()
            };
            (Verdict::Fail, why)
        }
        JobState::Cancelled => {
            let v = if ranks_verdict == Verdict::Fail {
                Verdict::Fail
            } else {
                Verdict::Incomplete
            };
            let msg = if job.message.is_empty() {
                "cancelled".to_string()
            } else {
                job.message.clone()
            };
            (v, msg)
        }
        JobState::Running | JobState::Pending | JobState::Unspecified => {
            report.notes.push(format!(
                "partial report: the job is {}, {reported} of {} ranks reported",
                state.label(),
                report.world_size
            ));
            if ranks_verdict == Verdict::Fail {
                (Verdict::Fail, ranks_reason)
            } else {
                (
                    Verdict::Incomplete,
                    format!(
                        "job {}; {reported} of {} ranks reported",
                        state.label(),
                        report.world_size
                    ),
                )
            }
        }
    };
    report.verdict = verdict as i32;
    report.reason = reason;
}

/// The verdict of the ranks, the nodes and the job's own findings: fail
/// names the failed ranks, node and device (or the failed node or link);
/// incomplete if any rank has no result; else pass.
pub fn ranks_verdict(report: &Report) -> (Verdict, String) {
    let all: Vec<(&NodeReport, &RankReport)> = report
        .nodes
        .iter()
        .flat_map(|n| n.ranks.iter().map(move |r| (n, r)))
        .collect();
    if all.is_empty() {
        return (Verdict::Incomplete, "no ranks were planned".into());
    }
    let failed: Vec<String> = all
        .iter()
        .filter(|(_, r)| r.verdict() == Verdict::Fail)
        .map(|(n, r)| {
            format!(
                "rank {} on node {} ({}): {}",
                r.rank, n.name, r.device, r.reason
            )
        })
        .collect();
    // A node failed by a GPU that no rank ran on.
    let node_only: Vec<String> = report
        .nodes
        .iter()
        .filter(|n| {
            n.verdict() == Verdict::Fail && n.ranks.iter().all(|r| r.verdict() != Verdict::Fail)
        })
        .map(|n| format!("node {}: {}", n.name, n.reason))
        .collect();
    let job_fails = job_level(report, Verdict::Fail);
    if failed.is_empty() && (!node_only.is_empty() || !job_fails.is_empty()) {
        let mut why = node_only;
        why.extend(job_fails.iter().map(|s| s.to_string()));
        return (Verdict::Fail, why.join("; "));
    }
    if !failed.is_empty() {
        const SHOWN: usize = 5;
        let mut text = failed
            .iter()
            .take(SHOWN)
            .cloned()
            .collect::<Vec<_>>()
            .join("; ");
        if failed.len() > SHOWN {
            text += &format!("; and {} more", failed.len() - SHOWN);
        }
        return (
            Verdict::Fail,
            format!("{} of {} ranks failed: {text}", failed.len(), all.len()),
        );
    }
    let incomplete = all
        .iter()
        .filter(|(_, r)| r.verdict() == Verdict::Incomplete)
        .count();
    if incomplete > 0 {
        return (
            Verdict::Incomplete,
            format!("{incomplete} of {} ranks have no result", all.len()),
        );
    }
    let unreached: Vec<String> = all
        .iter()
        .filter(|(_, r)| is_unreached(r))
        .map(|(n, r)| format!("rank {} on node {} ({})", r.rank, n.name, r.device))
        .collect();
    if !unreached.is_empty() {
        return (
            Verdict::Incomplete,
            format!(
                "{} of {} ranks' results did not reach the coordinator ({}); no node is blamed, and theirs are not judged",
                unreached.len(),
                all.len(),
                gpuctl_core::listing::names(&unreached)
            ),
        );
    }
    (Verdict::Pass, format!("all {} ranks passed", all.len()))
}

/// Whether all the report lacks is results that did not reach the
/// coordinator: some did not, and no rank failed or lacks one otherwise.
fn unreached_only(report: &Report) -> bool {
    let ranks = || report.nodes.iter().flat_map(|n| &n.ranks);
    ranks().any(is_unreached)
        && !ranks().any(|r| matches!(r.verdict(), Verdict::Fail | Verdict::Incomplete))
}

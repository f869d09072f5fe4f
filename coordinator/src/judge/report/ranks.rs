//! Each planned rank's starting verdict, from its own result: pass, fail
//! with the worker's error, or incomplete with why there is no result. The
//! later judges only ever fail a rank further.

use std::collections::BTreeMap;

use gpuctl_proto::pb::{Job, JobState, Plan, RankPlacement, RankResult, Verdict, WorkerExited};

/// A rank's verdict being worked out.
pub(super) struct RankState {
    pub verdict: Verdict,
    pub reasons: Vec<String>,
}

impl RankState {
    pub fn fail(&mut self, why: String) {
        self.verdict = Verdict::Fail;
        self.reasons.push(why);
    }
}

/// Every planned rank's state, by rank.
pub(super) type RankStates = BTreeMap<u32, RankState>;

/// "rank 3 on node agent-1 (cuda:3)", how every failure names a rank.
pub fn rank_label(p: &RankPlacement) -> String {
    format!("rank {} on node {} ({})", p.rank, p.node, p.device)
}

/// How a worker ended, for messages: "exited with code 1: <last stderr line>".
pub fn exit_text(ex: &WorkerExited) -> String {
    let how = if !ex.killed_by.is_empty() {
        format!("was stopped by its agent ({})", ex.killed_by)
    } else if !ex.signal.is_empty() {
        format!("was killed by signal {}", ex.signal)
    } else {
        format!("exited with code {}", ex.exit_code)
    };
    match ex
        .stderr_tail
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
    {
        Some(line) => format!("{how}: {line}"),
        None => how,
    }
}

/// Pass for an ok result, fail for an error result, incomplete without one
/// (why: the worker's exit if one was seen, else the job's state).
pub(super) fn from_results(
    job: &Job,
    plan: &Plan,
    results: &BTreeMap<u32, RankResult>,
    exits: &BTreeMap<u32, WorkerExited>,
) -> RankStates {
    let mut states = RankStates::new();
    for p in &plan.ranks {
        let st = match results.get(&p.rank) {
            Some(r) if r.ok => RankState {
                verdict: Verdict::Pass,
                reasons: vec![],
            },
            Some(r) => RankState {
                verdict: Verdict::Fail,
                reasons: vec![if r.error.is_empty() {
                    "the worker reported a failure".into()
                } else {
                    r.error.clone()
                }],
            },
            None => {
                let why = match exits.get(&p.rank) {
                    Some(ex) => format!("no result: the worker {}", exit_text(ex)),
                    None => match job.state() {
                        JobState::Pending | JobState::Unspecified => "not started".into(),
                        JobState::Running => "running, no result yet".into(),
                        _ if job.message.is_empty() => "no result".into(),
                        _ => format!("no result: {}", job.message),
                    },
                };
                RankState {
                    verdict: Verdict::Incomplete,
                    reasons: vec![why],
                }
            }
        };
        states.insert(p.rank, st);
    }
    states
}

//! Each planned rank's starting verdict, from its own result: pass, fail
//! with the worker's error, or incomplete with why there is no result. The
//! later judges only ever fail a rank further. Where each rank was when
//! the report was made ([`fill_where`]) is shown beside it.

use std::collections::BTreeMap;

use gpuctl_proto::pb::{
    Job, JobState, NodeReport, Plan, RankPlacement, RankProgress, RankReport, RankResult,
    StopReason, Verdict, WorkerExited,
};

use crate::jobs::hang::{Hung, Watch};

/// Where a rank's failure was found: findings of the worker's own result
/// are listed as such; health and performance list their own findings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    Result,
    Health,
    Performance,
}

/// A rank's verdict being worked out.
pub(super) struct RankState {
    pub verdict: Verdict,
    pub reasons: Vec<(Source, String)>,
    /// No result because its agent stopped the worker when the job ended
    /// (a cancel after another rank failed): no fault of this rank's.
    pub stopped: bool,
}

impl RankState {
    fn new(verdict: Verdict, reasons: Vec<(Source, String)>) -> RankState {
        RankState {
            verdict,
            reasons,
            stopped: false,
        }
    }

    pub fn fail(&mut self, why: String) {
        self.fail_from(Source::Result, why);
    }

    pub fn fail_from(&mut self, source: Source, why: String) {
        self.verdict = Verdict::Fail;
        self.reasons.push((source, why));
    }

    /// A warning keeps a failure a failure.
    pub fn warn_from(&mut self, source: Source, why: String) {
        if self.verdict == Verdict::Pass {
            self.verdict = Verdict::Warn;
        }
        self.reasons.push((source, why));
    }

    /// The reasons as the report prints them.
    pub fn reason(&self) -> String {
        self.reasons
            .iter()
            .map(|(_, r)| r.as_str())
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Every planned rank's state, by rank.
pub(super) type RankStates = BTreeMap<u32, RankState>;

/// "rank 3 on node agent-1 (cuda:3)", how every failure names a rank.
pub fn rank_label(p: &RankPlacement) -> String {
    format!("rank {} on node {} ({})", p.rank, p.node, p.device_label())
}

/// How the reason of a rank whose result did not reach the coordinator starts.
const UNREACHED: &str = "unknown: its result did not reach the coordinator";

/// Whether a report's rank is unknown because its result did not reach the
/// coordinator ([`undelivered`]): the one test the node's and the job's
/// verdicts share.
pub(super) fn is_unreached(r: &RankReport) -> bool {
    r.verdict() == Verdict::Unspecified && r.reason.starts_with(UNREACHED)
}

/// Whether a worker ended saying the coordinator did not take its result
/// (`outage::UNDELIVERED_EXIT`, by itself, not stopped): what is known of
/// that rank is then nothing, not a failure.
pub fn undelivered(ex: &WorkerExited) -> bool {
    ex.exit_code == gpuctl_core::retry::outage::UNDELIVERED_EXIT
        && ex.signal.is_empty()
        && ex.stopped_by() == StopReason::Unspecified
}

/// How a worker ended, for messages: "exited with code 1: <last stderr line>".
pub fn exit_text(ex: &WorkerExited) -> String {
    let how = if ex.stopped_by() != StopReason::Unspecified {
        format!("was stopped by its agent ({})", ex.stopped_by().label())
    } else if !ex.signal.is_empty() {
        format!("was killed by signal {}", ex.signal)
    } else {
        format!("exited with code {}", ex.exit_code)
    };
    match last_error_line(&ex.stderr_tail) {
        Some(line) => format!("{how}: {line}"),
        None => how,
    }
}

/// The line of a worker's stderr that says why it ended: the last error
/// line (a log line at ERROR level, a panic, an `error:`), else the last line;
/// an INFO line written after the error would explain nothing.
fn last_error_line(stderr: &str) -> Option<&str> {
    let lines = || {
        stderr
            .lines()
            .rev()
            .map(str::trim)
            .filter(|l| !l.is_empty())
    };
    let is_error = |l: &&str| {
        l.contains(" ERROR ")
            || l.starts_with("ERROR")
            || l.contains("panicked at")
            || l.to_ascii_lowercase().starts_with("error")
    };
    lines().find(is_error).or_else(|| lines().next())
}

/// Pass for an ok result, fail for an error result, incomplete without one
/// (why: the worker's exit if one was seen, else the job's state), unknown
/// (unspecified) when its worker said the coordinator did not take it. When the
/// job hung, the blamed rank fails and the others without a result were only
/// stopped. In a job that failed for its request (`request`) nothing a rank
/// did is its own: a rank without an ok result is not judged (unspecified),
/// whatever it said (a peer's error once the one that found the request
/// left, a stop).
pub(super) fn from_results(
    job: &Job,
    plan: &Plan,
    results: &BTreeMap<u32, RankResult>,
    exits: &BTreeMap<u32, WorkerExited>,
    hung: &Option<Hung>,
    request: bool,
) -> RankStates {
    // Collected, not inserted one by one: a map made from the plan's ranks
    // in order is built in one pass.
    let state = |p: &RankPlacement| {
        let st = match results.get(&p.rank) {
            Some(r) if r.ok => RankState::new(Verdict::Pass, vec![]),
            Some(r) if request => {
                let why = gpuctl_core::request::of_rank(&r.error).unwrap_or(&r.error);
                RankState::new(
                    Verdict::Unspecified,
                    vec![(Source::Result, format!("not judged: {why}"))],
                )
            }
            None if request => RankState::new(
                Verdict::Unspecified,
                vec![(
                    Source::Result,
                    "not judged: no result, the job's request could not run".into(),
                )],
            ),
            Some(r) => RankState::new(
                Verdict::Fail,
                vec![(
                    Source::Result,
                    if r.error.is_empty() {
                        "the worker reported a failure".into()
                    } else {
                        r.error.clone()
                    },
                )],
            ),
            None if hung.as_ref().is_some_and(|h| h.rank == Some(p.rank)) => RankState::new(
                Verdict::Fail,
                vec![(
                    Source::Result,
                    hung.as_ref().map(|h| h.why.clone()).unwrap_or_default(),
                )],
            ),
            None if exits.get(&p.rank).is_some_and(undelivered) => RankState::new(
                Verdict::Unspecified,
                vec![(
                    Source::Result,
                    format!(
                        "{UNREACHED} (the worker gave up after its wait; its node is not judged)"
                    ),
                )],
            ),
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
                let mut st = RankState::new(Verdict::Incomplete, vec![(Source::Result, why)]);
                // Stopped because of another rank, when a rank was blamed; a
                // hang that blames nobody leaves every rank undecided.
                st.stopped = hung.as_ref().is_some_and(|h| h.rank.is_some())
                    || exits
                        .get(&p.rank)
                        .is_some_and(|ex| ex.stopped_by().by_coordinator());
                st
            }
        };
        (p.rank, st)
    };
    plan.ranks.iter().map(state).collect()
}

/// Where each rank was when the report was made: last phase, iterations,
/// last progress and process state.
pub(super) fn fill_where(
    nodes: &mut [NodeReport],
    progress: &BTreeMap<u32, RankProgress>,
    watch: &Watch,
) {
    for r in nodes.iter_mut().flat_map(|n| n.ranks.iter_mut()) {
        if let Some(p) = progress.get(&r.rank) {
            r.last_phase = if p.waiting_for.is_empty() {
                p.phase.clone()
            } else {
                format!("{} (waiting for `{}`)", p.phase, p.waiting_for)
            };
            r.iterations = p.iterations;
        }
        r.last_progress_unix_ms = watch.grew_ms.get(&r.rank).copied().unwrap_or(0);
        if let Some(p) = watch.processes.get(&r.rank) {
            r.process_state = p.state_name.clone();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_line_wins_over_later_info_lines() {
        let tail = "2026-11-22T10:00:00Z  INFO worker starting\n\
                    2026-11-22T10:00:01Z ERROR node n1 rank 3: NCCL error: unhandled system error\n\
                    2026-11-22T10:00:01Z  INFO progress reporter stopped\n";
        assert_eq!(
            last_error_line(tail),
            Some("2026-11-22T10:00:01Z ERROR node n1 rank 3: NCCL error: unhandled system error")
        );
        assert_eq!(last_error_line("a\nb\n\n"), Some("b"));
        assert_eq!(last_error_line(""), None);
    }
}

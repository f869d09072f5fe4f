//! A node's life as a pure state machine: [`transition`] takes what the
//! coordinator knows of a node ([`Life`]), one [`NodeEvent`] and the time,
//! and gives the node's next [`Life`] and the [`Effects`] the scheduler must
//! carry out (store the node, close its session, fail the job it ran). No
//! I/O and no clock of its own, so tests drive it with events and numbers.
//! This is the one place a node's state changes.
//!
//! ```text
//!            Registered / SessionOpened / Heard (job "")
//!   stored ──────────────────────────────────────────► Ready ◄──JobSet("")──┐
//!     │                                                  │ JobSet(job)      │
//!     │ Restarted                                        ▼                  │
//!     │                                                Busy ────────────────┘
//!     ▼            Tick past the node timeout            │
//!   Lost ◄───────────────────────────────────────────────┴── (from Ready too)
//!     │  SessionOpened / Heard: Ready, or Busy while it is still part of a job
//!     └──────────────────────────────────────────────────► Ready | Busy
//! ```
//!
//! Lost by silence gives up the node's job (the job fails, naming the node);
//! lost by a coordinator restart keeps it, so that the agent can hand its
//! workers back when it registers again.

use std::borrow::Cow;
use std::time::Duration;

use gpuctl_proto::pb::NodeState;

/// What the machine reads and writes of a node (the rest of `Node` is its
/// registration, which no event changes). Its words are borrowed from the
/// node until a transition changes them: every node's heartbeat and the
/// scheduler's tick over the whole fleet pass through here, and copying
/// them each time (4 strings an event) was two fifths of its samples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Life<'a> {
    pub state: NodeState,
    /// Why it is in that state, for `gpuctl nodes` (empty when Ready or Busy).
    pub reason: Cow<'a, str>,
    /// The job the node is part of; empty when none.
    pub job: Cow<'a, str>,
    pub heard_unix_ms: u64,
}

/// What happened to a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeEvent<'a> {
    /// Its agent registered; `job` is the job it is still part of (adopted,
    /// or kept because its ranks delivered), empty when none.
    Registered { job: &'a str },
    /// Its agent opened a session; `heard_unix_ms` is the first heartbeat's
    /// time, never taken as earlier than now.
    SessionOpened { heard_unix_ms: u64 },
    /// A heartbeat on its current session.
    Heard,
    /// A job started on it, or the job it ran ended (`""`).
    JobSet { job: &'a str },
    /// The scheduler's periodic look: a node silent for longer than
    /// `timeout` is lost.
    Tick { timeout: Duration },
    /// This coordinator started and loaded the node from the store, where
    /// `job` was running on it.
    Restarted { job: &'a str },
}

/// What the scheduler must do after a transition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Effects {
    /// Store the node (its state or reason changed in a way a restarted
    /// coordinator or a standby must see).
    pub save: bool,
    /// Drop the node's session: it is lost, and a later session opens anew.
    pub close_session: bool,
    /// Fail this job, naming the node, with this message.
    pub fail_job: Option<(String, String)>,
    /// Say this in the log, at warn level when the node was lost.
    pub log: Option<String>,
}

/// Ready or Busy by whether the node is part of a job.
fn working(job: &str) -> NodeState {
    if job.is_empty() {
        NodeState::Ready
    } else {
        NodeState::Busy
    }
}

/// The node's next life after `event` at `now` (Unix ms), and what to do.
pub fn transition<'a>(life: &Life<'a>, event: NodeEvent<'a>, now: u64) -> (Life<'a>, Effects) {
    let mut next = life.clone();
    let mut fx = Effects::default();
    let lost = life.state == NodeState::Lost;
    match event {
        NodeEvent::Registered { job } => {
            next = Life {
                state: working(job),
                reason: Cow::Borrowed(""),
                job: Cow::Borrowed(job),
                heard_unix_ms: now,
            };
            fx.save = true;
        }
        NodeEvent::SessionOpened { heard_unix_ms } => {
            next.heard_unix_ms = heard_unix_ms.max(now);
            if lost {
                next.state = working(&life.job);
                next.reason = Cow::Borrowed("");
                fx.save = true;
            }
        }
        NodeEvent::Heard => {
            next.heard_unix_ms = now;
            if lost {
                next.state = working(&life.job);
                next.reason = Cow::Borrowed("");
                fx.save = true;
                fx.log = Some("heartbeats resumed".into());
            }
        }
        NodeEvent::JobSet { job } => {
            next.job = Cow::Borrowed(job);
            if !lost {
                next.state = working(job);
            }
        }
        NodeEvent::Tick { timeout } => {
            if !lost && now.saturating_sub(life.heard_unix_ms) > timeout.as_millis() as u64 {
                let why = format!("no heartbeat for {}", humantime::format_duration(timeout));
                next.state = NodeState::Lost;
                next.reason = Cow::Owned(why.clone());
                next.job = Cow::Borrowed("");
                fx.save = true;
                fx.close_session = true;
                fx.log = Some(format!("node lost: {why}"));
                if !life.job.is_empty() {
                    fx.fail_job = Some((life.job.to_string(), why));
                }
            }
        }
        NodeEvent::Restarted { job } => {
            next.state = NodeState::Lost;
            next.reason = "coordinator restarted; waiting for the agent to register again".into();
            next.job = Cow::Borrowed(job);
            fx.save = true;
        }
    }
    (next, fx)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_700_000_000_000;
    const TIMEOUT: Duration = Duration::from_secs(30);

    fn life(state: NodeState, job: &str, heard: u64) -> Life<'_> {
        Life {
            state,
            reason: Cow::Borrowed(""),
            job: job.into(),
            heard_unix_ms: heard,
        }
    }

    #[test]
    fn a_registration_makes_a_node_ready_or_busy_with_the_job_it_kept() {
        let stored = transition(
            &life(NodeState::Lost, "job-1", 0),
            NodeEvent::Restarted { job: "job-1" },
            T0,
        )
        .0;
        let (fresh, fx) = transition(&stored, NodeEvent::Registered { job: "" }, T0 + 5);
        assert_eq!(
            (fresh.state, fresh.job.as_ref(), fresh.heard_unix_ms),
            (NodeState::Ready, "", T0 + 5)
        );
        assert!(fx.save && fresh.reason.is_empty());
        let (adopting, _) = transition(&stored, NodeEvent::Registered { job: "job-1" }, T0 + 5);
        assert_eq!(
            (adopting.state, adopting.job.as_ref()),
            (NodeState::Busy, "job-1")
        );
    }

    #[test]
    fn silence_past_the_timeout_loses_the_node_and_fails_its_job_and_only_then() {
        let busy = life(NodeState::Busy, "job-7", T0);
        let (same, fx) = transition(&busy, NodeEvent::Tick { timeout: TIMEOUT }, T0 + 30_000);
        assert_eq!(
            (same, fx),
            (busy.clone(), Effects::default()),
            "at the timeout, not past it"
        );
        let (lost, fx) = transition(&busy, NodeEvent::Tick { timeout: TIMEOUT }, T0 + 30_001);
        assert_eq!((lost.state, lost.job.as_ref()), (NodeState::Lost, ""));
        assert_eq!(lost.reason, "no heartbeat for 30s");
        assert!(fx.save && fx.close_session);
        assert_eq!(
            fx.fail_job,
            Some(("job-7".into(), "no heartbeat for 30s".into()))
        );
        // Lost stays lost, and says nothing again.
        let (again, fx) = transition(&lost, NodeEvent::Tick { timeout: TIMEOUT }, T0 + 90_000);
        assert_eq!((again, fx), (lost, Effects::default()));
        let idle = life(NodeState::Ready, "", T0);
        let (lost, fx) = transition(&idle, NodeEvent::Tick { timeout: TIMEOUT }, T0 + 60_000);
        assert_eq!((lost.state, fx.fail_job), (NodeState::Lost, None));
    }

    #[test]
    fn a_lost_node_comes_back_by_a_session_or_a_heartbeat() {
        let lost = transition(
            &life(NodeState::Ready, "", T0),
            NodeEvent::Restarted { job: "job-2" },
            T0,
        )
        .0;
        assert_eq!((lost.state, lost.job.as_ref()), (NodeState::Lost, "job-2"));
        let (back, fx) = transition(&lost, NodeEvent::Heard, T0 + 10);
        assert_eq!(
            (back.state, back.reason.as_ref(), back.heard_unix_ms),
            (NodeState::Busy, "", T0 + 10)
        );
        assert!(fx.save && fx.log.is_some());
        // A session's first heartbeat never moves the node's clock back.
        let (back, fx) = transition(
            &lost,
            NodeEvent::SessionOpened {
                heard_unix_ms: T0 - 5_000,
            },
            T0 + 20,
        );
        assert_eq!((back.state, back.heard_unix_ms), (NodeState::Busy, T0 + 20));
        assert!(fx.save);
        // A live node's heartbeat is not a store write.
        let ready = life(NodeState::Ready, "", T0);
        let (heard, fx) = transition(&ready, NodeEvent::Heard, T0 + 1_000);
        assert_eq!(
            (heard.state, heard.heard_unix_ms, fx),
            (NodeState::Ready, T0 + 1_000, Effects::default())
        );
    }

    #[test]
    fn jobs_make_a_live_node_busy_and_leave_a_lost_one_lost() {
        let ready = life(NodeState::Ready, "", T0);
        let (busy, fx) = transition(&ready, NodeEvent::JobSet { job: "job-3" }, T0);
        assert_eq!(
            (busy.state, busy.job.as_ref(), fx.save),
            (NodeState::Busy, "job-3", false)
        );
        let (done, _) = transition(&busy, NodeEvent::JobSet { job: "" }, T0);
        assert_eq!(done.state, NodeState::Ready);
        let lost = life(NodeState::Lost, "job-3", T0);
        let (still, _) = transition(&lost, NodeEvent::JobSet { job: "" }, T0);
        assert_eq!((still.state, still.job.as_ref()), (NodeState::Lost, ""));
    }
}

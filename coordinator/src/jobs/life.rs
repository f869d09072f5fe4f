//! A job's life as a pure state machine: which step may move a job from
//! which state, in one place. The scheduler asks [`transition`] before it
//! changes a job's state and applies what it answers; a step that may not
//! happen is answered with why, and changes nothing.
//!
//! ```text
//!   Pending ──Start──► Running ──End(state)──► Succeeded | Failed | Cancelled
//!      │                  │ every rank reported: judging (the verdict is being
//!      │                  │ made off the task); only the verdict's End ends it
//!      └──End(Failed | Cancelled: refused at start, cancelled while queued)──►
//! ```
//!
//! Ended is final: a late End (a node lost after the job failed, a deadline
//! after a cancel) is ignored.

use gpuctl_proto::pb::JobState;

/// What is asked of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobStep {
    /// Its nodes are chosen and its assignments go out.
    Start,
    /// It ends as `state` (Succeeded, Failed or Cancelled); `verdict` when
    /// the step is the judged verdict of a job whose every rank reported.
    End { state: JobState, verdict: bool },
}

/// What the scheduler knows of a job that the machine reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobLife {
    pub state: JobState,
    /// Every rank reported and the verdict is being made off the task.
    pub judging: bool,
}

/// Whether `step` may happen to a job in `life`: its next state, or why not.
pub fn transition(life: JobLife, step: JobStep) -> Result<JobState, &'static str> {
    if life.state.is_terminal() {
        return Err("the job has ended already");
    }
    match step {
        JobStep::Start if life.state == JobState::Pending => Ok(JobState::Running),
        JobStep::Start => Err("only a pending job starts"),
        JobStep::End { state, .. } if !state.is_terminal() => {
            Err("a job ends as succeeded, failed or cancelled")
        }
        JobStep::End { verdict: false, .. } if life.judging => {
            Err("every rank reported and its verdict is being made; it decides")
        }
        JobStep::End {
            state: JobState::Succeeded,
            ..
        } if life.state != JobState::Running => Err("only a running job succeeds"),
        JobStep::End { state, .. } => Ok(state),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn life(state: JobState, judging: bool) -> JobLife {
        JobLife { state, judging }
    }

    fn end(state: JobState) -> JobStep {
        JobStep::End {
            state,
            verdict: false,
        }
    }

    #[test]
    fn a_pending_job_starts_and_a_running_one_ends() {
        let pending = life(JobState::Pending, false);
        assert_eq!(transition(pending, JobStep::Start), Ok(JobState::Running));
        assert_eq!(
            transition(pending, end(JobState::Cancelled)),
            Ok(JobState::Cancelled)
        );
        assert!(
            transition(pending, end(JobState::Succeeded)).is_err(),
            "nothing ran"
        );
        let running = life(JobState::Running, false);
        assert!(transition(running, JobStep::Start).is_err());
        for s in [JobState::Succeeded, JobState::Failed, JobState::Cancelled] {
            assert_eq!(transition(running, end(s)), Ok(s));
        }
        assert!(transition(running, end(JobState::Pending)).is_err());
    }

    #[test]
    fn ended_is_final_and_a_verdict_being_made_decides() {
        for s in [JobState::Succeeded, JobState::Failed, JobState::Cancelled] {
            assert!(transition(life(s, false), end(JobState::Failed)).is_err());
            assert!(transition(life(s, false), JobStep::Start).is_err());
        }
        let judging = life(JobState::Running, true);
        assert!(
            transition(judging, end(JobState::Failed)).is_err(),
            "a node lost meanwhile"
        );
        let verdict = JobStep::End {
            state: JobState::Succeeded,
            verdict: true,
        };
        assert_eq!(transition(judging, verdict), Ok(JobState::Succeeded));
    }
}

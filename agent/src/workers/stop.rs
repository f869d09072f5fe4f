//! Stopping workers: one job's on `CancelJob` (or a failed start), or every
//! worker when the coordinator is lost or the agent shuts down, then waiting
//! until all have been reaped.
//!
//! Its own file because stopping only sets the job's kill order in the table
//! and counts supervisors down; the killing itself (SIGTERM, the grace,
//! SIGKILL) is each supervisor's, so this never touches a process.

use std::time::Duration;

use super::{StopReason, Workers};

impl Workers {
    /// Asks every worker of the job (any attempt when `attempt` is 0) to die.
    /// Returns whether there was such a job.
    pub fn cancel(&self, job_id: &str, attempt: u32, reason: StopReason) -> bool {
        self.jobs.kill(job_id, attempt, reason)
    }

    /// Asks every worker to die, then waits (up to `timeout`) until all have
    /// been reaped and their `WorkerExited` queued. Returns false on timeout.
    pub async fn kill_all_and_wait(&self, reason: StopReason, timeout: Duration) -> bool {
        let n = self.jobs.kill_all(reason);
        if n > 0 {
            tracing::warn!(jobs = n, reason = reason.label(), "killing all workers");
        }
        if reason == StopReason::AgentShutdown {
            self.prestarted.close().await;
        }
        let mut live = self.live.subscribe();
        let ok = tokio::time::timeout(timeout, live.wait_for(|n| *n == 0))
            .await
            .is_ok();
        if !ok {
            tracing::error!(
                reason = reason.label(),
                "workers still alive after {timeout:?}"
            );
        }
        ok
    }

    /// Number of worker processes being supervised.
    pub fn live_workers(&self) -> usize {
        *self.live.borrow()
    }
}

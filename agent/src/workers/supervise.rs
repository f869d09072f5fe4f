//! Supervising one worker from spawn to `WorkerExited`: its output forwarded
//! as log batches, its end awaited, or its process group killed on the job's
//! kill order or at the deadline, then its exit reported (with the OOM
//! killer's part, if any).
//!
//! Its own file because this is the one long-lived task per rank; starting
//! (start.rs) only hands it a child, and stopping (stop.rs) only sets the
//! order it waits on.

use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;

use gpuctl_proto::pb::{agent_message::Msg, WorkerExited, WorkerLog};
use tokio::process::Child;
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep_until, Instant};

use super::jobs::JobKey;
use super::logs::{batch_logs, read_lines};
use super::{kill_group, oom, signal_group, signal_name, StopReason, Workers};

impl Workers {
    /// Watches one worker from spawn to `WorkerExited`.
    pub(super) async fn supervise(
        self: Arc<Self>,
        key: JobKey,
        rank: u32,
        mut child: Child,
        mut kill_rx: watch::Receiver<Option<StopReason>>,
        deadline: Option<Instant>,
    ) {
        let pgid = child.id().unwrap_or(0) as i32;
        let oom = oom::OomWatch::start(child.id());
        let (line_tx, line_rx) = mpsc::channel(1024);
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            readers.push(tokio::spawn(read_lines(out, false, line_tx.clone())));
        }
        if let Some(err) = child.stderr.take() {
            readers.push(tokio::spawn(read_lines(err, true, line_tx.clone())));
        }
        drop(line_tx);
        let log = WorkerLog {
            job_id: key.0.clone(),
            attempt: key.1,
            rank,
            lines: Vec::new(),
        };
        let batcher = tokio::spawn(batch_logs(line_rx, log, self.events.clone()));

        let grace = self.settings.kill_grace;
        let deadline_passed = async {
            match deadline {
                Some(d) => sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let (status, killed) = tokio::select! {
            s = child.wait() => {
                // The worker ended by itself: anything it left in its group is an orphan.
                signal_group(pgid, libc::SIGKILL);
                (s, StopReason::Unspecified)
            }
            reason = wait_kill(&mut kill_rx) => (kill_group(pgid, &mut child, grace).await, reason),
            _ = deadline_passed => (kill_group(pgid, &mut child, grace).await, StopReason::Deadline),
        };

        // The pipes close when every process of the group is gone; something
        // that escaped the group could hold them open, so do not wait forever.
        let mut tail_wait = std::pin::pin!(tokio::time::sleep(grace));
        for r in &mut readers {
            tokio::select! {
                _ = &mut *r => {}
                _ = &mut tail_wait => {}
            }
        }
        for r in &readers {
            r.abort();
        }
        let mut tail = batcher.await.unwrap_or_default();

        let (exit_code, signal) = match &status {
            Ok(s) => match (s.code(), s.signal()) {
                (Some(c), _) => (c, String::new()),
                (None, Some(sig)) => (-1, signal_name(sig)),
                (None, None) => (-1, String::new()),
            },
            Err(e) => {
                tracing::error!(rank, error = %e, "cannot wait for worker");
                (-1, String::new())
            }
        };
        tail.extend(oom.verdict(&signal, killed));
        tracing::info!(job = %key.0, attempt = key.1, rank, exit_code, signal = %signal, stopped_by = killed.label(), "worker exited");
        self.events.send(Msg::WorkerExited(WorkerExited {
            job_id: key.0.clone(),
            attempt: key.1,
            rank,
            exit_code,
            signal,
            stderr_tail: tail.join("\n"),
            stopped_by: killed as i32,
        }));
        self.jobs.rank_done(&key, rank);
        self.live.send_modify(|n| *n -= 1);
        // The slot is free: its prestarted worker comes back.
        if self.prestarted.enabled() {
            self.prestarted.refill(self.jobs.busy_slots());
        }
    }
}

async fn wait_kill(rx: &mut watch::Receiver<Option<StopReason>>) -> StopReason {
    loop {
        if let Some(r) = *rx.borrow_and_update() {
            return r;
        }
        if rx.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

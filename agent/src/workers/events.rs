//! The queue of messages from the workers to the coordinator: exits, log
//! batches and telemetry, sent by the session in order. Exits are never
//! dropped; logs and telemetry are capped so that a coordinator that does
//! not keep up cannot grow the agent's memory.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use gpuctl_proto::pb::{agent_message::Msg, AgentMessage, TelemetryBatch, WorkerLog};
use tokio::sync::mpsc;

/// Log lines waiting for the session to send them; beyond this, lines are
/// dropped (and the drop is said in the log) rather than held in memory.
const MAX_QUEUED_LOG_LINES: usize = 100_000;
/// Telemetry batches waiting for the session; beyond this, new batches are
/// dropped (telemetry is a stream of snapshots: losing some is harmless).
const MAX_QUEUED_TELEMETRY: usize = 64;

/// A connected sender and receiver.
pub(super) fn channel() -> (EventSender, EventReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let queued_log_lines = Arc::new(AtomicUsize::new(0));
    let queued_telemetry = Arc::new(AtomicUsize::new(0));
    (
        EventSender {
            tx,
            queued_log_lines: queued_log_lines.clone(),
            queued_telemetry: queued_telemetry.clone(),
        },
        EventReceiver {
            rx,
            queued_log_lines,
            queued_telemetry,
        },
    )
}

/// The workers' side of the queue of messages for the coordinator. Unbounded
/// so that a worker's exit is never lost or blocked behind a slow session;
/// log lines are counted and capped instead.
#[derive(Clone)]
pub(crate) struct EventSender {
    tx: mpsc::UnboundedSender<AgentMessage>,
    queued_log_lines: Arc<AtomicUsize>,
    queued_telemetry: Arc<AtomicUsize>,
}

impl EventSender {
    pub(super) fn send(&self, msg: Msg) {
        // The receiver lives as long as the agent; a send error means it is
        // shutting down and the message has nowhere to go.
        let _ = self.tx.send(AgentMessage { msg: Some(msg) });
    }

    /// Sends a batch unless too many lines are already waiting; `dropped`
    /// carries the count of lost lines into the next batch that goes out.
    pub(super) fn send_log(&self, mut log: WorkerLog, dropped: &mut usize) {
        let n = log.lines.len();
        if self.queued_log_lines.load(Ordering::Relaxed) + n > MAX_QUEUED_LOG_LINES {
            *dropped += n;
            return;
        }
        if *dropped > 0 {
            log.lines.insert(
                0,
                format!("[gpuctl-agent: {dropped} log lines dropped: the coordinator is not keeping up]"),
            );
            *dropped = 0;
        }
        self.queued_log_lines
            .fetch_add(log.lines.len(), Ordering::Relaxed);
        self.send(Msg::Log(log));
    }

    /// Sends a telemetry batch unless too many are already waiting; returns
    /// whether it was queued.
    pub(super) fn send_telemetry(&self, batch: TelemetryBatch) -> bool {
        if self.queued_telemetry.load(Ordering::Relaxed) >= MAX_QUEUED_TELEMETRY {
            return false;
        }
        self.queued_telemetry.fetch_add(1, Ordering::Relaxed);
        self.send(Msg::Telemetry(batch));
        true
    }
}

/// The session's side: every message the workers want sent, in order.
pub struct EventReceiver {
    rx: mpsc::UnboundedReceiver<AgentMessage>,
    queued_log_lines: Arc<AtomicUsize>,
    queued_telemetry: Arc<AtomicUsize>,
}

impl EventReceiver {
    pub async fn recv(&mut self) -> Option<AgentMessage> {
        let m = self.rx.recv().await?;
        self.account(&m);
        Some(m)
    }

    pub fn try_recv(&mut self) -> Option<AgentMessage> {
        let m = self.rx.try_recv().ok()?;
        self.account(&m);
        Some(m)
    }

    fn account(&self, m: &AgentMessage) {
        match &m.msg {
            Some(Msg::Log(l)) => {
                self.queued_log_lines
                    .fetch_sub(l.lines.len(), Ordering::Relaxed);
            }
            Some(Msg::Telemetry(_)) => {
                self.queued_telemetry.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }
}

//! What a simulated agent sends unasked, as `gpuctl-agent` does: heartbeats
//! listing the ranks running here, and telemetry batches per job, both at
//! the coordinator's pace. Apart from the session's loop (`mod.rs`) because
//! these run as tasks of their own for the agent's life.

use std::collections::HashMap;
use std::sync::Arc;

use gpuctl_proto::pb::{agent_message::Msg, AgentMessage, Heartbeat, RunningJob, TelemetryBatch};
use gpuctl_proto::PROTOCOL_VERSION;
use tokio::sync::mpsc;

use super::{Agent, Running, HEARTBEAT};
use crate::host;

impl Agent {
    /// A heartbeat listing the ranks running here.
    pub(super) fn heartbeat(&self, running: Vec<RunningJob>) -> AgentMessage {
        AgentMessage {
            msg: Some(Msg::Heartbeat(Heartbeat {
                node: self.name.clone(),
                protocol_version: PROTOCOL_VERSION,
                unix_ms: self.clock.now_ms(),
                running,
                preflight: vec![],
            })),
        }
    }

    pub(super) async fn heartbeats(
        self: Arc<Self>,
        tx: mpsc::Sender<AgentMessage>,
        running: Running,
    ) {
        loop {
            // A new pace is heard at the next beat.
            tokio::select! {
                _ = tokio::time::sleep(self.pace.heartbeat(HEARTBEAT)) => {}
                _ = self.shutdown.cancelled() => return,
            }
            let jobs: Vec<RunningJob> = running.lock().unwrap().values().cloned().collect();
            // Dropped while no session takes them: the next one is newer.
            if let Err(mpsc::error::TrySendError::Closed(_)) = tx.try_send(self.heartbeat(jobs)) {
                return;
            }
        }
    }

    /// A sample per GPU of each running job every interval, sent a batch
    /// per job at the coordinator's pace, and at once when the job ends
    /// here: as `gpuctl-agent`'s held telemetry. Samples are made when sent,
    /// stamped with the intervals they stand for.
    pub(super) async fn telemetry(
        self: Arc<Self>,
        tx: mpsc::Sender<AgentMessage>,
        running: Running,
    ) {
        let mut tick = tokio::time::interval(self.cfg.interval);
        let mut rng = fastrand::Rng::with_seed(self.index as u64);
        let step = self.cfg.interval.as_millis().max(1) as u64;
        // Per job and attempt: its GPUs, and the last interval sent.
        let mut sent: HashMap<(String, u32), (usize, u64)> = HashMap::new();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.shutdown.cancelled() => return,
            }
            let now = self.clock.now_ms();
            let every = self.pace.telemetry_send().as_millis() as u64;
            let live: Vec<((String, u32), usize)> = running
                .lock()
                .unwrap()
                .values()
                .map(|j| ((j.job_id.clone(), j.attempt), j.ranks.len()))
                .collect();
            for (key, gpus) in &live {
                sent.entry(key.clone())
                    .or_insert((*gpus, now.saturating_sub(step)));
            }
            let mut due = Vec::new();
            sent.retain(|key, (gpus, last)| {
                let ended = !live.iter().any(|(k, _)| k == key);
                if ended || now.saturating_sub(*last) >= every.max(step) {
                    due.push((key.clone(), *gpus, *last));
                    *last = now;
                }
                !ended
            });
            for ((job_id, attempt), gpus, last) in due {
                let mut samples = Vec::new();
                let mut t = last + step;
                while t <= now {
                    for g in 0..gpus as u32 {
                        samples.push(host::busy_sample(self.index, g, t, &mut rng));
                    }
                    t += step;
                }
                if samples.is_empty() {
                    continue;
                }
                let batch = TelemetryBatch {
                    node: self.name.clone(),
                    job_id,
                    attempt,
                    samples,
                };
                // In parts, as gpuctl-agent sends them.
                for part in gpuctl_core::telemetry_parts::parts(batch) {
                    let msg = AgentMessage {
                        msg: Some(Msg::Telemetry(part)),
                    };
                    if let Err(mpsc::error::TrySendError::Closed(_)) = tx.try_send(msg) {
                        return;
                    }
                }
            }
        }
    }
}

//! Worker log storage. A task of its own so that a burst of log lines (each batch
//! a durable write) never delays heartbeats or results in the scheduler; it
//! folds whatever is queued into one store transaction.

use std::collections::HashMap;

use gpuctl_proto::pb::LogLine;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::store::StateStore;

/// Most batches written in one transaction.
const MAX_BATCHES_PER_WRITE: usize = 512;

pub struct LogBatch {
    pub job_id: String,
    pub rank: u32,
    pub node: String,
    pub lines: Vec<String>,
}

#[derive(Clone)]
pub struct LogSink {
    tx: mpsc::UnboundedSender<LogBatch>,
}

impl LogSink {
    /// Starts the writer; it drains and ends once every sink is dropped.
    pub fn spawn(store: StateStore) -> (LogSink, JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (LogSink { tx }, tokio::spawn(run(store, rx)))
    }

    pub fn send(&self, batch: LogBatch) {
        if self.tx.send(batch).is_err() {
            tracing::warn!("log writer has stopped; dropping worker log lines");
        }
    }
}

async fn run(store: StateStore, mut rx: mpsc::UnboundedReceiver<LogBatch>) {
    let mut next_seq: HashMap<(String, u32), u64> = HashMap::new();
    while let Some(first) = rx.recv().await {
        let mut queued = vec![first];
        while queued.len() < MAX_BATCHES_PER_WRITE {
            match rx.try_recv() {
                Ok(b) => queued.push(b),
                Err(_) => break,
            }
        }
        let mut writes = Vec::with_capacity(queued.len());
        for b in queued {
            let key = (b.job_id.clone(), b.rank);
            let seq = match next_seq.get(&key) {
                Some(s) => *s,
                // Continue after what an earlier coordinator run stored.
                None => match store.last_log_seq(&b.job_id, b.rank).await {
                    Ok(last) => last.map_or(1, |s| s + 1),
                    Err(e) => {
                        tracing::warn!(job = %b.job_id, rank = b.rank, "reading log sequence: {e}");
                        1
                    }
                },
            };
            next_seq.insert(key, seq + 1);
            let lines = b
                .lines
                .into_iter()
                .map(|line| LogLine {
                    rank: b.rank,
                    node: b.node.clone(),
                    line,
                })
                .collect();
            writes.push((b.job_id, b.rank, seq, lines));
        }
        if let Err(e) = store.put_logs(writes).await {
            tracing::warn!("storing worker logs: {e}");
        }
    }
}

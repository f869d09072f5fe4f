//! Worker log storage. A task of its own so that a burst of log lines (each batch
//! a durable write) never delays heartbeats or results in the scheduler; it
//! folds whatever is queued into one store transaction.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use gpuctl_proto::pb::LogLine;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::store::StateStore;

/// Most batches written in one transaction.
const MAX_BATCHES_PER_WRITE: usize = 512;

/// A job whose ranks sent no lines for this long has its sequence counters
/// dropped; a line that comes later reads the last stored sequence again.
/// Without it the counters grew by one per rank of every job for the
/// coordinator's life (32,768 a job at 4,096 nodes × 8 GPUs).
const IDLE_COUNTERS: Duration = Duration::from_secs(60);

pub struct LogBatch {
    pub job_id: String,
    pub rank: u32,
    pub node: String,
    pub lines: Vec<String>,
}

enum Msg {
    Lines(LogBatch),
    /// Answered once every batch queued before it is stored, and the job's
    /// counters dropped: its logs may then be deleted without a batch
    /// written after them.
    Forget(String, oneshot::Sender<()>),
    /// Answered once every batch queued before it is stored.
    Stored(oneshot::Sender<()>),
}

#[derive(Clone)]
pub struct LogSink {
    tx: mpsc::UnboundedSender<Msg>,
}

impl LogSink {
    /// Starts the writer; it drains and ends once every sink is dropped.
    pub fn spawn(store: StateStore) -> (LogSink, JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (LogSink { tx }, tokio::spawn(run(store, rx)))
    }

    pub fn send(&self, batch: LogBatch) {
        if self.tx.send(Msg::Lines(batch)).is_err() {
            tracing::warn!("log writer has stopped; dropping worker log lines");
        }
    }

    /// Resolves once the lines of `job` sent so far are stored and the
    /// writer holds nothing of it (or the writer has stopped). For a job
    /// being deleted: the caller sends no more of its lines.
    pub fn forget(&self, job: &str) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        let _ = self.tx.send(Msg::Forget(job.to_string(), tx));
        rx
    }

    /// Resolves once the lines sent so far are stored (or the writer has
    /// stopped): a read after it has them.
    pub fn stored(&self) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        let _ = self.tx.send(Msg::Stored(tx));
        rx
    }
}

/// The next sequence number of each rank's lines, by job, with when the
/// job last had lines.
#[derive(Default)]
struct Counters {
    jobs: HashMap<String, (HashMap<u32, u64>, Instant)>,
    swept: Option<Instant>,
}

impl Counters {
    fn get(&mut self, job: &str, rank: u32, now: Instant) -> Option<u64> {
        let (ranks, used) = self.jobs.get_mut(job)?;
        *used = now;
        ranks.get(&rank).copied()
    }

    fn set(&mut self, job: &str, rank: u32, next: u64, now: Instant) {
        if !self.jobs.contains_key(job) {
            self.jobs.insert(job.to_string(), (HashMap::new(), now));
        }
        let (ranks, used) = self.jobs.get_mut(job).expect("inserted above");
        ranks.insert(rank, next);
        *used = now;
    }

    /// Drops the counters of jobs idle for [`IDLE_COUNTERS`], looking at
    /// most once a tenth of that.
    fn sweep(&mut self, now: Instant) {
        if self.swept.is_some_and(|t| now < t + IDLE_COUNTERS / 10) {
            return;
        }
        self.swept = Some(now);
        self.jobs.retain(|_, (_, used)| now < *used + IDLE_COUNTERS);
    }
}

async fn run(store: StateStore, mut rx: mpsc::UnboundedReceiver<Msg>) {
    let mut counters = Counters::default();
    while let Some(first) = rx.recv().await {
        let mut queued = Vec::new();
        let mut answers = Vec::new();
        let mut next = Some(first);
        while let Some(m) = next.take() {
            match m {
                Msg::Lines(b) => queued.push(b),
                // Answered after this round's write, which holds every
                // batch queued before it.
                Msg::Forget(job, done) => answers.push((Some(job), done)),
                Msg::Stored(done) => answers.push((None, done)),
            }
            if queued.len() < MAX_BATCHES_PER_WRITE {
                next = rx.try_recv().ok();
            }
        }
        let now = Instant::now();
        let mut writes = Vec::with_capacity(queued.len());
        for b in queued {
            let seq = match counters.get(&b.job_id, b.rank, now) {
                Some(s) => s,
                // Continue after what an earlier coordinator run stored.
                None => match store.last_log_seq(&b.job_id, b.rank).await {
                    Ok(last) => last.map_or(1, |s| s + 1),
                    Err(e) => {
                        tracing::warn!(job = %b.job_id, rank = b.rank, "reading log sequence: {e}");
                        1
                    }
                },
            };
            counters.set(&b.job_id, b.rank, seq + 1, now);
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
        if !writes.is_empty() {
            if let Err(e) = store.put_logs(writes).await {
                tracing::warn!("storing worker logs: {e}");
            }
        }
        for (job, done) in answers {
            if let Some(job) = job {
                counters.jobs.remove(&job);
            }
            let _ = done.send(());
        }
        counters.sweep(now);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::RedbStore;

    fn batch(job: &str, rank: u32, line: &str) -> LogBatch {
        LogBatch {
            job_id: job.into(),
            rank,
            node: "n0".into(),
            lines: vec![line.into()],
        }
    }

    #[test]
    fn counters_of_an_idle_job_go_and_a_busy_one_stays() {
        let mut c = Counters::default();
        let t0 = Instant::now();
        c.set("job-1", 0, 5, t0);
        c.set("job-2", 0, 9, t0);
        c.sweep(t0);
        let later = t0 + IDLE_COUNTERS / 2;
        assert_eq!(c.get("job-2", 0, later), Some(9));
        // Not yet idle long enough, and the sweep looks at most every tenth.
        c.sweep(later);
        assert_eq!(c.jobs.len(), 2);
        let past = t0 + IDLE_COUNTERS + Duration::from_secs(1);
        c.sweep(past);
        assert!(!c.jobs.contains_key("job-1"), "idle since t0");
        assert_eq!(c.get("job-2", 0, past), Some(9), "used at t0 + half");
    }

    /// `forget` answers after what was sent before it is stored, and the
    /// sequence goes on from the store afterwards.
    #[tokio::test]
    async fn forget_answers_after_the_lines_before_it_are_stored() {
        let dir = tempfile::tempdir().unwrap();
        let raw = RedbStore::open(&dir.path().join("s.redb")).unwrap();
        let store = StateStore::new(Arc::new(raw));
        let (sink, task) = LogSink::spawn(store.clone());
        for i in 0..300 {
            sink.send(batch("job-000001", i % 3, &format!("line {i}")));
        }
        sink.forget("job-000001").await.unwrap();
        assert_eq!(store.logs("job-000001", None).await.unwrap().len(), 300);
        sink.send(batch("job-000001", 0, "after"));
        sink.forget("job-000001").await.unwrap();
        let rank0 = store.logs("job-000001", Some(0)).await.unwrap();
        assert_eq!(rank0.len(), 101, "a line after forget is stored too");
        assert_eq!(rank0.last().unwrap().line, "after", "and sorts last");
        drop(sink);
        task.await.unwrap();
    }
}

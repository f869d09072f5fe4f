//! State storage. [`Store`] is the small async key-value trait a backend implements
//! (redb, or etcd in [`etcd`]); [`StateStore`] is the typed layer on top that knows
//! the key space of docs/architecture.md ("Stored state") and encodes the
//! protobuf messages, so the rest of the coordinator never builds a key by hand.

pub mod etcd;
pub mod etcd_access;
mod key_file;
pub mod redb;
pub mod writer;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use gpuctl_core::auth::RankKey;
use gpuctl_core::pb::{
    Acceptance, Baseline, GetLogsResponse, Job, LogLine, Node, NodeRun, RankReport, RankResult,
    Report, Suite,
};
use prost::Message;

use crate::judge::series::GpuSeries;

pub use self::redb::RedbStore;
pub use self::writer::Durable;
use self::writer::Writer;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state store: {0}")]
    Backend(String),
    #[error("stored value under `{key}` does not decode: {source}")]
    Decode {
        key: String,
        #[source]
        source: prost::DecodeError,
    },
    #[error("{0}")]
    Unsupported(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

/// Key-value pairs in key order.
pub type Entries = Vec<(String, Vec<u8>)>;

/// Key-value pairs whose values are shared, in key order.
pub type SharedEntries = Vec<(String, std::sync::Arc<Vec<u8>>)>;

/// A durable, ordered key-value map over string keys. Every write is durable when
/// its future resolves: callers acknowledge clients only after that.
///
/// Boxed futures keep the trait object-safe, so the backend is picked at run time.
pub trait Store: Send + Sync + 'static {
    /// Writes all entries in one atomic transaction.
    fn put_many(&self, entries: Vec<(String, Vec<u8>)>) -> BoxFuture<'_, StoreResult<()>>;

    /// As [`Self::put_many`], with values the caller keeps sharing (the
    /// writer's overlay): a backend that can write from a borrow copies
    /// nothing, where a job's end hands over a hundred MB.
    fn put_shared(&self, entries: SharedEntries) -> BoxFuture<'_, StoreResult<()>> {
        Box::pin(async move {
            let owned = tokio::task::spawn_blocking(move || {
                entries
                    .into_iter()
                    .map(|(k, v)| (k, v.as_ref().clone()))
                    .collect::<Vec<_>>()
            })
            .await
            .map_err(|e| StoreError::Backend(format!("preparing a write failed: {e}")))?;
            self.put_many(owned).await
        })
    }

    fn get(&self, key: String) -> BoxFuture<'_, StoreResult<Option<Vec<u8>>>>;

    /// Returns whether the key existed.
    fn delete(&self, key: String) -> BoxFuture<'_, StoreResult<bool>>;

    /// Every entry whose key starts with `prefix`, in key order.
    fn scan_prefix(&self, prefix: String) -> BoxFuture<'_, StoreResult<Entries>>;

    /// Deletes every key that starts with `prefix`; returns how many went.
    /// Backends do it in one transaction; this default, one key at a time.
    fn delete_prefix(&self, prefix: String) -> BoxFuture<'_, StoreResult<usize>> {
        Box::pin(async move {
            let mut gone = 0;
            for (key, _) in self.scan_prefix(prefix).await? {
                gone += usize::from(self.delete(key).await?);
            }
            Ok(gone)
        })
    }

    fn put(&self, key: String, value: Vec<u8>) -> BoxFuture<'_, StoreResult<()>> {
        self.put_many(vec![(key, value)])
    }

    /// Flushes and releases the backend (file lock, connections) even while
    /// other handles to the store are still around; later calls fail.
    fn close(&self) -> BoxFuture<'_, StoreResult<()>> {
        Box::pin(async { Ok(()) })
    }
}

/// The key space, in one place.
pub mod keys {
    pub const JOB_SEQ: &str = "meta/job_seq";
    /// The key of the workers' per-rank secrets (gpuctl_core::auth::RankKey).
    pub const RANK_KEY: &str = "meta/rank_key";
    pub const NODES: &str = "nodes/";
    pub const JOBS: &str = "jobs/";
    pub const BASELINES: &str = "baselines/";
    pub const HISTORY: &str = "history/";
    pub const SUITES: &str = "suites/";
    pub const ACCEPTANCE: &str = "acceptance/";

    /// One node's run of one job; the time first so a node's runs sort by age.
    pub fn history(node: &str, finished_ms: u64, job: &str) -> String {
        format!("history/{node}/{finished_ms:013}-{job}")
    }
    pub fn history_of(node: &str) -> String {
        format!("history/{node}/")
    }
    /// Jobs whose report is stored and whose runs may not be: see
    /// [`crate::history::store_runs`].
    pub const HISTORY_DUE: &str = "history-due/";
    pub fn history_due(job: &str) -> String {
        format!("history-due/{job}")
    }

    pub fn baseline(name: &str) -> String {
        format!("baselines/{name}")
    }

    pub fn suite(id: &str) -> String {
        format!("suites/{id}")
    }
    /// A node's last acceptance suite.
    pub fn acceptance(node: &str) -> String {
        format!("acceptance/{node}")
    }

    pub fn node(name: &str) -> String {
        format!("nodes/{name}")
    }
    pub fn job(id: &str) -> String {
        format!("jobs/{id}")
    }
    pub fn result(job: &str, attempt: u32, rank: u32) -> String {
        format!("results/{job}/{attempt}/{rank:06}")
    }
    /// The trailing slash keeps `job-1` from matching `job-10`.
    pub fn results(job: &str, attempt: u32) -> String {
        format!("results/{job}/{attempt}/")
    }
    /// Every attempt's results of a job.
    pub fn results_of(job: &str) -> String {
        format!("results/{job}/")
    }
    pub fn report(job: &str) -> String {
        format!("reports/{job}")
    }
    pub fn log(job: &str, rank: u32, seq: u64) -> String {
        format!("logs/{job}/{rank:06}/{seq:010}")
    }
    /// One GPU's downsampled telemetry series of a job.
    pub fn telemetry(job: &str, node: &str, gpu: u32) -> String {
        format!("telemetry/{job}/{node}/{gpu:03}")
    }
    pub fn telemetry_of(job: &str) -> String {
        format!("telemetry/{job}/")
    }
    pub fn logs(job: &str, rank: Option<u32>) -> String {
        match rank {
            Some(r) => format!("logs/{job}/{r:06}/"),
            None => format!("logs/{job}/"),
        }
    }
}

/// One write of a typed batch; see [`StateStore::write`].
#[derive(Default)]
pub struct Batch(Vec<(String, Vec<u8>)>);

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Batch({} keys)", self.0.len())
    }
}

impl Batch {
    pub fn node(mut self, node: &Node) -> Self {
        self.0.push((keys::node(&node.name), node.encode_to_vec()));
        self
    }
    pub fn job(mut self, job: &Job) -> Self {
        // Progress changes every second; it is served from memory, not
        // stored. The scheduler keeps it apart, so a copy of a 32,768-rank
        // plan is rarely needed to leave it out.
        let bytes = if job.progress.is_empty() {
            job.encode_to_vec()
        } else {
            let mut job = job.clone();
            job.progress.clear();
            job.encode_to_vec()
        };
        self.0.push((keys::job(&job.id), bytes));
        self
    }
    /// The report without its ranks' results: each is under its own key
    /// already, and [`StateStore::report`] puts them back. At 32,768 ranks
    /// they were most of a 40 MB value, encoded and written again at the
    /// job's end, when memory peaks.
    pub fn report(mut self, report: &mut Report) -> Self {
        let results: Vec<_> = ranks_of(report).map(|r| r.result.take()).collect();
        self = self.bare_report(report);
        for (rank, result) in ranks_of(report).zip(results) {
            rank.result = result;
        }
        self
    }
    /// As [`Batch::report`], for a report whose ranks carry no results
    /// yet (the judge attaches them after): encoded from a shared borrow,
    /// beside other work.
    pub fn bare_report(mut self, report: &Report) -> Self {
        debug_assert!(report
            .nodes
            .iter()
            .flat_map(|n| &n.ranks)
            .all(|r| r.result.is_none()));
        self.0
            .push((keys::report(&report.job_id), report.encode_to_vec()));
        self
    }
    pub fn suite(mut self, suite: &Suite) -> Self {
        self.0.push((keys::suite(&suite.id), suite.encode_to_vec()));
        self
    }
    pub fn acceptance(mut self, a: &Acceptance) -> Self {
        self.0.push((keys::acceptance(&a.node), a.encode_to_vec()));
        self
    }
    /// Marks `job`'s runs as due: written with its report, deleted once
    /// they are committed too.
    pub fn history_due(mut self, job: &str) -> Self {
        self.0.push((keys::history_due(job), Vec::new()));
        self
    }
    pub fn run(mut self, run: &NodeRun) -> Self {
        let key = keys::history(&run.node, run.finished_unix_ms, &run.job_id);
        self.0.push((key, run.encode_to_vec()));
        self
    }
    pub fn telemetry(mut self, job: &str, series: &GpuSeries) -> Self {
        self.0.push((
            keys::telemetry(job, &series.node, series.index),
            series.encode_to_vec(),
        ));
        self
    }
    pub fn job_seq(mut self, seq: u64) -> Self {
        self.0
            .push((keys::JOB_SEQ.to_string(), seq.to_string().into_bytes()));
        self
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Each of `series` under `job`, handed to `write` in batches of about
    /// `max_bytes` as each fills.
    pub fn telemetry_parts(
        job: &str,
        series: impl Iterator<Item = GpuSeries>,
        max_bytes: usize,
        mut write: impl FnMut(Batch),
    ) {
        let (mut part, mut bytes) = (Batch::default(), 0);
        for s in series {
            if bytes >= max_bytes {
                write(std::mem::take(&mut part));
                bytes = 0;
            }
            part = part.telemetry(job, &s);
            bytes += part.0.last().map_or(0, |(k, v)| k.len() + v.len());
        }
        if !part.is_empty() {
            write(part);
        }
    }
}

fn ranks_of(report: &mut Report) -> impl Iterator<Item = &mut RankReport> {
    report.nodes.iter_mut().flat_map(|n| &mut n.ranks)
}

/// Reads bigger than this are decoded on a blocking thread: a 32,768-rank
/// report or its results take hundreds of milliseconds to decode, and on
/// the runtime's threads that would hold up every connection, HTTP/2
/// keepalive pings included.
const DECODE_OFF_BYTES: usize = 1 << 20;

async fn decode_off<T: Send + 'static>(
    size: usize,
    decode: impl FnOnce() -> StoreResult<T> + Send + 'static,
) -> StoreResult<T> {
    if size < DECODE_OFF_BYTES {
        return decode();
    }
    tokio::task::spawn_blocking(decode)
        .await
        .map_err(|e| StoreError::Backend(format!("decoding failed: {e}")))?
}

/// Typed access to the coordinator's state.
#[derive(Clone)]
pub struct StateStore {
    inner: Arc<dyn Store>,
    /// Every write goes through it, in order ([`writer`]).
    writer: Writer,
    /// Read (or made) once: it never changes while the store lives.
    rank_key: Arc<tokio::sync::OnceCell<RankKey>>,
    /// Where the key lives when it lives outside the store
    /// ([`StateStore::with_key_file`]).
    key_file: Option<std::path::PathBuf>,
    /// Counts the writes that change what the fleet history reads (runs,
    /// acceptances, the inventory): a copy made when it read `v` is current
    /// while it still reads `v`.
    history_version: Arc<AtomicU64>,
}

/// Prefixes of the keys the fleet history reads (see `history_version`).
const HISTORY_INPUTS: [&str; 3] = [keys::HISTORY, keys::ACCEPTANCE, keys::NODES];

impl StateStore {
    /// Starts the store's writer task: call inside a tokio runtime.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        StateStore {
            writer: Writer::start(inner.clone()),
            inner,
            rank_key: Default::default(),
            key_file: None,
            history_version: Default::default(),
        }
    }

    /// Keeps the workers' key in `path` (owner-only, hex) instead of the
    /// store: a reader of the store or of etcd then holds nothing that forges
    /// a result. A key an older coordinator stored is moved there.
    pub fn with_key_file(mut self, path: std::path::PathBuf) -> Self {
        self.key_file = Some(path);
        self
    }

    /// Changes with every write of a run, an acceptance or a node, queued or
    /// deleted. Bumped once readers see the write: a reader that took the
    /// old value may have read either side of it, and is told so.
    pub fn history_version(&self) -> u64 {
        self.history_version.load(Ordering::Acquire)
    }

    fn history_input(key: &str) -> bool {
        HISTORY_INPUTS.iter().any(|p| key.starts_with(p))
    }

    fn bump_history(&self, changed: bool) {
        if changed {
            self.history_version.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The key of the workers' secrets: the stored one, else a new random
    /// one, stored. Only the leading coordinator writes, so a get and a put
    /// suffice; a standby that takes over reads the same key and derives the
    /// same secrets for the jobs it adopts.
    pub async fn rank_key(&self) -> StoreResult<RankKey> {
        self.rank_key
            .get_or_try_init(|| async {
                if let Some(path) = &self.key_file {
                    return key_file::load(self.inner.as_ref(), path).await;
                }
                let key = keys::RANK_KEY.to_string();
                if let Some(bytes) = self.inner.get(key.clone()).await? {
                    return RankKey::from_bytes(&bytes).ok_or_else(|| {
                        StoreError::Backend(format!(
                            "`{key}` holds {} bytes, not a key of {}",
                            bytes.len(),
                            gpuctl_core::auth::KEY_BYTES
                        ))
                    });
                }
                let fresh = RankKey::generate()
                    .map_err(|e| StoreError::Backend(format!("no random bytes for a key: {e}")))?;
                self.inner.put(key, fresh.as_bytes().to_vec()).await?;
                Ok(fresh)
            })
            .await
            .cloned()
    }

    /// Commits what is queued, then releases the backend.
    pub async fn close(&self) -> StoreResult<()> {
        let flushed = match self.writer.flush().wait().await {
            Ok(()) => self.writer.flush_later().wait().await,
            Err(e) => Err(e),
        };
        self.inner.close().await?;
        flushed
    }

    pub fn raw(&self) -> &dyn Store {
        self.inner.as_ref()
    }

    /// Hands a batch to the writer and returns at once: readers see it now,
    /// and it is committed atomically, after everything handed over before.
    /// Wait on the returned [`Durable`] before telling anyone it is stored.
    pub fn queue(&self, batch: Batch) -> Durable {
        let history = batch.0.iter().any(|(k, _)| Self::history_input(k));
        let durable = self.writer.write(batch.0);
        self.bump_history(history);
        durable
    }

    /// As [`StateStore::queue`], in the writer's second lane: committed
    /// after what is queued now, in small transactions while nothing else
    /// waits (see [`Writer::write_later`]); not atomically.
    pub fn queue_later(&self, batch: Batch) -> Durable {
        let history = batch.0.iter().any(|(k, _)| Self::history_input(k));
        let durable = self.writer.write_later(batch.0);
        self.bump_history(history);
        durable
    }

    /// Resolves once everything queued before is durable.
    pub fn flush(&self) -> Durable {
        self.writer.flush()
    }

    /// Writes a batch atomically and waits until it is durable.
    pub async fn write(&self, batch: Batch) -> StoreResult<()> {
        if batch.is_empty() {
            return Ok(());
        }
        self.queue(batch).wait().await
    }

    /// A value, queued or committed.
    async fn get_raw(&self, key: String) -> StoreResult<Option<Vec<u8>>> {
        if let Some(v) = self.writer.get(&key) {
            return Ok(Some(v.as_ref().clone()));
        }
        self.inner.get(key).await
    }

    async fn get_msg<M: Message + Default + 'static>(&self, key: String) -> StoreResult<Option<M>> {
        let Some(bytes) = self.get_raw(key.clone()).await? else {
            return Ok(None);
        };
        let size = bytes.len();
        decode_off(size, move || {
            M::decode(bytes.as_slice())
                .map(Some)
                .map_err(|source| StoreError::Decode { key, source })
        })
        .await
    }

    async fn scan_msgs<M: Message + Default + 'static>(
        &self,
        prefix: String,
    ) -> StoreResult<Vec<M>> {
        let all = self.scan_raw(prefix).await?;
        let size = all.values().map(Vec::len).sum();
        decode_off(size, move || {
            all.into_iter()
                .map(|(key, bytes)| {
                    M::decode(bytes.as_slice()).map_err(|source| StoreError::Decode { key, source })
                })
                .collect()
        })
        .await
    }

    /// Every entry under `prefix`, committed or queued, by key.
    async fn scan_raw(
        &self,
        prefix: String,
    ) -> StoreResult<std::collections::BTreeMap<String, Vec<u8>>> {
        let mut all: std::collections::BTreeMap<String, Vec<u8>> = self
            .inner
            .scan_prefix(prefix.clone())
            .await?
            .into_iter()
            .collect();
        // Queued writes are newer than what is committed.
        for (k, v) in self.writer.scan(&prefix) {
            all.insert(k, v.as_ref().clone());
        }
        Ok(all)
    }

    /// Deletes after every queued write is committed, so that a queued
    /// write of the key cannot bring it back.
    async fn delete(&self, key: String) -> StoreResult<bool> {
        self.writer.flush().wait().await?;
        let history = Self::history_input(&key);
        let gone = self.inner.delete(key).await;
        self.bump_history(history);
        gone
    }

    /// Deletes job `id` whole: its results, logs, telemetry, report, the
    /// mark that its fleet history is due, and last its record, so that a
    /// crash halfway leaves a job that is deleted again at the next start.
    /// Waits first for both of the writer's lanes, so that no queued write
    /// of the job brings a key back. Returns how many keys went.
    pub async fn delete_job(&self, id: &str) -> StoreResult<usize> {
        self.writer.flush().wait().await?;
        self.writer.flush_later().wait().await?;
        let mut gone = 0;
        for prefix in [
            keys::results_of(id),
            keys::logs(id, None),
            keys::telemetry_of(id),
        ] {
            gone += self.inner.delete_prefix(prefix).await?;
        }
        for key in [keys::report(id), keys::history_due(id), keys::job(id)] {
            gone += usize::from(self.inner.delete(key).await?);
        }
        Ok(gone)
    }

    pub async fn job_seq(&self) -> StoreResult<u64> {
        match self.get_raw(keys::JOB_SEQ.to_string()).await? {
            None => Ok(0),
            Some(bytes) => String::from_utf8_lossy(&bytes).trim().parse().map_err(|_| {
                StoreError::Backend(format!(
                    "`{}` holds {:?}, not a number",
                    keys::JOB_SEQ,
                    String::from_utf8_lossy(&bytes)
                ))
            }),
        }
    }

    pub async fn nodes(&self) -> StoreResult<Vec<Node>> {
        self.scan_msgs(keys::NODES.to_string()).await
    }

    pub async fn jobs(&self) -> StoreResult<Vec<Job>> {
        self.scan_msgs(keys::JOBS.to_string()).await
    }

    pub async fn suites(&self) -> StoreResult<Vec<Suite>> {
        self.scan_msgs(keys::SUITES.to_string()).await
    }

    /// Every node's last acceptance suite.
    pub async fn acceptances(&self) -> StoreResult<Vec<Acceptance>> {
        self.scan_msgs(keys::ACCEPTANCE.to_string()).await
    }

    pub async fn job(&self, id: &str) -> StoreResult<Option<Job>> {
        self.get_msg(keys::job(id)).await
    }

    /// Queues a result; durable when the returned [`Durable`] resolves.
    pub fn put_result(&self, result: &RankResult) -> Durable {
        let key = keys::result(&result.job_id, result.attempt, result.rank);
        self.writer.write(vec![(key, result.encode_to_vec())])
    }

    pub async fn results(&self, job: &str, attempt: u32) -> StoreResult<Vec<RankResult>> {
        self.scan_msgs(keys::results(job, attempt)).await
    }

    /// Every kept run (of one node when `node` is given), oldest first.
    pub async fn history(&self, node: Option<&str>) -> StoreResult<Vec<NodeRun>> {
        let prefix = match node {
            Some(n) => keys::history_of(n),
            None => keys::HISTORY.to_string(),
        };
        self.scan_msgs(prefix).await
    }

    /// Jobs whose runs are due ([`Batch::history_due`]).
    pub async fn history_due(&self) -> StoreResult<Vec<String>> {
        let marks = self.scan_raw(keys::HISTORY_DUE.to_string()).await?;
        Ok(marks
            .into_keys()
            .filter_map(|k| k.strip_prefix(keys::HISTORY_DUE).map(str::to_string))
            .collect())
    }

    /// `job`'s runs are committed: no longer due.
    pub async fn history_done(&self, job: &str) -> StoreResult<bool> {
        self.delete(keys::history_due(job)).await
    }

    pub async fn delete_node(&self, name: &str) -> StoreResult<bool> {
        self.delete(keys::node(name)).await
    }

    pub async fn delete_run(&self, run: &NodeRun) -> StoreResult<bool> {
        let key = keys::history(&run.node, run.finished_unix_ms, &run.job_id);
        // Runs are written in the second lane: a run still queued there
        // would come back after this delete.
        self.writer.flush_later().wait().await?;
        self.delete(key).await
    }

    pub async fn baseline(&self, name: &str) -> StoreResult<Option<Baseline>> {
        self.get_msg(keys::baseline(name)).await
    }

    pub async fn baselines(&self) -> StoreResult<Vec<Baseline>> {
        self.scan_msgs(keys::BASELINES.to_string()).await
    }

    pub async fn put_baseline(&self, b: &Baseline) -> StoreResult<()> {
        self.writer
            .write(vec![(keys::baseline(&b.name), b.encode_to_vec())])
            .wait()
            .await
    }

    /// Whether there was one to delete.
    pub async fn delete_baseline(&self, name: &str) -> StoreResult<bool> {
        self.delete(keys::baseline(name)).await
    }

    /// A stored report with its ranks' results put back (see
    /// [`Batch::report`]).
    pub async fn report(&self, job: &str) -> StoreResult<Option<Report>> {
        let Some(mut report) = self.get_msg::<Report>(keys::report(job)).await? else {
            return Ok(None);
        };
        // Reports stored before `attempt` was kept carry their results.
        if report.attempt > 0 {
            let mut results: std::collections::BTreeMap<u32, RankResult> = self
                .results(job, report.attempt)
                .await?
                .into_iter()
                .map(|r| (r.rank, r))
                .collect();
            for rank in ranks_of(&mut report) {
                rank.result = results.remove(&rank.rank);
            }
        }
        Ok(Some(report))
    }

    /// A job's stored telemetry, one series per GPU in (node, index) order.
    pub async fn telemetry(&self, job: &str) -> StoreResult<Vec<GpuSeries>> {
        self.scan_msgs(keys::telemetry_of(job)).await
    }

    /// Stores log batches, each under its own sequence number.
    pub async fn put_logs(
        &self,
        batches: Vec<(String, u32, u64, Vec<LogLine>)>,
    ) -> StoreResult<()> {
        let entries = batches
            .into_iter()
            .map(|(job, rank, seq, lines)| {
                (
                    keys::log(&job, rank, seq),
                    GetLogsResponse { lines }.encode_to_vec(),
                )
            })
            .collect();
        self.inner.put_many(entries).await
    }

    /// The highest log sequence number stored for one rank, if any.
    pub async fn last_log_seq(&self, job: &str, rank: u32) -> StoreResult<Option<u64>> {
        let entries = self.inner.scan_prefix(keys::logs(job, Some(rank))).await?;
        Ok(entries
            .last()
            .and_then(|(k, _)| k.rsplit('/').next())
            .and_then(|s| s.parse().ok()))
    }

    /// Log lines of a job in (rank, arrival) order.
    pub async fn logs(&self, job: &str, rank: Option<u32>) -> StoreResult<Vec<LogLine>> {
        let batches: Vec<GetLogsResponse> = self.scan_msgs(keys::logs(job, rank)).await?;
        Ok(batches.into_iter().flat_map(|b| b.lines).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_core::pb::JobState;

    fn open(dir: &std::path::Path) -> StateStore {
        StateStore::new(Arc::new(RedbStore::open(&dir.join("state.redb")).unwrap()))
    }

    /// What the fleet history reads changes the version; nothing else does.
    #[tokio::test]
    async fn the_history_version_moves_with_runs_acceptances_and_nodes_only() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path());
        let v0 = s.history_version();
        let job = Job {
            id: "job-000001".into(),
            ..Default::default()
        };
        s.write(Batch::default().job(&job).history_due(&job.id))
            .await
            .unwrap();
        assert_eq!(
            s.history_version(),
            v0,
            "a job and its mark are not history"
        );
        let run = NodeRun {
            node: "a".into(),
            job_id: job.id.clone(),
            finished_unix_ms: 5,
            ..Default::default()
        };
        drop(s.queue_later(Batch::default().run(&run)));
        let v1 = s.history_version();
        assert!(v1 > v0, "a queued run");
        s.write(Batch::default().node(&Node {
            name: "a".into(),
            ..Default::default()
        }))
        .await
        .unwrap();
        let v2 = s.history_version();
        assert!(v2 > v1, "a node");
        assert!(s.delete_run(&run).await.unwrap());
        let v3 = s.history_version();
        assert!(v3 > v2, "a deleted run");
        s.history_done(&job.id).await.unwrap();
        assert_eq!(s.history_version(), v3, "the mark's deletion");
    }

    #[tokio::test]
    async fn round_trip_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = open(dir.path());
            let job = Job {
                id: "job-000001".into(),
                state: JobState::Running as i32,
                attempt: 1,
                ..Default::default()
            };
            let node = Node {
                name: "node-0".into(),
                slots: 2,
                ..Default::default()
            };
            s.write(Batch::default().job(&job).node(&node).job_seq(1))
                .await
                .unwrap();
            for rank in [1, 0, 10] {
                s.put_result(&RankResult {
                    job_id: "job-000001".into(),
                    attempt: 1,
                    rank,
                    ok: true,
                    ..Default::default()
                })
                .await
                .unwrap();
            }
            // A neighbour whose id shares a prefix must not leak into scans.
            s.put_result(&RankResult {
                job_id: "job-0000010".into(),
                attempt: 1,
                rank: 0,
                ..Default::default()
            })
            .await
            .unwrap();
            s.put_logs(vec![
                (
                    "job-000001".into(),
                    0,
                    1,
                    vec![LogLine {
                        rank: 0,
                        node: "node-0".into(),
                        line: "a".into(),
                    }],
                ),
                (
                    "job-000001".into(),
                    0,
                    2,
                    vec![LogLine {
                        rank: 0,
                        node: "node-0".into(),
                        line: "b".into(),
                    }],
                ),
            ])
            .await
            .unwrap();
            // Releases the file now (the writer task would, once it ends).
            s.close().await.unwrap();
        }
        // Reopen: everything written before is there.
        let s = open(dir.path());
        assert_eq!(s.job_seq().await.unwrap(), 1);
        let jobs = s.jobs().await.unwrap();
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].state(), JobState::Running);
        assert_eq!(s.nodes().await.unwrap()[0].slots, 2);
        let ranks: Vec<u32> = s
            .results("job-000001", 1)
            .await
            .unwrap()
            .iter()
            .map(|r| r.rank)
            .collect();
        assert_eq!(ranks, vec![0, 1, 10], "results in rank order, no neighbour");
        let lines: Vec<String> = s
            .logs("job-000001", Some(0))
            .await
            .unwrap()
            .into_iter()
            .map(|l| l.line)
            .collect();
        assert_eq!(lines, vec!["a", "b"]);
        assert_eq!(s.last_log_seq("job-000001", 0).await.unwrap(), Some(2));
        assert_eq!(s.last_log_seq("job-000001", 1).await.unwrap(), None);
        assert!(s.report("job-000001").await.unwrap().is_none());
        assert!(s.raw().delete(keys::job("job-000001")).await.unwrap());
        assert!(!s.raw().delete(keys::job("job-000001")).await.unwrap());
        assert!(s.job("job-000001").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_report_is_stored_without_its_results_and_read_with_them() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path());
        let result = |rank| RankResult {
            job_id: "job-000007".into(),
            attempt: 2,
            rank,
            node: "node-0".into(),
            ..Default::default()
        };
        for rank in [0, 1] {
            s.put_result(&result(rank)).await.unwrap();
        }
        // Attempt 1's result of rank 1 is not attempt 2's.
        s.put_result(&RankResult {
            attempt: 1,
            device: "old".into(),
            ..result(1)
        })
        .await
        .unwrap();
        let rank = |rank| RankReport {
            rank,
            result: Some(result(rank)),
            ..Default::default()
        };
        let mut report = Report {
            job_id: "job-000007".into(),
            attempt: 2,
            nodes: vec![gpuctl_core::pb::NodeReport {
                name: "node-0".into(),
                ranks: vec![
                    rank(0),
                    rank(1),
                    RankReport {
                        rank: 2,
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }],
            ..Default::default()
        };
        let want = report.clone();
        s.queue(Batch::default().report(&mut report)).await.unwrap();
        assert_eq!(report, want, "the caller's report keeps its results");
        let raw = s
            .get_raw(keys::report("job-000007"))
            .await
            .unwrap()
            .unwrap();
        let stored = Report::decode(raw.as_slice()).unwrap();
        let carried = stored.nodes[0].ranks.iter().filter(|r| r.result.is_some());
        assert_eq!(carried.count(), 0, "the stored value has no results");
        assert_eq!(s.report("job-000007").await.unwrap().unwrap(), want);
    }

    #[tokio::test]
    async fn garbage_values_are_reported_with_their_key() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path());
        s.raw()
            .put(keys::job("bad"), vec![0xff, 0xff, 0xff])
            .await
            .unwrap();
        let err = s.jobs().await.unwrap_err().to_string();
        assert!(err.contains("jobs/bad"), "{err}");
    }
}

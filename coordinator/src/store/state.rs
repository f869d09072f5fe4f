//! [`StateStore`]: typed access to the coordinator's state over any
//! [`Store`]. Every write goes through the store's one [`Writer`], and every
//! read sees what is queued there as well as what is committed, so that the
//! scheduler can go on before a write is durable without reading stale state.
//! It also keeps the workers' key and the version the fleet history caches by.

use std::sync::{Arc, Mutex};

use gpuctl_core::auth::RankKey;
use gpuctl_proto::pb::{
    Acceptance, Baseline, GetLogsResponse, LogLine, Node, NodeRun, RankResult, Report, Suite,
};
use prost::Message;

use super::backend::{Entries, Store, StoreError, StoreResult};
use super::batch::{ranks_of, Batch};
use super::history_log::{HistoryLog, HistoryWrite, Since};
use super::key_file;
use super::keys;
use super::writer::{Durable, Writer};
use crate::judge::series::GpuSeries;

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

/// The committed entries of a prefix with the queued ones read before them
/// laid over: a queued write is newer than what was committed when it was
/// read.
fn newest(
    committed: Entries,
    queued: Vec<(String, Arc<Vec<u8>>)>,
) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut all: std::collections::BTreeMap<String, Vec<u8>> = committed.into_iter().collect();
    for (k, v) in queued {
        all.insert(k, v.as_ref().clone());
    }
    all
}

/// Each value decoded as an `M`, in key order; a bad one names its key.
fn decode_each<M: Message + Default>(
    all: std::collections::BTreeMap<String, Vec<u8>>,
) -> StoreResult<Vec<M>> {
    all.into_iter()
        .map(|(key, bytes)| {
            M::decode(bytes.as_slice()).map_err(|source| StoreError::Decode { key, source })
        })
        .collect()
}

/// A batch's entries as the writer keeps them, shared with the history's
/// log rather than copied.
fn shared(batch: Batch) -> Vec<(String, Arc<Vec<u8>>)> {
    batch.0.into_iter().map(|(k, v)| (k, Arc::new(v))).collect()
}

/// A batch whose values are shared: read (as the history's writes it
/// makes) before it is queued, without a copy.
pub struct SharedBatch(Vec<(String, Arc<Vec<u8>>)>);

impl SharedBatch {
    pub fn new(batch: Batch) -> Self {
        SharedBatch(shared(batch))
    }

    /// What the history log will hold of it once it is queued.
    pub fn history_writes(&self) -> Vec<HistoryWrite> {
        let inputs = StateStore::history_inputs(&self.0).into_iter();
        inputs
            .map(|(key, value)| HistoryWrite {
                key,
                value: Some(value),
            })
            .collect()
    }
}

/// Typed access to the coordinator's state.
#[derive(Clone)]
pub struct StateStore {
    pub(super) inner: Arc<dyn Store>,
    /// Every write goes through it, in order.
    pub(super) writer: Writer,
    /// Bytes each measured ended job holds (`sizes.rs`).
    pub(super) sizes: Arc<std::sync::Mutex<std::collections::BTreeMap<String, u64>>>,
    /// Read (or made) once: it never changes while the store lives.
    rank_key: Arc<tokio::sync::OnceCell<RankKey>>,
    /// Where the key lives when it lives outside the store
    /// ([`StateStore::with_key_file`]).
    key_file: Option<std::path::PathBuf>,
    /// Counts the writes that change what the fleet history reads (runs,
    /// acceptances, the inventory), and keeps them for the fleet view.
    history: Arc<Mutex<HistoryLog>>,
    /// The history's version, as it moves, for the fleet view.
    history_moved: Arc<tokio::sync::watch::Sender<u64>>,
}

impl StateStore {
    /// Starts the store's writer task: call inside a tokio runtime.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        StateStore {
            writer: Writer::start(inner.clone()),
            inner,
            rank_key: Default::default(),
            key_file: None,
            history: Default::default(),
            history_moved: Arc::new(tokio::sync::watch::Sender::new(0)),
            sizes: Default::default(),
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
    /// deleted. Moved once readers see the write: a reader that took the
    /// old value may have read either side of it, and is told so.
    pub fn history_version(&self) -> u64 {
        self.history_log().version()
    }

    /// Keeps the history's writes from now on (see [`HistoryLog`]); returns
    /// the version they follow.
    pub fn arm_history_log(&self) -> u64 {
        self.history_log().arm()
    }

    /// Keeps no more of the history's writes.
    pub fn disarm_history_log(&self) {
        self.history_log().disarm()
    }

    /// The history's writes after version `v`, kept since
    /// [`StateStore::arm_history_log`]; one reader.
    pub fn history_since(&self, v: u64) -> Since {
        self.history_log().since(v)
    }

    /// Told each time the history's version moves.
    pub fn history_moves(&self) -> tokio::sync::watch::Receiver<u64> {
        self.history_moved.subscribe()
    }

    fn history_log(&self) -> std::sync::MutexGuard<'_, HistoryLog> {
        self.history.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn history_input(key: &str) -> bool {
        keys::history_input(key).is_some()
    }

    /// The entries the fleet history reads, taken before the writer has
    /// them, so that they are counted after readers see them.
    fn history_inputs(entries: &[(String, Arc<Vec<u8>>)]) -> Vec<(String, Arc<Vec<u8>>)> {
        let inputs = entries.iter().filter(|(k, _)| Self::history_input(k));
        inputs.cloned().collect()
    }

    /// Counts (and keeps) the history's inputs among `entries`, once
    /// readers see them.
    fn record_history<'a>(
        &self,
        entries: impl IntoIterator<Item = (&'a String, Option<&'a Arc<Vec<u8>>>)>,
    ) {
        let version = {
            let mut log = self.history_log();
            log.record(entries, Self::history_input);
            log.version()
        };
        self.history_moved
            .send_if_modified(|v| std::mem::replace(v, version) != version);
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
        let entries = shared(batch);
        let inputs = Self::history_inputs(&entries);
        let durable = self.writer.write(entries);
        self.record_history(inputs.iter().map(|(k, v)| (k, Some(v))));
        durable
    }

    /// As [`StateStore::queue`], in the writer's second lane: committed
    /// after what is queued now, in small transactions while nothing else
    /// waits (see [`Writer::write_later`]); not atomically.
    pub fn queue_later(&self, batch: Batch) -> Durable {
        self.queue_later_shared(SharedBatch::new(batch))
    }

    /// [`StateStore::queue_later`] of a batch already shared.
    pub fn queue_later_shared(&self, batch: SharedBatch) -> Durable {
        let inputs = Self::history_inputs(&batch.0);
        let durable = self.writer.write_later(batch.0);
        self.record_history(inputs.iter().map(|(k, v)| (k, Some(v))));
        durable
    }

    /// As [`StateStore::queue_later`], for the one reader of the history's
    /// writes ([`StateStore::history_since`]), which folded `batch`'s in
    /// ahead of this, as of version `v`: with the writes since `v` other
    /// than `batch`'s, which it has yet to fold in.
    pub fn queue_later_folded(&self, batch: SharedBatch, v: u64) -> (Durable, Since) {
        // Told apart by the values' addresses: the log holds the same
        // shared values, and every one of them is alive while it does.
        let key = |v: &Arc<Vec<u8>>| Arc::as_ptr(v) as usize;
        let ours: std::collections::HashSet<usize> = batch.0.iter().map(|(_, v)| key(v)).collect();
        let durable = self.queue_later_shared(batch);
        let since = match self.history_since(v) {
            Since::Writes(version, mut writes) => {
                writes.retain(|w| !w.value.as_ref().is_some_and(|v| ours.contains(&key(v))));
                Since::Writes(version, writes)
            }
            other => other,
        };
        (durable, since)
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
        decode_off(size, move || decode_each(all)).await
    }

    /// Every entry under `prefix`, committed or queued, by key.
    async fn scan_raw(
        &self,
        prefix: String,
    ) -> StoreResult<std::collections::BTreeMap<String, Vec<u8>>> {
        // The queued writes first: one committed between the two reads (and
        // so gone from the queue) is then in the committed ones. Read the
        // other way round, it was in neither, and the fleet view kept an
        // answer without it as current.
        let queued = self.writer.scan(&prefix);
        let committed = self.inner.scan_prefix(prefix.clone()).await?;
        Ok(newest(committed, queued))
    }

    /// Deletes after every queued write is committed, so that a queued
    /// write of the key cannot bring it back.
    async fn delete(&self, key: String) -> StoreResult<bool> {
        self.writer.flush().wait().await?;
        let gone = self.inner.delete(key.clone()).await;
        self.record_history([(&key, None)]);
        gone
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

    pub async fn suites(&self) -> StoreResult<Vec<Suite>> {
        self.scan_msgs(keys::SUITES.to_string()).await
    }

    /// Every node's last acceptance suite.
    pub async fn acceptances(&self) -> StoreResult<Vec<Acceptance>> {
        self.scan_msgs(keys::ACCEPTANCE.to_string()).await
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

    /// The kept runs of each of `nodes`, oldest first, in one read of the
    /// backend ([`Store::scan_prefixes`]).
    pub async fn histories(&self, nodes: &[String]) -> StoreResult<Vec<Vec<NodeRun>>> {
        let prefixes: Vec<String> = nodes.iter().map(|n| keys::history_of(n)).collect();
        let asked = std::time::Instant::now();
        // Queued first, as in `scan_raw`.
        let queued: Vec<_> = prefixes.iter().map(|p| self.writer.scan(p)).collect();
        let committed = self.inner.scan_prefixes(prefixes).await?;
        let read = asked.elapsed();
        // For an operator who finds the fleet view slow: redb's readers wait
        // while a commit writes its pages out.
        if read > std::time::Duration::from_millis(50) {
            let ms = read.as_millis() as u64;
            tracing::debug!(nodes = nodes.len(), ms, "the nodes' runs were read slowly");
        }
        let size = (committed.iter().flatten().map(|(_, v)| v.len()))
            .chain(queued.iter().flatten().map(|(_, v)| v.len()))
            .sum();
        decode_off(size, move || {
            (committed.into_iter().zip(queued))
                .map(|(committed, queued)| decode_each(newest(committed, queued)))
                .collect()
        })
        .await
    }

    /// The registered nodes' names, in key order, without reading the nodes.
    pub async fn node_names(&self) -> StoreResult<Vec<String>> {
        let queued = self.writer.scan(keys::NODES);
        let mut names: std::collections::BTreeSet<String> = self
            .inner
            .scan_keys(keys::NODES.to_string())
            .await?
            .into_iter()
            .collect();
        names.extend(queued.into_iter().map(|(k, _)| k));
        Ok(names
            .into_iter()
            .filter_map(|k| k.strip_prefix(keys::NODES).map(str::to_string))
            .collect())
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
                rank.result = results.remove(&rank.rank).map(Box::new);
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
                    GetLogsResponse {
                        lines,
                        settled: false,
                    }
                    .encode_to_vec(),
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

mod jobs;
#[cfg(test)]
mod tests;

//! The etcd store (`--store etcd`): the same keys as the embedded store, each
//! under `--etcd-prefix` (default `/gpuctl/`), in an etcd v3 cluster.
//!
//! - `put_many` is one etcd transaction. etcd refuses a transaction of more
//!   than `--max-txn-ops` operations (128 by default) or a request over
//!   `--max-request-bytes` (1.5 MiB by default), so a larger batch is written
//!   as consecutive transactions of at most [`MAX_TXN_OPS`] keys and about
//!   [`MAX_TXN_BYTES`], in order. Each is atomic; a failure stops the rest.
//! - `scan_prefix` reads a range in pages of [`PAGE`] keys, every page at the
//!   revision of the first, so a scan is one consistent snapshot however many
//!   keys it spans.
//! - A coordinator leads through `{prefix}leader`, a key bound to a lease it
//!   keeps alive ([`EtcdStore::lead`]). A second coordinator on the same
//!   prefix waits as a standby until that key is gone (the leader stopped and
//!   revoked its lease, or its lease expired). Every write of the leader is
//!   fenced by a compare on that key, so a coordinator that lost its lease
//!   cannot write over its successor's state; it stops instead.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, KvClient, PutOptions,
    Txn, TxnOp, TxnOpResponse,
};
use futures::future::BoxFuture;
use gpuctl_core::shutdown::Shutdown;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};
use tracing::{error, info, warn};

use super::etcd_access::EtcdAccess;
use super::{Entries, Store, StoreError, StoreResult};

/// Keys per transaction: etcd's default `--max-txn-ops`.
pub const MAX_TXN_OPS: usize = 128;
/// Bytes of keys and values per transaction, under etcd's default
/// `--max-request-bytes` (1.5 MiB) with room for the framing.
pub const MAX_TXN_BYTES: usize = 1024 * 1024;
/// Keys per range request of a scan.
pub const PAGE: i64 = 500;
/// How long one etcd request may take before it fails.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long startup waits for etcd to answer.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Lifetime of the leader lease: how long a standby waits after a leader
/// died without revoking it.
pub const LEADER_TTL: Duration = Duration::from_secs(10);
/// How often a standby tries to take the leader key.
const STANDBY_POLL: Duration = Duration::from_secs(1);
/// Largest response a scan page may be (values are whole log batches, reports).
const MAX_RESPONSE_BYTES: usize = 256 * 1024 * 1024;

/// The leader key under a prefix.
pub fn leader_key(prefix: &str) -> String {
    format!("{prefix}leader")
}

/// `--etcd-prefix` as used: ending in `/` so that `/gpuctl` and `/gpuctl2`
/// never share keys (an empty prefix stays empty).
pub fn normalize_prefix(prefix: &str) -> String {
    if prefix.is_empty() || prefix.ends_with('/') {
        prefix.to_string()
    } else {
        format!("{prefix}/")
    }
}

/// The first key after every key that starts with `prefix` (etcd's range end);
/// `\0` (to the end of the key space) when there is none.
fn range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// This coordinator's write fence: the leader key and the revision that created it.
#[derive(Clone)]
struct Fence {
    key: String,
    created: i64,
}

/// What [`EtcdStore::close`] stops: the lease keep-alive of a leader.
struct Leadership {
    lease: i64,
    stop: Shutdown,
    task: JoinHandle<()>,
}

pub struct EtcdStore {
    /// The endpoints as given, for messages.
    endpoints: String,
    prefix: String,
    client: Client,
    kv: KvClient,
    fence: OnceLock<Fence>,
    leadership: Mutex<Option<Leadership>>,
    /// Set when this coordinator lost the leader key; writes fail from then on.
    lost: Arc<AtomicBool>,
    /// Tripped when the leadership is lost (see [`EtcdStore::lead`]).
    lost_signal: Shutdown,
    closed: AtomicBool,
    /// The leader key's value as a standby last read it (see [`EtcdStore::holder`]).
    holder: watch::Sender<Option<String>>,
}

impl EtcdStore {
    /// Connects to `endpoints` (comma-separated URLs) and checks that etcd
    /// answers, so that a wrong address fails at startup with the fix.
    pub async fn connect(endpoints: &str, prefix: &str) -> StoreResult<EtcdStore> {
        Self::connect_with(endpoints, prefix, &EtcdAccess::default()).await
    }

    /// As [`EtcdStore::connect`], over TLS and with etcd's authentication
    /// as `access` says; a read under the prefix checks both at startup.
    pub async fn connect_with(
        endpoints: &str,
        prefix: &str,
        access: &EtcdAccess,
    ) -> StoreResult<EtcdStore> {
        let list: Vec<String> = endpoints
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        let unreachable = |e: &dyn std::fmt::Display| {
            let e = e.to_string();
            StoreError::Backend(format!(
                "cannot reach etcd at {endpoints}: {e}; start etcd (or fix --etcd) or use --store embedded; {}",
                access.hint(&e)
            ))
        };
        if list.is_empty() {
            return Err(StoreError::Backend(
                "--etcd is empty: give the etcd URL, e.g. --etcd http://127.0.0.1:2379".into(),
            ));
        }
        if access.tls() {
            if let Some(plain) = list.iter().find(|u| u.starts_with("http://")) {
                return Err(StoreError::Backend(format!(
                    "--etcd {plain}: with --etcd-ca or --etcd-cert give https:// URLs"
                )));
            }
        }
        let options = access.apply(
            ConnectOptions::new()
                .with_connect_timeout(CONNECT_TIMEOUT)
                .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5)),
        )?;
        let mut client = Client::connect(&list, Some(options))
            .await
            .map_err(|e| unreachable(&e))?;
        match timeout(CONNECT_TIMEOUT, client.status()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(unreachable(&e)),
            Err(_) => {
                return Err(unreachable(&format!(
                    "no answer within {}s",
                    CONNECT_TIMEOUT.as_secs()
                )))
            }
        }
        // `status` answers without a user; a read under the prefix does not.
        let probe = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_limit(1);
        match timeout(
            CONNECT_TIMEOUT,
            client.get(normalize_prefix(prefix), Some(probe)),
        )
        .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                let e = e.to_string();
                return Err(StoreError::Backend(format!(
                    "etcd at {endpoints} refused a read under {}: {e}; {}",
                    normalize_prefix(prefix),
                    access.hint(&e)
                )));
            }
            Err(_) => return Err(unreachable(&"no answer to a read")),
        }
        let kv = client
            .kv_client()
            .max_decoding_message_size(MAX_RESPONSE_BYTES)
            .max_encoding_message_size(MAX_RESPONSE_BYTES);
        Ok(EtcdStore {
            endpoints: endpoints.to_string(),
            prefix: normalize_prefix(prefix),
            client,
            kv,
            fence: OnceLock::new(),
            leadership: Mutex::new(None),
            lost: Arc::new(AtomicBool::new(false)),
            lost_signal: Shutdown::new(),
            closed: AtomicBool::new(false),
            holder: watch::Sender::new(None),
        })
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The leader key's value while [`EtcdStore::lead`] stands by: what a
    /// standby tells clients about the leader (crate::standby).
    pub fn holder(&self) -> watch::Receiver<Option<String>> {
        self.holder.subscribe()
    }

    fn full(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn err(&self, what: &str, e: impl std::fmt::Display) -> StoreError {
        StoreError::Backend(format!("etcd at {}: {what}: {e}", self.endpoints))
    }

    /// Runs one request under [`REQUEST_TIMEOUT`].
    async fn call<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> StoreResult<T> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(StoreError::Backend("the store is closed".into()));
        }
        match timeout(REQUEST_TIMEOUT, fut).await {
            Ok(r) => r.map_err(|e| self.err(what, e)),
            Err(_) => Err(self.err(
                what,
                format!("no answer within {}s", REQUEST_TIMEOUT.as_secs()),
            )),
        }
    }

    fn lost_error(&self) -> StoreError {
        let key = leader_key(&self.prefix);
        StoreError::Backend(format!(
            "this coordinator no longer holds the etcd leader key {key} at {} (its lease expired); \
             another coordinator may have taken over, so it stops writing",
            self.endpoints
        ))
    }

    fn mark_lost(&self) {
        if !self.lost.swap(true, Ordering::SeqCst) {
            error!("{}", self.lost_error());
            self.lost_signal.cancel();
        }
    }

    /// A transaction of `ops`, fenced on the leader key once this store leads.
    async fn fenced_txn(
        &self,
        what: &str,
        ops: Vec<TxnOp>,
    ) -> StoreResult<etcd_client::TxnResponse> {
        if self.lost.load(Ordering::SeqCst) {
            return Err(self.lost_error());
        }
        let mut txn = Txn::new();
        if let Some(f) = self.fence.get() {
            txn = txn.when(vec![Compare::create_revision(
                f.key.clone(),
                CompareOp::Equal,
                f.created,
            )]);
        }
        let txn = txn.and_then(ops);
        let resp = self.call(what, self.kv.clone().txn(txn)).await?;
        if !resp.succeeded() {
            self.mark_lost();
            return Err(self.lost_error());
        }
        Ok(resp)
    }

    /// Takes the leader key `{prefix}leader`, waiting as a standby while another
    /// coordinator holds it. `identity` is stored in the key: the leader's
    /// URL first, which standbys hand to clients (crate::standby). Returns `None` when `shutdown` trips first; otherwise a child of
    /// `shutdown` that also trips when the leadership is lost.
    pub async fn lead(
        &self,
        identity: &str,
        ttl: Duration,
        shutdown: Shutdown,
    ) -> StoreResult<Option<Shutdown>> {
        let key = leader_key(&self.prefix);
        let ttl_s = ttl.as_secs().max(2) as i64;
        let mut waiting_on: Option<String> = None;
        let (lease, created) = loop {
            match self.try_take(&key, identity, ttl_s).await {
                Ok(Ok(taken)) => break taken,
                Ok(Err(holder)) => {
                    self.holder.send_replace(Some(holder.clone()));
                    if waiting_on.as_deref() != Some(holder.as_str()) {
                        info!(
                            key = %key,
                            "standby: etcd key {key} at {} is held by the leader `{holder}`; \
                             waiting to take over when it stops or its lease expires (within {ttl_s}s)",
                            self.endpoints
                        );
                        waiting_on = Some(holder);
                    }
                }
                Err(e) => warn!("standby: {e}; trying again"),
            }
            tokio::select! {
                _ = sleep(STANDBY_POLL) => {}
                _ = shutdown.cancelled() => return Ok(None),
            }
        };
        let _ = self.fence.set(Fence {
            key: key.clone(),
            created,
        });
        info!(
            key = %key,
            lease = format!("{lease:x}"),
            "leader: holding etcd key {key} at {} (lease {ttl_s}s)",
            self.endpoints
        );
        let stop = Shutdown::new();
        let task = tokio::spawn(keep_alive(
            self.client.clone(),
            lease,
            ttl,
            key,
            self.endpoints.clone(),
            Arc::clone(&self.lost),
            self.lost_signal.clone(),
            stop.clone(),
        ));
        *self.leadership.lock().expect("leadership lock") = Some(Leadership { lease, stop, task });

        // One signal for both reasons to stop.
        let stopping = shutdown.child_token();
        let (lost, trip) = (self.lost_signal.clone(), stopping.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = lost.cancelled() => trip.cancel(),
                _ = trip.cancelled() => {}
            }
        });
        Ok(Some(stopping))
    }

    /// One attempt at the leader key: `Ok(Ok((lease, create revision)))` when
    /// taken, `Ok(Err(holder))` when another coordinator holds it.
    async fn try_take(
        &self,
        key: &str,
        identity: &str,
        ttl_s: i64,
    ) -> StoreResult<Result<(i64, i64), String>> {
        let mut client = self.client.clone();
        let lease = self
            .call("granting the leader lease", client.lease_grant(ttl_s, None))
            .await?
            .id();
        let txn = Txn::new()
            .when(vec![Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then(vec![TxnOp::put(
                key,
                identity,
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else(vec![TxnOp::get(key, None)]);
        let resp = match self
            .call("taking the leader key", self.kv.clone().txn(txn))
            .await
        {
            Ok(r) => r,
            Err(e) => {
                let _ = client.lease_revoke(lease).await;
                return Err(e);
            }
        };
        if resp.succeeded() {
            let created = resp.header().map(|h| h.revision()).unwrap_or_default();
            return Ok(Ok((lease, created)));
        }
        let _ = self
            .call("releasing an unused lease", client.lease_revoke(lease))
            .await;
        let holder = resp
            .op_responses()
            .into_iter()
            .find_map(|r| match r {
                TxnOpResponse::Get(g) => g
                    .kvs()
                    .first()
                    .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
                _ => None,
            })
            .unwrap_or_else(|| "(gone)".into());
        Ok(Err(holder))
    }
}

/// Keeps the leader lease alive every `ttl / 3`. The lease counts as lost
/// when etcd says it expired, or when no keep-alive went through for `ttl`
/// (etcd may have expired it meanwhile): then writes stop and `lost_signal` trips.
#[allow(clippy::too_many_arguments)]
async fn keep_alive(
    mut client: Client,
    lease: i64,
    ttl: Duration,
    key: String,
    endpoints: String,
    lost: Arc<AtomicBool>,
    lost_signal: Shutdown,
    stop: Shutdown,
) {
    let every = ttl / 3;
    let mut deadline = Instant::now() + ttl;
    let why = 'outer: loop {
        if stop.is_cancelled() {
            return;
        }
        if Instant::now() >= deadline {
            break format!(
                "no keep-alive reached etcd at {endpoints} for {}s",
                ttl.as_secs()
            );
        }
        let sent = Instant::now();
        let (mut keeper, mut stream) = match timeout(every, client.lease_keep_alive(lease)).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(e))) => {
                break format!("etcd at {endpoints} says the lease is gone ({e})")
            }
            Ok(Err(e)) => {
                warn!("leader lease keep-alive to etcd at {endpoints}: {e}; retrying");
                tokio::select! {
                    _ = sleep(Duration::from_millis(500)) => {}
                    _ = stop.cancelled() => return,
                }
                continue;
            }
            Err(_) => continue,
        };
        // Opening the stream sent the first keep-alive and read its answer.
        deadline = sent + ttl;
        loop {
            tokio::select! {
                _ = sleep(every) => {}
                _ = stop.cancelled() => return,
            }
            let sent = Instant::now();
            if keeper.keep_alive().await.is_err() {
                continue 'outer;
            }
            match timeout(every, stream.message()).await {
                Ok(Ok(Some(resp))) if resp.ttl() > 0 => deadline = sent + ttl,
                Ok(Ok(Some(_))) => break 'outer format!("etcd at {endpoints} expired the lease"),
                Ok(Ok(None)) | Ok(Err(_)) | Err(_) => {
                    warn!("leader lease keep-alive to etcd at {endpoints} got no answer; reconnecting");
                    continue 'outer;
                }
            }
        }
    };
    if !lost.swap(true, Ordering::SeqCst) {
        error!("lost the etcd leader key {key}: {why}; stopping so that a standby can take over");
        lost_signal.cancel();
    }
}

impl Store for EtcdStore {
    fn put_many(&self, entries: Vec<(String, Vec<u8>)>) -> BoxFuture<'_, StoreResult<()>> {
        Box::pin(async move {
            let mut chunk: Vec<TxnOp> = Vec::new();
            let mut bytes = 0;
            let total = entries.len();
            let mut iter = entries.into_iter().peekable();
            while let Some((k, v)) = iter.next() {
                let size = self.prefix.len() + k.len() + v.len() + 16;
                bytes += size;
                chunk.push(TxnOp::put(self.full(&k), v, None));
                let full = match iter.peek() {
                    None => true,
                    Some((nk, nv)) => {
                        chunk.len() >= MAX_TXN_OPS
                            || bytes + self.prefix.len() + nk.len() + nv.len() + 16 > MAX_TXN_BYTES
                    }
                };
                if full {
                    let what = if total == 1 {
                        format!("writing {}", self.full(&k))
                    } else {
                        format!("writing {total} keys under {}", self.prefix)
                    };
                    self.fenced_txn(&what, std::mem::take(&mut chunk))
                        .await
                        .map_err(|e| match e {
                            StoreError::Backend(m) if m.contains("too large") => StoreError::Backend(
                                format!("{m} (a value over etcd's --max-request-bytes, 1.5 MiB by default)"),
                            ),
                            e => e,
                        })?;
                    bytes = 0;
                }
            }
            Ok(())
        })
    }

    fn get(&self, key: String) -> BoxFuture<'_, StoreResult<Option<Vec<u8>>>> {
        Box::pin(async move {
            let full = self.full(&key);
            let mut resp = self
                .call(
                    &format!("reading {full}"),
                    self.kv.clone().get(full.clone(), None),
                )
                .await?;
            Ok(resp
                .take_kvs()
                .into_iter()
                .next()
                .map(|kv| kv.into_key_value().1))
        })
    }

    fn delete(&self, key: String) -> BoxFuture<'_, StoreResult<bool>> {
        Box::pin(async move {
            let full = self.full(&key);
            let resp = self
                .fenced_txn(
                    &format!("deleting {full}"),
                    vec![TxnOp::delete(full.clone(), None::<DeleteOptions>)],
                )
                .await?;
            Ok(resp.op_responses().into_iter().any(|r| match r {
                TxnOpResponse::Delete(d) => d.deleted() > 0,
                _ => false,
            }))
        })
    }

    fn delete_prefix(&self, prefix: String) -> BoxFuture<'_, StoreResult<usize>> {
        Box::pin(async move {
            let full = self.full(&prefix);
            let resp = self
                .fenced_txn(
                    &format!("deleting {full}*"),
                    vec![TxnOp::delete(
                        full.clone(),
                        Some(DeleteOptions::new().with_prefix()),
                    )],
                )
                .await?;
            Ok(resp
                .op_responses()
                .into_iter()
                .map(|r| match r {
                    TxnOpResponse::Delete(d) => d.deleted() as usize,
                    _ => 0,
                })
                .sum())
        })
    }

    fn scan_prefix(&self, prefix: String) -> BoxFuture<'_, StoreResult<Entries>> {
        Box::pin(async move {
            let full = self.full(&prefix);
            // A page read at a revision compacted meanwhile fails: start over.
            let mut tries = 0;
            loop {
                tries += 1;
                match self.scan_once(&full).await {
                    Err(StoreError::Backend(m)) if m.contains("compacted") && tries < 3 => continue,
                    r => return r,
                }
            }
        })
    }

    fn close(&self) -> BoxFuture<'_, StoreResult<()>> {
        let leadership = self.leadership.lock().expect("leadership lock").take();
        Box::pin(async move {
            if let Some(l) = leadership {
                l.stop.cancel();
                let _ = l.task.await;
                if !self.lost.load(Ordering::SeqCst) {
                    // Revoking deletes the leader key: a standby takes over now
                    // instead of when the lease would have expired.
                    let mut client = self.client.clone();
                    match self
                        .call("releasing the leader key", client.lease_revoke(l.lease))
                        .await
                    {
                        Ok(_) => info!("released the etcd leader key {}", leader_key(&self.prefix)),
                        Err(e) => warn!("{e}; a standby takes over when the lease expires"),
                    }
                }
            }
            self.closed.store(true, Ordering::SeqCst);
            if self.lost.load(Ordering::SeqCst) {
                return Err(self.lost_error());
            }
            Ok(())
        })
    }
}

impl EtcdStore {
    async fn scan_once(&self, full_prefix: &str) -> StoreResult<Entries> {
        let (mut start, end) = if full_prefix.is_empty() {
            (vec![0u8], vec![0u8])
        } else {
            (
                full_prefix.as_bytes().to_vec(),
                range_end(full_prefix.as_bytes()),
            )
        };
        let what = format!("reading keys under {full_prefix}");
        let mut revision = 0;
        let mut out = Vec::new();
        loop {
            let mut options = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
            if revision > 0 {
                options = options.with_revision(revision);
            }
            let mut resp = self
                .call(&what, self.kv.clone().get(start.clone(), Some(options)))
                .await?;
            if revision == 0 {
                revision = resp.header().map(|h| h.revision()).unwrap_or_default();
            }
            let more = resp.more();
            let kvs = resp.take_kvs();
            let Some(last) = kvs.last() else { break };
            start = last.key().to_vec();
            start.push(0);
            for kv in kvs {
                let (k, v) = kv.into_key_value();
                let k = String::from_utf8(k).map_err(|e| self.err(&what, e))?;
                let k = k
                    .strip_prefix(self.prefix.as_str())
                    .map(str::to_string)
                    .unwrap_or(k);
                out.push((k, v));
            }
            if !more {
                break;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_ends() {
        assert_eq!(range_end(b"/gpuctl/jobs/"), b"/gpuctl/jobs0".to_vec());
        assert_eq!(range_end(b"a\xff"), b"b".to_vec());
        assert_eq!(range_end(b"\xff\xff"), vec![0]);
        assert_eq!(normalize_prefix("/gpuctl"), "/gpuctl/");
        assert_eq!(normalize_prefix("/gpuctl/"), "/gpuctl/");
        assert_eq!(normalize_prefix(""), "");
    }
}

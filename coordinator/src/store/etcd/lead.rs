//! Leading through `{prefix}leader`: a key bound to a lease the leader keeps
//! alive. A second coordinator on the same prefix stands by until the key is
//! gone (the leader revoked its lease on the way out, or the lease expired),
//! then takes it. Every write of the leader is fenced by a compare on the
//! key's create revision, so a coordinator that lost its lease cannot write
//! over its successor's state: it stops instead. Kept apart from the
//! key-value operations because it has a life of its own (a keep-alive task,
//! a signal tripped on loss) that those only consult, through the fence.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};
use gpuctl_core::shutdown::Shutdown;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};
use tracing::{error, info, warn};

use super::conn::Conn;
use crate::store::backend::{StoreError, StoreResult};

/// Lifetime of the leader lease: how long a standby waits after a leader
/// died without revoking it.
pub const LEADER_TTL: Duration = Duration::from_secs(10);
/// How often a standby tries to take the leader key.
const STANDBY_POLL: Duration = Duration::from_secs(1);

/// The leader key under a prefix.
pub fn leader_key(prefix: &str) -> String {
    format!("{prefix}leader")
}

/// This coordinator's write fence: the leader key and the revision that created it.
#[derive(Clone)]
struct Fence {
    key: String,
    created: i64,
}

/// What [`Lead::step_down`] stops: the lease keep-alive of a leader.
struct Leadership {
    lease: i64,
    stop: Shutdown,
    task: JoinHandle<()>,
}

/// This coordinator's standing with the leader key: standing by, leading, or
/// having lost it.
pub(super) struct Lead {
    fence: OnceLock<Fence>,
    leadership: Mutex<Option<Leadership>>,
    /// Set when this coordinator lost the leader key; writes fail from then on.
    lost: Arc<AtomicBool>,
    /// Tripped when the leadership is lost (see [`Lead::lead`]).
    lost_signal: Shutdown,
    /// The leader key's value as a standby last read it (see [`Lead::holder`]).
    holder: watch::Sender<Option<String>>,
}

impl Lead {
    pub(super) fn new() -> Self {
        Lead {
            fence: OnceLock::new(),
            leadership: Mutex::new(None),
            lost: Arc::new(AtomicBool::new(false)),
            lost_signal: Shutdown::new(),
            holder: watch::Sender::new(None),
        }
    }

    /// The leader key's value while [`Lead::lead`] stands by: what a
    /// standby tells clients about the leader (crate::standby).
    pub(super) fn holder(&self) -> watch::Receiver<Option<String>> {
        self.holder.subscribe()
    }

    pub(super) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    pub(super) fn lost_error(&self, conn: &Conn) -> StoreError {
        let key = leader_key(&conn.prefix);
        StoreError::Backend(format!(
            "this coordinator no longer holds the etcd leader key {key} at {} (its lease expired); \
             another coordinator may have taken over, so it stops writing",
            conn.endpoints
        ))
    }

    fn mark_lost(&self, conn: &Conn) {
        if !self.lost.swap(true, Ordering::SeqCst) {
            error!("{}", self.lost_error(conn));
            self.lost_signal.cancel();
        }
    }

    /// A transaction of `ops`, fenced on the leader key once this coordinator leads.
    pub(super) async fn fenced_txn(
        &self,
        conn: &Conn,
        what: &str,
        ops: Vec<TxnOp>,
    ) -> StoreResult<TxnResponse> {
        if self.lost.load(Ordering::SeqCst) {
            return Err(self.lost_error(conn));
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
        let resp = conn.call(what, conn.kv.clone().txn(txn)).await?;
        if !resp.succeeded() {
            self.mark_lost(conn);
            return Err(self.lost_error(conn));
        }
        Ok(resp)
    }

    /// Takes the leader key `{prefix}leader`, waiting as a standby while another
    /// coordinator holds it. `identity` is stored in the key: the leader's
    /// URL first, which standbys hand to clients (crate::standby). Returns `None` when `shutdown` trips first; otherwise a child of
    /// `shutdown` that also trips when the leadership is lost.
    pub(super) async fn lead(
        &self,
        conn: &Conn,
        identity: &str,
        ttl: Duration,
        shutdown: Shutdown,
    ) -> StoreResult<Option<Shutdown>> {
        let key = leader_key(&conn.prefix);
        let ttl_s = ttl.as_secs().max(2) as i64;
        let mut waiting_on: Option<String> = None;
        let (lease, created) = loop {
            match try_take(conn, &key, identity, ttl_s).await {
                Ok(Ok(taken)) => break taken,
                Ok(Err(holder)) => {
                    self.holder.send_replace(Some(holder.clone()));
                    if waiting_on.as_deref() != Some(holder.as_str()) {
                        info!(
                            key = %key,
                            "standby: etcd key {key} at {} is held by the leader `{holder}`; \
                             waiting to take over when it stops or its lease expires (within {ttl_s}s)",
                            conn.endpoints
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
            conn.endpoints
        );
        let stop = Shutdown::new();
        let task = tokio::spawn(keep_alive(
            conn.client.clone(),
            lease,
            ttl,
            key,
            conn.endpoints.clone(),
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

    /// Stops the keep-alive and revokes the lease, which deletes the leader
    /// key: a standby takes over now instead of when the lease would have
    /// expired.
    pub(super) fn step_down<'a>(
        &'a self,
        conn: &'a Conn,
    ) -> impl std::future::Future<Output = ()> + 'a {
        let leadership = self.leadership.lock().expect("leadership lock").take();
        async move {
            let Some(l) = leadership else { return };
            l.stop.cancel();
            let _ = l.task.await;
            if !self.is_lost() {
                let mut client = conn.client.clone();
                match conn
                    .call("releasing the leader key", client.lease_revoke(l.lease))
                    .await
                {
                    Ok(_) => info!("released the etcd leader key {}", leader_key(&conn.prefix)),
                    Err(e) => warn!("{e}; a standby takes over when the lease expires"),
                }
            }
        }
    }
}

/// One attempt at the leader key: `Ok(Ok((lease, create revision)))` when
/// taken, `Ok(Err(holder))` when another coordinator holds it.
async fn try_take(
    conn: &Conn,
    key: &str,
    identity: &str,
    ttl_s: i64,
) -> StoreResult<Result<(i64, i64), String>> {
    let mut client = conn.client.clone();
    let lease = conn
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
    let resp = match conn
        .call("taking the leader key", conn.kv.clone().txn(txn))
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
    let _ = conn
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

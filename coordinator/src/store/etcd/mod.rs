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
//!
//! - A value over 512 KiB is stored in parts (`parts.rs`): a report of a
//!   thousand ranks and more outgrows one request.
//!
//! `conn.rs` holds the connection and its request timeout, `lead.rs` the leader
//! key and the fence; this file, the key-value operations on top of both.

use std::time::Duration;

use etcd_client::{DeleteOptions, GetOptions, TxnOp, TxnOpResponse, TxnResponse};
use futures::future::BoxFuture;
use gpuctl_core::shutdown::Shutdown;
use tokio::sync::watch;

use self::conn::Conn;
use self::lead::Lead;
use crate::store::backend::{Entries, Store, StoreError, StoreResult};
use crate::store::etcd_access::EtcdAccess;

mod conn;
mod lead;
mod parts;

pub use self::conn::{normalize_prefix, CONNECT_TIMEOUT, REQUEST_TIMEOUT};
pub use self::lead::{leader_key, LEADER_TTL};

/// Keys per transaction: etcd's default `--max-txn-ops`.
pub const MAX_TXN_OPS: usize = 128;
/// Bytes of keys and values per transaction, under etcd's default
/// `--max-request-bytes` (1.5 MiB) with room for the framing.
pub const MAX_TXN_BYTES: usize = 1024 * 1024;
/// Keys per range request of a scan.
pub const PAGE: i64 = 500;
/// Parts per range request: 32 MiB, well under a response's limit.
const PARTS_PAGE: i64 = 64;

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

pub struct EtcdStore {
    conn: Conn,
    lead: Lead,
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
        Ok(EtcdStore {
            conn: Conn::open(endpoints, prefix, access).await?,
            lead: Lead::new(),
        })
    }

    pub fn prefix(&self) -> &str {
        &self.conn.prefix
    }

    /// The leader key's value while [`EtcdStore::lead`] stands by: what a
    /// standby tells clients about the leader (crate::standby).
    pub fn holder(&self) -> watch::Receiver<Option<String>> {
        self.lead.holder()
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
        self.lead.lead(&self.conn, identity, ttl, shutdown).await
    }

    /// A transaction of `ops`, fenced on the leader key once this store leads.
    async fn fenced_txn(&self, what: &str, ops: Vec<TxnOp>) -> StoreResult<TxnResponse> {
        self.lead.fenced_txn(&self.conn, what, ops).await
    }

    fn full(&self, key: &str) -> String {
        self.conn.full(key)
    }
}

impl Store for EtcdStore {
    fn put_many(&self, entries: Vec<(String, Vec<u8>)>) -> BoxFuture<'_, StoreResult<()>> {
        Box::pin(async move {
            let total = entries.len();
            let units: Vec<Unit> = entries
                .into_iter()
                .flat_map(|(k, v)| units_of(self.full(&k), v))
                .collect();
            let mut chunk: Vec<TxnOp> = Vec::new();
            let mut bytes = 0;
            let mut iter = units.into_iter().peekable();
            while let Some(unit) = iter.next() {
                bytes += unit.bytes;
                chunk.extend(unit.ops);
                let full = match iter.peek() {
                    None => true,
                    Some(next) => {
                        chunk.len() + next.ops.len() > MAX_TXN_OPS
                            || bytes + next.bytes > MAX_TXN_BYTES
                    }
                };
                if full {
                    let what = if total == 1 {
                        format!("writing {}", unit.key)
                    } else {
                        format!("writing {total} keys under {}", self.conn.prefix)
                    };
                    self.fenced_txn(&what, std::mem::take(&mut chunk))
                        .await
                        .map_err(|e| match e {
                            StoreError::Backend(m) if m.contains("too large") => StoreError::Backend(
                                format!("{m} (a key over etcd's --max-request-bytes, 1.5 MiB by default)"),
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
                .conn
                .call(
                    &format!("reading {full}"),
                    self.conn.kv.clone().get(full.clone(), None),
                )
                .await?;
            let revision = resp.header().map(|h| h.revision()).unwrap_or_default();
            let Some(value) = resp
                .take_kvs()
                .into_iter()
                .next()
                .map(|kv| kv.into_key_value().1)
            else {
                return Ok(None);
            };
            let Some(manifest) = parts::Manifest::decode(&value) else {
                return Ok(Some(value));
            };
            // The parts as of the manifest's read: a later write's cannot mix in.
            let prefix = parts::parts_of(&full, &manifest.generation);
            let what = format!("reading the parts of {full}");
            let pieces = self
                .range(&what, &prefix, revision, PARTS_PAGE)
                .await?
                .into_iter()
                .map(|(_, v)| v)
                .collect();
            parts::join(&manifest, pieces)
                .map(Some)
                .map_err(|why| StoreError::Backend(format!("reading {full}: {why}")))
        })
    }

    fn delete(&self, key: String) -> BoxFuture<'_, StoreResult<bool>> {
        Box::pin(async move {
            let full = self.full(&key);
            let resp = self
                .fenced_txn(
                    &format!("deleting {full}"),
                    vec![
                        TxnOp::delete(full.clone(), None::<DeleteOptions>),
                        TxnOp::delete(
                            parts::all_parts(&full),
                            Some(DeleteOptions::new().with_prefix()),
                        ),
                    ],
                )
                .await?;
            // Whether the key itself existed, not its parts.
            Ok(resp
                .op_responses()
                .into_iter()
                .next()
                .is_some_and(|r| match r {
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
                    Ok(entries) => return join_parts(entries),
                    r => return r,
                }
            }
        })
    }

    fn close(&self) -> BoxFuture<'_, StoreResult<()>> {
        let stepping_down = self.lead.step_down(&self.conn);
        Box::pin(async move {
            stepping_down.await;
            self.conn.close();
            if self.lead.is_lost() {
                return Err(self.lead.lost_error(&self.conn));
            }
            Ok(())
        })
    }
}

impl EtcdStore {
    async fn scan_once(&self, full_prefix: &str) -> StoreResult<Entries> {
        let what = format!("reading keys under {full_prefix}");
        let kvs = self.range(&what, full_prefix, 0, PAGE).await?;
        let mut out = Vec::with_capacity(kvs.len());
        for (k, v) in kvs {
            let k = String::from_utf8(k).map_err(|e| self.conn.err(&what, e))?;
            let k = k
                .strip_prefix(self.conn.prefix.as_str())
                .map(str::to_string)
                .unwrap_or(k);
            out.push((k, v));
        }
        Ok(out)
    }

    /// Every key and value under `full_prefix` (every key with an empty
    /// one), `page` keys a request, all read at `revision` (0: at the first
    /// page's), so that one read is one snapshot however many pages it takes.
    async fn range(
        &self,
        what: &str,
        full_prefix: &str,
        mut revision: i64,
        page: i64,
    ) -> StoreResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let (mut start, end) = if full_prefix.is_empty() {
            (vec![0u8], vec![0u8])
        } else {
            (
                full_prefix.as_bytes().to_vec(),
                range_end(full_prefix.as_bytes()),
            )
        };
        let mut out = Vec::new();
        loop {
            let mut options = GetOptions::new().with_range(end.clone()).with_limit(page);
            if revision > 0 {
                options = options.with_revision(revision);
            }
            let mut resp = self
                .conn
                .call(what, self.conn.kv.clone().get(start.clone(), Some(options)))
                .await?;
            if revision == 0 {
                revision = resp.header().map(|h| h.revision()).unwrap_or_default();
            }
            let more = resp.more();
            let kvs = resp.take_kvs();
            let Some(last) = kvs.last() else { break };
            start = last.key().to_vec();
            start.push(0);
            out.extend(kvs.into_iter().map(|kv| kv.into_key_value()));
            if !more {
                break;
            }
        }
        Ok(out)
    }
}

/// Operations that go in one transaction, their bytes, and the key they write.
struct Unit {
    ops: Vec<TxnOp>,
    bytes: usize,
    key: String,
}

/// The transactions' pieces that write `value` at `full`: one put, or its
/// parts one a piece and then the manifest, whose transaction also deletes
/// every other generation's parts of the key.
fn units_of(full: String, value: Vec<u8>) -> Vec<Unit> {
    let Some((pieces, manifest)) = parts::split(&full, &value) else {
        return vec![Unit {
            bytes: full.len() + value.len() + 16,
            ops: vec![TxnOp::put(full.clone(), value, None)],
            key: full,
        }];
    };
    let mut units: Vec<Unit> = pieces
        .into_iter()
        .map(|(k, v)| Unit {
            bytes: k.len() + v.len() + 16,
            ops: vec![TxnOp::put(k, v, None)],
            key: full.clone(),
        })
        .collect();
    let all = parts::all_parts(&full);
    let mine = parts::parts_of(&full, &manifest.generation);
    units.push(Unit {
        bytes: 3 * all.len() + 128,
        ops: vec![
            TxnOp::put(full.clone(), manifest.encode(), None),
            TxnOp::delete(
                all.clone(),
                Some(DeleteOptions::new().with_range(mine.clone())),
            ),
            TxnOp::delete(
                range_end(mine.as_bytes()),
                Some(DeleteOptions::new().with_range(range_end(all.as_bytes()))),
            ),
        ],
        key: full,
    });
    units
}

/// The manifest a scan is filling: its entry's index, the manifest, its
/// parts' prefix, the parts so far.
type Open = (usize, parts::Manifest, String, Vec<Vec<u8>>);

/// A scan's entries with every value stored in parts whole again, and the
/// parts left out (they follow their manifest's key in key order).
fn join_parts(entries: Entries) -> StoreResult<Entries> {
    let mut out: Entries = Vec::with_capacity(entries.len());
    let mut open: Option<Open> = None;
    let close = |out: &mut Entries, open: Option<Open>| {
        if let Some((i, m, _, pieces)) = open {
            out[i].1 = parts::join(&m, pieces)
                .map_err(|why| StoreError::Backend(format!("reading {}: {why}", out[i].0)))?;
        }
        StoreResult::Ok(())
    };
    for (k, v) in entries {
        if parts::is_part(&k) {
            if let Some((_, _, prefix, pieces)) = open.as_mut() {
                if k.starts_with(prefix.as_str()) {
                    pieces.push(v);
                }
            }
            continue;
        }
        close(&mut out, open.take())?;
        if let Some(m) = parts::Manifest::decode(&v) {
            let prefix = parts::parts_of(&k, &m.generation);
            open = Some((out.len(), m, prefix, Vec::new()));
        }
        out.push((k, v));
    }
    close(&mut out, open.take())?;
    Ok(out)
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

//! The store's one writer: the scheduler hands it batches and goes on at
//! once, and it commits them in order, folding everything queued meanwhile
//! into one transaction (group commit). At a thousand nodes a job's results
//! arrive by the thousand within a second; one fsync each, awaited on the
//! scheduler's task, stalled every other request for seconds.
//!
//! Until a write is committed its entries stay in an overlay that reads
//! consult first, so whoever reads the store sees every write handed over
//! before, committed or not. A caller that must not answer before the data
//! is durable (a worker's result) waits on [`Durable`]: it resolves after the
//! commit that holds the write.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use super::{SharedEntries, Store, StoreError, StoreResult};

/// A transaction takes what is queued up to about this many bytes: the
/// store holds a transaction's pages in memory until it commits.
const GROUP_BYTES: usize = 16 << 20;

/// Resolves when the write it was handed with is committed.
pub struct Durable(oneshot::Receiver<StoreResult<()>>);

impl Durable {
    pub async fn wait(self) -> StoreResult<()> {
        self.0.await.unwrap_or_else(|_| {
            Err(StoreError::Backend(
                "the store's writer stopped before the write was committed".into(),
            ))
        })
    }
}

impl std::future::IntoFuture for Durable {
    type Output = StoreResult<()>;
    type IntoFuture = futures::future::BoxFuture<'static, StoreResult<()>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.wait())
    }
}

struct Op {
    /// Shared with the overlay: a job's end hands over hundreds of MB, and
    /// a copy each would double them.
    entries: Vec<(String, Arc<Vec<u8>>)>,
    /// The overlay generation of each entry, to drop it once committed.
    seqs: Vec<u64>,
    /// Starts a transaction of its own: see [`Writer::write_apart`].
    apart: bool,
    done: Option<oneshot::Sender<StoreResult<()>>>,
}

/// Entries handed over and not yet committed, by key, with the generation
/// that wrote them last.
#[derive(Default)]
struct Overlay {
    seq: u64,
    map: BTreeMap<String, (u64, Arc<Vec<u8>>)>,
}

#[derive(Clone)]
pub struct Writer {
    tx: mpsc::UnboundedSender<Op>,
    overlay: Arc<Mutex<Overlay>>,
}

impl Writer {
    /// Starts the writer task on the current tokio runtime.
    pub fn start(store: Arc<dyn Store>) -> Writer {
        let (tx, rx) = mpsc::unbounded_channel();
        let overlay: Arc<Mutex<Overlay>> = Arc::default();
        tokio::spawn(run(store, rx, overlay.clone()));
        Writer { tx, overlay }
    }

    /// Queues `entries` as one atomic write; readers see them at once.
    pub fn write(&self, entries: Vec<(String, Vec<u8>)>) -> Durable {
        self.hand_over(entries, false)
    }

    /// As [`Writer::write`], never in one transaction with what was handed
    /// over before: a job's report is committed without waiting for the
    /// 4,096 history runs that follow it (a fifth of a second more at a
    /// 4,096-node job's end, one scattered insert each).
    pub fn write_apart(&self, entries: Vec<(String, Vec<u8>)>) -> Durable {
        self.hand_over(entries, true)
    }

    fn hand_over(&self, entries: Vec<(String, Vec<u8>)>, apart: bool) -> Durable {
        let (done, rx) = oneshot::channel();
        let entries: Vec<(String, Arc<Vec<u8>>)> =
            entries.into_iter().map(|(k, v)| (k, Arc::new(v))).collect();
        let mut seqs = Vec::with_capacity(entries.len());
        {
            let mut o = self.overlay.lock().unwrap_or_else(|e| e.into_inner());
            for (k, v) in &entries {
                o.seq += 1;
                let seq = o.seq;
                o.map.insert(k.clone(), (seq, v.clone()));
                seqs.push(seq);
            }
        }
        let op = Op {
            entries,
            seqs,
            apart,
            done: Some(done),
        };
        if let Err(mpsc::error::SendError(op)) = self.tx.send(op) {
            forget(&self.overlay, &op);
            if let Some(done) = op.done {
                let _ = done.send(Err(StoreError::Backend(
                    "the store's writer stopped".into(),
                )));
            }
        }
        Durable(rx)
    }

    /// Resolves once everything handed over before is committed.
    pub fn flush(&self) -> Durable {
        self.write(Vec::new())
    }

    /// The uncommitted value of `key`, if one is queued.
    pub fn get(&self, key: &str) -> Option<Arc<Vec<u8>>> {
        let o = self.overlay.lock().unwrap_or_else(|e| e.into_inner());
        o.map.get(key).map(|(_, v)| v.clone())
    }

    /// Uncommitted entries under `prefix`, in key order.
    pub fn scan(&self, prefix: &str) -> Vec<(String, Arc<Vec<u8>>)> {
        let o = self.overlay.lock().unwrap_or_else(|e| e.into_inner());
        o.map
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, (_, v))| (k.clone(), v.clone()))
            .collect()
    }
}

fn forget(overlay: &Mutex<Overlay>, op: &Op) {
    let mut o = overlay.lock().unwrap_or_else(|e| e.into_inner());
    for ((k, _), seq) in op.entries.iter().zip(&op.seqs) {
        // A later write of the same key stays until its own commit.
        if o.map.get(k).is_some_and(|(s, _)| s == seq) {
            o.map.remove(k);
        }
    }
}

fn size(op: &Op) -> usize {
    op.entries.iter().map(|(k, v)| k.len() + v.len()).sum()
}

async fn run(
    store: Arc<dyn Store>,
    mut rx: mpsc::UnboundedReceiver<Op>,
    overlay: Arc<Mutex<Overlay>>,
) {
    // An op that must start a transaction of its own, taken while a group
    // was being filled.
    let mut held: Option<Op> = None;
    loop {
        let first = match held.take() {
            Some(op) => op,
            None => match rx.recv().await {
                Some(op) => op,
                None => break,
            },
        };
        let mut bytes = size(&first);
        let mut ops = vec![first];
        while bytes < GROUP_BYTES {
            match rx.try_recv() {
                Ok(op) if op.apart => {
                    held = Some(op);
                    break;
                }
                Ok(op) => {
                    bytes += size(&op);
                    ops.push(op);
                }
                Err(_) => break,
            }
        }
        // One value per key, the last handed over: etcd refuses a
        // transaction naming a key twice. Values stay shared with the
        // overlay (redb writes from them without a copy).
        let entries: SharedEntries = ops
            .iter()
            .flat_map(|op| op.entries.iter().cloned())
            .collect::<BTreeMap<String, Arc<Vec<u8>>>>()
            .into_iter()
            .collect();
        let result = if entries.is_empty() {
            Ok(())
        } else {
            // Each commit at debug level: a job's end is tens of them.
            let (count, began) = (entries.len(), std::time::Instant::now());
            let result = store.put_shared(entries).await;
            if result.is_ok() {
                let ms = began.elapsed().as_millis() as u64;
                debug!(entries = count, bytes, ms, "committed");
            }
            result
        };
        if let Err(e) = &result {
            warn!("could not store state: {e}");
        }
        for op in ops {
            forget(&overlay, &op);
            if let Some(done) = op.done {
                let _ = done.send(match &result {
                    Ok(()) => Ok(()),
                    Err(e) => Err(StoreError::Backend(e.to_string())),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RedbStore;

    #[tokio::test]
    async fn queued_writes_are_read_at_once_and_committed_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(RedbStore::open(&dir.path().join("s.redb")).unwrap());
        let w = Writer::start(store.clone());
        let mut last = None;
        for i in 0..200u32 {
            let d = w.write(vec![
                ("k/a".into(), i.to_be_bytes().to_vec()),
                (format!("k/n{i:03}"), vec![1]),
            ]);
            // Visible before any commit: the overlay answers.
            assert_eq!(w.get("k/a").unwrap().as_slice(), i.to_be_bytes());
            last = Some(d);
        }
        // Every key is readable now, queued or committed.
        let mut seen: std::collections::BTreeSet<String> =
            w.scan("k/n").into_iter().map(|(k, _)| k).collect();
        seen.extend(
            store
                .scan_prefix("k/n".into())
                .await
                .unwrap()
                .into_iter()
                .map(|(k, _)| k),
        );
        assert_eq!(seen.len(), 200);
        last.unwrap().await.unwrap();
        // Committed: the backend holds the last value of the key written 200
        // times and every other key, and the overlay let go of them.
        assert_eq!(
            store.get("k/a".into()).await.unwrap().unwrap(),
            199u32.to_be_bytes()
        );
        assert_eq!(store.scan_prefix("k/n".into()).await.unwrap().len(), 200);
        assert!(w.get("k/a").is_none() && w.scan("k/").is_empty());
        w.flush().await.unwrap();
    }

    /// A backend that records the keys of each transaction.
    struct Recording {
        inner: RedbStore,
        txs: Mutex<Vec<Vec<String>>>,
    }

    impl Store for Recording {
        fn put_many(
            &self,
            entries: Vec<(String, Vec<u8>)>,
        ) -> futures::future::BoxFuture<'_, StoreResult<()>> {
            let keys = entries.iter().map(|(k, _)| k.clone()).collect();
            self.txs.lock().unwrap().push(keys);
            self.inner.put_many(entries)
        }
        fn get(&self, key: String) -> futures::future::BoxFuture<'_, StoreResult<Option<Vec<u8>>>> {
            self.inner.get(key)
        }
        fn delete(&self, key: String) -> futures::future::BoxFuture<'_, StoreResult<bool>> {
            self.inner.delete(key)
        }
        fn scan_prefix(
            &self,
            prefix: String,
        ) -> futures::future::BoxFuture<'_, StoreResult<super::super::Entries>> {
            self.inner.scan_prefix(prefix)
        }
    }

    /// A write handed over apart starts a transaction: what came before is
    /// committed without it, what comes after may join it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_write_apart_is_not_committed_with_what_came_before() {
        let dir = tempfile::tempdir().unwrap();
        let rec = Arc::new(Recording {
            inner: RedbStore::open(&dir.path().join("s.redb")).unwrap(),
            txs: Mutex::default(),
        });
        let w = Writer::start(rec.clone());
        let one = |k: &str| vec![(k.to_string(), vec![1])];
        // All queued before the writer's task first runs (one thread).
        let a = w.write(one("a"));
        let b = w.write(one("b"));
        let c = w.write_apart(one("c"));
        let d = w.write(one("d"));
        let e = w.write_apart(one("e"));
        for durable in [a, b, c, d, e] {
            durable.await.unwrap();
        }
        let txs = rec.txs.lock().unwrap().clone();
        assert_eq!(txs, [vec!["a", "b"], vec!["c", "d"], vec!["e"]]);
    }
}

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
//!
//! Writes that nobody waits on to go on (a job's fleet history: 4,096
//! scattered inserts at 4,096 nodes) go in a second lane, committed in small
//! transactions only while the first lane is empty: one such commit took
//! 8.9 s when the file's pages had to be read back from disk, and the next
//! job's `Submit`, queued behind it, held the scheduler 5-6 s.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use super::backend::{SharedEntries, Store, StoreError, StoreResult};

/// A transaction takes what is queued up to about this many bytes: the
/// store holds a transaction's pages in memory until it commits.
const GROUP_BYTES: usize = 16 << 20;

/// Entries of a later write committed per transaction, between which the
/// first lane is looked at again.
const LATER_ENTRIES: usize = 256;

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
    /// The second lane: see [`Writer::write_later`].
    later: mpsc::UnboundedSender<Op>,
    overlay: Arc<Mutex<Overlay>>,
}

impl Writer {
    /// Starts the writer task on the current tokio runtime.
    pub fn start(store: Arc<dyn Store>) -> Writer {
        let (tx, rx) = mpsc::unbounded_channel();
        let (later, later_rx) = mpsc::unbounded_channel();
        let overlay: Arc<Mutex<Overlay>> = Arc::default();
        tokio::spawn(run(store, rx, later_rx, overlay.clone()));
        Writer { tx, later, overlay }
    }

    /// Queues `entries` as one atomic write; readers see them at once.
    pub fn write<V: Into<Arc<Vec<u8>>>>(&self, entries: Vec<(String, V)>) -> Durable {
        self.hand_over(entries, &self.tx)
    }

    /// Queues `entries` in the second lane: readers see them at once, and
    /// they are committed after what the first lane holds when they are
    /// handed over, in transactions of [`LATER_ENTRIES`] while the first
    /// lane is empty (not atomically). A later write's entry is not
    /// committed over a newer write of its key. [`Durable`] resolves once
    /// all of them are committed.
    pub fn write_later<V: Into<Arc<Vec<u8>>>>(&self, entries: Vec<(String, V)>) -> Durable {
        self.hand_over(entries, &self.later)
    }

    fn hand_over<V: Into<Arc<Vec<u8>>>>(
        &self,
        entries: Vec<(String, V)>,
        lane: &mpsc::UnboundedSender<Op>,
    ) -> Durable {
        let (done, rx) = oneshot::channel();
        let entries: Vec<(String, Arc<Vec<u8>>)> =
            entries.into_iter().map(|(k, v)| (k, v.into())).collect();
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
            done: Some(done),
        };
        if let Err(mpsc::error::SendError(op)) = lane.send(op) {
            forget(&self.overlay, &op);
            if let Some(done) = op.done {
                let _ = done.send(Err(StoreError::Backend(
                    "the store's writer stopped".into(),
                )));
            }
        }
        Durable(rx)
    }

    /// Resolves once everything handed over before to the first lane is
    /// committed.
    pub fn flush(&self) -> Durable {
        self.write(Vec::<(String, Vec<u8>)>::new())
    }

    /// Resolves once everything handed over before to the second lane is
    /// committed.
    pub fn flush_later(&self) -> Durable {
        self.write_later(Vec::<(String, Vec<u8>)>::new())
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

fn size(entries: &[(String, Arc<Vec<u8>>)]) -> usize {
    entries.iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// A later write being committed, [`LATER_ENTRIES`] at a time.
struct Later {
    op: Op,
    /// Entries committed so far.
    at: usize,
}

async fn run(
    store: Arc<dyn Store>,
    mut rx: mpsc::UnboundedReceiver<Op>,
    mut later_rx: mpsc::UnboundedReceiver<Op>,
    overlay: Arc<Mutex<Overlay>>,
) {
    let mut later: Option<Later> = None;
    let mut later_open = true;
    loop {
        // The first lane first; later work only while it is empty.
        let first = match rx.try_recv() {
            Ok(op) => op,
            Err(e) => {
                if let Some(l) = later.as_mut() {
                    if let Some(result) = commit_later_part(store.as_ref(), &overlay, l).await {
                        finish(&overlay, later.take().expect("a later write").op, &result);
                    }
                    continue;
                }
                tokio::select! {
                    biased;
                    op = rx.recv(), if e == TryRecvError::Empty => match op {
                        Some(op) => op,
                        None => continue,
                    },
                    op = later_rx.recv(), if later_open => {
                        match op {
                            Some(op) => later = Some(Later { op, at: 0 }),
                            None => later_open = false,
                        }
                        continue;
                    }
                    else => break,
                }
            }
        };
        let mut bytes = size(&first.entries);
        let mut ops = vec![first];
        while bytes < GROUP_BYTES {
            match rx.try_recv() {
                Ok(op) => {
                    bytes += size(&op.entries);
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
        let result = commit(store.as_ref(), entries, bytes).await;
        for op in ops {
            finish(&overlay, op, &result);
        }
    }
}

/// Commits the next part of `l`; the later write's result once it is over
/// (its last part committed, or a part failed, which fails the whole write).
async fn commit_later_part(
    store: &dyn Store,
    overlay: &Mutex<Overlay>,
    l: &mut Later,
) -> Option<StoreResult<()>> {
    let end = (l.at + LATER_ENTRIES).min(l.op.entries.len());
    let part = l.at..end;
    l.at = end;
    // An entry whose key was written again since is not ours to commit: the
    // newer write is queued in the first lane or was committed already (and
    // then dropped from the overlay, which only the newest write leaves).
    let entries: SharedEntries = {
        let o = overlay.lock().unwrap_or_else(|e| e.into_inner());
        l.op.entries[part.clone()]
            .iter()
            .zip(&l.op.seqs[part])
            .filter(|((k, _), seq)| o.map.get(k).is_some_and(|(s, _)| s == *seq))
            .map(|(e, _)| e.clone())
            .collect()
    };
    let bytes = size(&entries);
    match commit(store, entries, bytes).await {
        Err(e) => Some(Err(e)),
        Ok(()) if l.at >= l.op.entries.len() => Some(Ok(())),
        Ok(()) => None,
    }
}

async fn commit(store: &dyn Store, entries: SharedEntries, bytes: usize) -> StoreResult<()> {
    if entries.is_empty() {
        return Ok(());
    }
    // Each commit at debug level: a job's end is tens of them.
    let (count, began) = (entries.len(), std::time::Instant::now());
    let result = store.put_shared(entries).await;
    match &result {
        Ok(()) => {
            let ms = began.elapsed().as_millis() as u64;
            debug!(entries = count, bytes, ms, "committed");
        }
        Err(e) => warn!("could not store state: {e}"),
    }
    result
}

/// Drops `op`'s entries from the overlay and tells whoever waits.
fn finish(overlay: &Mutex<Overlay>, op: Op, result: &StoreResult<()>) {
    forget(overlay, &op);
    if let Some(done) = op.done {
        let _ = done.send(match result {
            Ok(()) => Ok(()),
            Err(e) => Err(StoreError::Backend(e.to_string())),
        });
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

    /// A backend that records the keys of each transaction, and once, when
    /// it commits the first key named `trigger`, hands the writer a write to
    /// its first lane (as a `Submit` that comes while a later write commits).
    struct Recording {
        inner: RedbStore,
        txs: Mutex<Vec<Vec<String>>>,
        trigger: Mutex<Option<(String, Writer)>>,
        /// A transaction naming this key fails.
        fail_on: Mutex<Option<String>>,
    }

    impl Recording {
        fn new(dir: &std::path::Path) -> Arc<Recording> {
            Arc::new(Recording {
                inner: RedbStore::open(&dir.join("s.redb")).unwrap(),
                txs: Mutex::default(),
                trigger: Mutex::default(),
                fail_on: Mutex::default(),
            })
        }
    }

    impl Store for Recording {
        fn put_many(
            &self,
            entries: Vec<(String, Vec<u8>)>,
        ) -> futures::future::BoxFuture<'_, StoreResult<()>> {
            let keys: Vec<String> = entries.iter().map(|(k, _)| k.clone()).collect();
            let mut trigger = self.trigger.lock().unwrap();
            if trigger.as_ref().is_some_and(|(k, _)| keys.contains(k)) {
                let (_, w) = trigger.take().unwrap();
                drop(w.write(vec![("main".into(), vec![1])]));
            }
            if let Some(k) = self.fail_on.lock().unwrap().as_ref() {
                if keys.contains(k) {
                    let e = StoreError::Backend(format!("refused {k}"));
                    return Box::pin(async move { Err(e) });
                }
            }
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
        ) -> futures::future::BoxFuture<'_, StoreResult<crate::store::Entries>> {
            self.inner.scan_prefix(prefix)
        }
    }

    fn later_keys(n: usize) -> Vec<(String, Vec<u8>)> {
        (0..n).map(|i| (format!("later/{i:04}"), vec![1])).collect()
    }

    /// A later write waits for what the first lane held when it came, and
    /// is committed in parts, between which a write to the first lane goes
    /// first.
    #[tokio::test(flavor = "current_thread")]
    async fn a_later_write_lets_the_first_lane_go_between_its_parts() {
        let dir = tempfile::tempdir().unwrap();
        let rec = Recording::new(dir.path());
        let w = Writer::start(rec.clone());
        *rec.trigger.lock().unwrap() = Some(("later/0000".into(), w.clone()));
        let one = |k: &str| vec![(k.to_string(), vec![1])];
        // All queued before the writer's task first runs (one thread).
        let a = w.write(one("a"));
        let later = w.write_later(later_keys(LATER_ENTRIES * 2 + 10));
        let b = w.write(one("b"));
        for durable in [a, later, b] {
            durable.await.unwrap();
        }
        w.flush().await.unwrap();
        let txs: Vec<(String, usize)> = rec
            .txs
            .lock()
            .unwrap()
            .iter()
            .map(|t| (t[0].clone(), t.len()))
            .collect();
        let part = |i: usize, n| (format!("later/{:04}", i * LATER_ENTRIES), n);
        assert_eq!(
            txs,
            [
                ("a".to_string(), 2), // a and b, before any later part
                part(0, LATER_ENTRIES),
                ("main".to_string(), 1), // came during the first part
                part(1, LATER_ENTRIES),
                part(2, 10),
            ]
        );
        assert_eq!(
            rec.inner.scan_prefix("later/".into()).await.unwrap().len(),
            LATER_ENTRIES * 2 + 10
        );
        assert!(w.scan("later/").is_empty());
    }

    /// A later write never puts back an older value over a newer write of
    /// the same key committed before it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_later_write_does_not_undo_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let rec = Recording::new(dir.path());
        let w = Writer::start(rec.clone());
        let mut old = later_keys(3);
        old[1].1 = b"old".to_vec();
        let later = w.write_later(old);
        let newer = w.write(vec![("later/0001".into(), b"new".to_vec())]);
        assert_eq!(w.get("later/0001").unwrap().as_slice(), b"new");
        newer.await.unwrap();
        w.flush_later().await.unwrap();
        later.await.unwrap();
        assert_eq!(
            rec.inner.get("later/0001".into()).await.unwrap().unwrap(),
            b"new"
        );
        assert_eq!(
            rec.inner.scan_prefix("later/".into()).await.unwrap().len(),
            3
        );
    }

    /// A part that fails fails the whole later write: whoever waits is told,
    /// its entries leave the overlay (readers fall back to the store), the
    /// parts after it are not committed, and the writer goes on.
    #[tokio::test(flavor = "current_thread")]
    async fn a_failed_part_fails_the_later_write_and_the_writer_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let rec = Recording::new(dir.path());
        let w = Writer::start(rec.clone());
        *rec.fail_on.lock().unwrap() = Some(format!("later/{LATER_ENTRIES:04}"));
        let later = w.write_later(later_keys(LATER_ENTRIES * 2 + 10));
        let err = later.await.unwrap_err();
        assert!(err.to_string().contains("refused later/0256"), "{err}");
        assert!(w.scan("later/").is_empty(), "the overlay forgets them");
        assert_eq!(
            rec.inner.scan_prefix("later/".into()).await.unwrap().len(),
            LATER_ENTRIES,
            "the first part stays; none after the failed one"
        );
        *rec.fail_on.lock().unwrap() = None;
        w.write_later(vec![("after".into(), vec![2])])
            .await
            .unwrap();
        w.write(vec![("first".into(), vec![3])]).await.unwrap();
        assert!(rec.inner.get("after".into()).await.unwrap().is_some());
    }
}

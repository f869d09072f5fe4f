//! The embedded store: one redb file, one table of string keys to bytes.
//! redb commits are durable (fsync) when `commit` returns, which is what lets the
//! coordinator acknowledge a result only once it is on disk.

use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use redb::{Database, ReadOnlyTable, ReadableDatabase, ReadableTable, TableDefinition};
use tracing::debug;

use super::backend::{Entries, SharedEntries, Store, StoreError, StoreResult};

const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");

/// redb's page cache, nine tenths of it for reads. Every committed page
/// enters the read cache while it has room, so a job's ~100 MB of telemetry
/// and report filled a 64 MB cache after the first big job and it stayed
/// full; at 16 MB a 4,096-node fleet's coordinator peaked ~90 MB lower and
/// stopped creeping up across 20 jobs. Reads that miss it come from the
/// kernel's page cache.
const CACHE_BYTES: usize = 16 << 20;

pub struct RedbStore {
    /// `None` once closed. Operations hold their own `Arc` while they run.
    db: RwLock<Option<Arc<Database>>>,
}

fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

/// One transaction writing every entry. Its inserts and its commit (the
/// fsync) are timed apart at debug level: a slow write is one or the other.
fn insert_all<'a>(
    db: &Database,
    entries: impl Iterator<Item = (&'a str, &'a [u8])>,
) -> Result<(), redb::Error> {
    let began = Instant::now();
    let tx = db.begin_write()?;
    {
        let mut table = tx.open_table(KV)?;
        for (k, v) in entries {
            table.insert(k, v)?;
        }
    }
    let inserted = began.elapsed();
    tx.commit()?;
    debug!(
        insert_ms = inserted.as_millis() as u64,
        commit_ms = (began.elapsed() - inserted).as_millis() as u64,
        "redb transaction"
    );
    Ok(())
}

impl RedbStore {
    /// Opens (or creates) the store file. redb locks the file, so a second
    /// coordinator on the same data folder fails here instead of corrupting it.
    pub fn open(path: &Path) -> StoreResult<Self> {
        // redb caches up to 1 GiB of pages by default: the coordinator's
        // resident memory would grow toward it with the store's size.
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create(path)
            .map_err(|e| {
                let hint = match e {
                    redb::DatabaseError::DatabaseAlreadyOpen => {
                        " (is another gpuctl-coordinator running on this --data-dir?)"
                    }
                    _ => "",
                };
                StoreError::Backend(format!("cannot open {}: {e}{hint}", path.display()))
            })?;
        // Create the table once, so that readers never meet a missing table.
        let tx = db.begin_write().map_err(backend)?;
        tx.open_table(KV).map_err(backend)?;
        tx.commit().map_err(backend)?;
        Ok(RedbStore {
            db: RwLock::new(Some(Arc::new(db))),
        })
    }

    /// Keys and bytes (key and value) under each first part of the key
    /// (`results`, `telemetry`, …) of the store file at `path`, which no
    /// coordinator holds: what takes a store's space (`gpuctl-sim bench`).
    pub fn usage(path: &Path) -> StoreResult<std::collections::BTreeMap<String, (u64, u64)>> {
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .open(path)
            .map_err(|e| StoreError::Backend(format!("cannot open {}: {e}", path.display())))?;
        let tx = db.begin_read().map_err(backend)?;
        let table = tx.open_table(KV).map_err(backend)?;
        let mut out = std::collections::BTreeMap::<String, (u64, u64)>::new();
        for item in table.iter().map_err(backend)? {
            let (k, v) = item.map_err(backend)?;
            let k = k.value();
            let part = k.split('/').next().unwrap_or(k);
            let e = out.entry(part.to_string()).or_default();
            e.0 += 1;
            e.1 += (k.len() + v.value().len()) as u64;
        }
        Ok(out)
    }

    /// redb is synchronous; run it off the async workers.
    fn blocking<T, F>(&self, f: F) -> BoxFuture<'_, StoreResult<T>>
    where
        T: Send + 'static,
        F: FnOnce(&Database) -> Result<T, redb::Error> + Send + 'static,
    {
        let db = self.db.read().expect("store lock").clone();
        Box::pin(async move {
            let db = db.ok_or_else(|| StoreError::Backend("the store is closed".into()))?;
            tokio::task::spawn_blocking(move || f(&db))
                .await
                .map_err(backend)?
                .map_err(backend)
        })
    }
}

impl Store for RedbStore {
    fn close(&self) -> BoxFuture<'_, StoreResult<()>> {
        let db = self.db.write().expect("store lock").take();
        Box::pin(async move {
            let Some(mut db) = db else { return Ok(()) };
            // Wait for operations still running, so the file lock is gone
            // when this returns and a new coordinator can open the file.
            for _ in 0..200 {
                match Arc::try_unwrap(db) {
                    Ok(db) => {
                        drop(db);
                        return Ok(());
                    }
                    Err(shared) => db = shared,
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(StoreError::Backend(
                "store operations did not finish within 2 s of closing".into(),
            ))
        })
    }

    fn put_many(&self, entries: Vec<(String, Vec<u8>)>) -> BoxFuture<'_, StoreResult<()>> {
        self.blocking(move |db| {
            insert_all(db, entries.iter().map(|(k, v)| (k.as_str(), v.as_slice())))
        })
    }

    fn put_shared(&self, entries: SharedEntries) -> BoxFuture<'_, StoreResult<()>> {
        self.blocking(move |db| {
            insert_all(db, entries.iter().map(|(k, v)| (k.as_str(), v.as_slice())))
        })
    }

    fn get(&self, key: String) -> BoxFuture<'_, StoreResult<Option<Vec<u8>>>> {
        self.blocking(move |db| {
            let tx = db.begin_read()?;
            let table = tx.open_table(KV)?;
            Ok(table.get(key.as_str())?.map(|v| v.value().to_vec()))
        })
    }

    fn delete(&self, key: String) -> BoxFuture<'_, StoreResult<bool>> {
        self.blocking(move |db| {
            let tx = db.begin_write()?;
            let existed = {
                let mut table = tx.open_table(KV)?;
                let old = table.remove(key.as_str())?;
                old.is_some()
            };
            tx.commit()?;
            Ok(existed)
        })
    }

    fn delete_prefix(&self, prefix: String) -> BoxFuture<'_, StoreResult<usize>> {
        self.blocking(move |db| {
            let tx = db.begin_write()?;
            let gone = {
                let mut table = tx.open_table(KV)?;
                let mut doomed = Vec::new();
                for item in table.range(prefix.as_str()..)? {
                    let (k, _) = item?;
                    let k = k.value();
                    if !k.starts_with(prefix.as_str()) {
                        break;
                    }
                    doomed.push(k.to_string());
                }
                for k in &doomed {
                    table.remove(k.as_str())?;
                }
                doomed.len()
            };
            tx.commit()?;
            Ok(gone)
        })
    }

    fn bytes_under(&self, prefix: String) -> BoxFuture<'_, StoreResult<u64>> {
        self.blocking(move |db| {
            let tx = db.begin_read()?;
            let table = tx.open_table(KV)?;
            let mut bytes = 0u64;
            for item in table.range(prefix.as_str()..)? {
                let (k, v) = item?;
                let k = k.value();
                if !k.starts_with(prefix.as_str()) {
                    break;
                }
                // The value's length, read in its page: nothing copied.
                bytes += (k.len() + v.value().len()) as u64;
            }
            Ok(bytes)
        })
    }

    fn scan_prefix(&self, prefix: String) -> BoxFuture<'_, StoreResult<Entries>> {
        self.blocking(move |db| {
            let tx = db.begin_read()?;
            let table = tx.open_table(KV)?;
            under(&table, &prefix)
        })
    }

    /// One read transaction on one blocking thread for all of them, read in
    /// one sweep of the keys ([`sweep`]).
    fn scan_prefixes(&self, prefixes: Vec<String>) -> BoxFuture<'_, StoreResult<Vec<Entries>>> {
        self.blocking(move |db| {
            let tx = db.begin_read()?;
            let table = tx.open_table(KV)?;
            sweep(&table, &prefixes)
        })
    }

    fn scan_keys(&self, prefix: String) -> BoxFuture<'_, StoreResult<Vec<String>>> {
        self.blocking(move |db| {
            let tx = db.begin_read()?;
            let table = tx.open_table(KV)?;
            let mut out = Vec::new();
            each_under(&table, &prefix, |k, _| out.push(k.to_string()))?;
            Ok(out)
        })
    }
}

/// Every entry of `table` under `prefix`, in key order.
fn under(table: &ReadOnlyTable<&str, &[u8]>, prefix: &str) -> Result<Entries, redb::Error> {
    let mut out = Vec::new();
    each_under(table, prefix, |k, v| out.push((k.to_string(), v.to_vec())))?;
    Ok(out)
}

/// `f` on every key and value of `table` under `prefix`, in key order.
fn each_under(
    table: &ReadOnlyTable<&str, &[u8]>,
    prefix: &str,
    mut f: impl FnMut(&str, &[u8]),
) -> Result<(), redb::Error> {
    for item in table.range(prefix..)? {
        let (k, v) = item?;
        let k = k.value();
        if !k.starts_with(prefix) {
            break;
        }
        f(k, v.value());
    }
    Ok(())
}

/// The entries under each of `prefixes`, from one walk over the keys from
/// the first prefix to the end of the last: every page read takes the
/// store's write-buffer lock, which a commit holds while it writes its
/// pages, and a descent of the tree per prefix made ~4 reads where the walk
/// makes one per leaf. After a 16,384 × 8 job, 64 nodes' runs took 1-2 s
/// a read that way while the job's telemetry was committed. Keys between
/// the prefixes are walked over, so the prefixes should lie close together
/// in key order (a run of nodes by name); when one is a prefix of another,
/// each is read alone.
fn sweep(
    table: &ReadOnlyTable<&str, &[u8]>,
    prefixes: &[String],
) -> Result<Vec<Entries>, redb::Error> {
    let sorted: std::collections::BTreeSet<&str> = prefixes.iter().map(String::as_str).collect();
    let sorted: Vec<&str> = sorted.into_iter().collect();
    if sorted.windows(2).any(|w| w[1].starts_with(w[0])) {
        return prefixes.iter().map(|p| under(table, p)).collect();
    }
    let mut found: Vec<Entries> = vec![Vec::new(); sorted.len()];
    if let Some(first) = sorted.first() {
        let mut at = 0;
        for item in table.range(*first..)? {
            let (k, v) = item?;
            let k = k.value();
            // Past the keys of this prefix: on to the next that may hold k.
            while at < sorted.len() && !k.starts_with(sorted[at]) && k > sorted[at] {
                at += 1;
            }
            let Some(p) = sorted.get(at) else { break };
            if k.starts_with(p) {
                found[at].push((k.to_string(), v.value().to_vec()));
            }
        }
    }
    // Each prefix's entries moved to where it was asked; copied only for a
    // prefix asked again.
    let mut given: Vec<Option<usize>> = vec![None; sorted.len()];
    let mut out: Vec<Entries> = Vec::with_capacity(prefixes.len());
    for p in prefixes {
        let i = (sorted.binary_search(&p.as_str())).expect("every prefix is sorted in");
        let entries = match given[i] {
            Some(first) => out[first].clone(),
            None => std::mem::take(&mut found[i]),
        };
        given[i] = given[i].or(Some(out.len()));
        out.push(entries);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The walk finds what a read per prefix finds, in the callers' order,
    /// with keys between and around the prefixes, a prefix asked twice, one
    /// with nothing under it, and prefixes of one another.
    #[tokio::test]
    async fn one_walk_reads_each_prefix_as_a_read_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(&dir.path().join("s.redb")).unwrap();
        let keys = [
            "history/a-1/1",
            "history/a/1",
            "history/a/2",
            "history/b/1",
            "history/bb/1",
            "history/c/1",
            "history/d/1",
            "nodes/a",
            "a",
        ];
        store
            .put_many(
                keys.iter()
                    .map(|k| (k.to_string(), k.as_bytes().to_vec()))
                    .collect(),
            )
            .await
            .unwrap();
        let ask = |v: &[&str]| v.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        for asked in [
            ask(&[
                "history/c/",
                "history/a/",
                "history/x/",
                "history/a-1/",
                "history/a/",
            ]),
            ask(&["history/b/", "history/d/"]),
            ask(&["history/b", "history/bb/", "history/a/"]),
            ask(&[]),
        ] {
            let mut alone = Vec::new();
            for p in &asked {
                alone.push(store.scan_prefix(p.clone()).await.unwrap());
            }
            assert_eq!(
                store.scan_prefixes(asked.clone()).await.unwrap(),
                alone,
                "{asked:?}"
            );
        }
    }
}

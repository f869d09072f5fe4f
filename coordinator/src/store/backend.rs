//! The storage contract: [`Store`], the small async key-value trait that the
//! redb and etcd backends implement, and the error and entry types it speaks.
//! It sits below everything else in `store/`, so that a backend and the typed
//! layer both depend on it and never on each other.

use futures::future::BoxFuture;

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

    /// The entries under each of `prefixes`, each as [`Self::scan_prefix`]
    /// gives them. This default reads them one after another; a backend
    /// that can read them in one trip does: the fleet view reads every
    /// node's runs, and at 16,384 nodes one trip a node took 2-67 s.
    fn scan_prefixes(&self, prefixes: Vec<String>) -> BoxFuture<'_, StoreResult<Vec<Entries>>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(prefixes.len());
            for p in prefixes {
                out.push(self.scan_prefix(p).await?);
            }
            Ok(out)
        })
    }

    /// The keys under `prefix`, in key order. This default reads the values
    /// too; a backend that can leave them does (the inventory's names,
    /// without 16,384 nodes' GPUs and checks).
    fn scan_keys(&self, prefix: String) -> BoxFuture<'_, StoreResult<Vec<String>>> {
        Box::pin(async move {
            let entries = self.scan_prefix(prefix).await?;
            Ok(entries.into_iter().map(|(k, _)| k).collect())
        })
    }

    /// Bytes (keys and values) of the entries whose key starts with
    /// `prefix`: what a job keeps in the store (`--keep-jobs-bytes`). This
    /// default reads the entries; a backend that can count without copying
    /// them does.
    fn bytes_under(&self, prefix: String) -> BoxFuture<'_, StoreResult<u64>> {
        Box::pin(async move {
            let entries = self.scan_prefix(prefix).await?;
            Ok(entries
                .iter()
                .map(|(k, v)| (k.len() + v.len()) as u64)
                .sum())
        })
    }

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

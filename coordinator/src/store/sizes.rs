//! What each ended job holds in the store, in bytes: `--keep-jobs-bytes`
//! deletes the jobs that ended first until the rest fit. A job is measured
//! once, when all it writes at its end (report, results, telemetry) is
//! committed, and again when late results are folded in; the figure is
//! stored beside it (`job-bytes/`), so that a restart reads one small key
//! per job, not every kept job's data again.
//!
//! Counting bytes as they are written would count every rewrite of a
//! running job's telemetry series (each GPU's, every 10 s) and of its
//! record; measuring what is there counts each key once.

use std::collections::BTreeMap;

use tracing::warn;

use super::backend::StoreResult;
use super::batch::Batch;
use super::keys;
use super::state::StateStore;

impl StateStore {
    /// Measures job `id` once everything queued before is committed (both
    /// of the writer's lanes), keeps the figure and stores it. A job no
    /// longer stored (deleted meanwhile) is not measured: `None`.
    pub async fn measure_job(&self, id: &str) -> StoreResult<Option<u64>> {
        self.writer.flush().wait().await?;
        self.writer.flush_later().wait().await?;
        let (prefixes, singles) = keys::job_keys(id);
        let mut bytes = 0u64;
        for prefix in prefixes {
            bytes += self.inner.bytes_under(prefix).await?;
        }
        for key in singles {
            if let Some(v) = self.inner.get(key.clone()).await? {
                bytes += (key.len() + v.len()) as u64;
            }
        }
        if self.inner.get(keys::job(id)).await?.is_none() {
            return Ok(None);
        }
        self.sizes().insert(id.to_string(), bytes);
        self.queue(Batch(vec![(
            keys::job_bytes(id),
            bytes.to_string().into_bytes(),
        )]));
        Ok(Some(bytes))
    }

    /// [`Self::measure_job`] on a task of its own: call once a job's end
    /// (report, telemetry, late results) is queued. A failure is logged;
    /// the job then counts as nothing toward `--keep-jobs-bytes`.
    pub fn measure_later(&self, id: &str) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, id) = (self.clone(), id.to_string());
        rt.spawn(async move {
            if let Err(e) = store.measure_job(&id).await {
                warn!(job = %id, "could not measure what the job holds in the store (--keep-jobs-bytes counts it as nothing): {e}");
            }
        });
    }

    /// The bytes job `id` holds in the store, once measured.
    pub fn job_size(&self, id: &str) -> Option<u64> {
        self.sizes().get(id).copied()
    }

    /// Reads the stored figures of the jobs in `jobs` (at load); figures of
    /// jobs not among them (deleted while being measured) are deleted.
    /// Returns the jobs of `jobs` without one, to measure.
    pub async fn load_job_sizes(&self, jobs: &[String]) -> StoreResult<Vec<String>> {
        let stored = self.inner.scan_prefix(keys::JOB_BYTES.to_string()).await?;
        let mut sizes = BTreeMap::new();
        for (key, value) in stored {
            let id = key.trim_start_matches(keys::JOB_BYTES).to_string();
            let bytes = String::from_utf8_lossy(&value).trim().parse::<u64>();
            match bytes {
                Ok(b) if jobs.contains(&id) => {
                    sizes.insert(id, b);
                }
                // An orphan, or not a number: measured again if its job is kept.
                _ => {
                    self.inner.delete(key).await?;
                }
            }
        }
        let missing = jobs
            .iter()
            .filter(|id| !sizes.contains_key(*id))
            .cloned()
            .collect();
        *self.sizes() = sizes;
        Ok(missing)
    }

    /// Forgets job `id`'s figure (its job is being deleted).
    pub(super) fn forget_size(&self, id: &str) {
        self.sizes().remove(id);
    }

    fn sizes(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, u64>> {
        self.sizes.lock().unwrap_or_else(|e| e.into_inner())
    }
}

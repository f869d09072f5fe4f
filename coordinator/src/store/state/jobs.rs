//! Jobs' records as the store keeps them: each record under `jobs/` and,
//! apart, its plan under `plans/` (written once, when the job starts; see
//! [`keys::PLANS`]). Every read puts the plan back, so that no caller sees
//! the split; a record stored with its plan inside (before the split) is
//! read as it is.

use std::collections::BTreeMap;

use gpuctl_proto::pb::{Job, Plan};
use prost::Message;

use super::{decode_each, decode_off, StateStore};
use crate::store::backend::{StoreError, StoreResult};
use crate::store::keys;

impl StateStore {
    /// Every stored job, with its plan.
    pub async fn jobs(&self) -> StoreResult<Vec<Job>> {
        let records = self.scan_raw(keys::JOBS.to_string()).await?;
        let plans = self.scan_raw(keys::PLANS.to_string()).await?;
        let size = records.values().chain(plans.values()).map(Vec::len).sum();
        decode_off(size, move || {
            let mut plans = decode_keyed::<Plan>(plans, keys::PLANS)?;
            let mut jobs: Vec<Job> = decode_each(records)?;
            for job in &mut jobs {
                if let Some(plan) = plans.remove(job.id.as_str()) {
                    job.plan = Some(plan);
                }
            }
            Ok(jobs)
        })
        .await
    }

    /// Job `id`, with its plan.
    pub async fn job(&self, id: &str) -> StoreResult<Option<Job>> {
        let Some(mut job) = self.get_msg::<Job>(keys::job(id)).await? else {
            return Ok(None);
        };
        if let Some(plan) = self.get_msg::<Plan>(keys::plan(id)).await? {
            job.plan = Some(plan);
        }
        Ok(Some(job))
    }

    /// Deletes job `id` whole: its results, logs, telemetry, report, the
    /// mark that its fleet history is due, its measured size, its plan,
    /// and last its record, so that a crash halfway leaves a job that is
    /// deleted again at the next start.
    /// Waits first for both of the writer's lanes, so that no queued write
    /// of the job brings a key back. Returns how many keys went.
    pub async fn delete_job(&self, id: &str) -> StoreResult<usize> {
        self.writer.flush().wait().await?;
        self.writer.flush_later().wait().await?;
        self.forget_size(id);
        let (prefixes, [report, due, plan, record]) = keys::job_keys(id);
        let mut gone = 0;
        for prefix in prefixes {
            gone += self.inner.delete_prefix(prefix).await?;
        }
        for key in [report, due, keys::job_bytes(id), plan, record] {
            gone += usize::from(self.inner.delete(key).await?);
        }
        Ok(gone)
    }
}

/// Each value decoded as an `M`, by the key's rest after `prefix`; a bad
/// one names its key.
fn decode_keyed<M: Message + Default>(
    all: BTreeMap<String, Vec<u8>>,
    prefix: &str,
) -> StoreResult<BTreeMap<String, M>> {
    all.into_iter()
        .map(|(key, bytes)| match M::decode(bytes.as_slice()) {
            Ok(m) => Ok((key[prefix.len()..].to_string(), m)),
            Err(source) => Err(StoreError::Decode { key, source }),
        })
        .collect()
}

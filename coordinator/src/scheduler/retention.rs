//! Ended jobs past `--keep-jobs`, or past `--keep-jobs-bytes` of the
//! store's data, are deleted whole, the most recently ended kept: from the
//! scheduler's map at once, from the store on a task of its own. Without it
//! the store grew by every job for the coordinator's life, ~160 MB of file
//! a job at 4,096 nodes × 8 GPUs (results, report, telemetry), and a count
//! of jobs alone let a bigger fleet's store grow 4× as fast as a smaller
//! one's. A job's bytes are measured by the store once its end is written
//! (`store::sizes`); one not measured yet counts as nothing until it is.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::background::drop_later;
use super::state::JobEntry;
use super::Scheduler;

impl Scheduler {
    /// Deletes the ended jobs past the newest `keep_jobs` or past
    /// `keep_jobs_bytes`: at once from memory, and from the store on the
    /// task returned. Cheap enough for every tick (a sort of the ended jobs).
    pub(super) fn delete_old_jobs(&mut self) -> Option<JoinHandle<()>> {
        let keep = Keep {
            jobs: self.cfg.keep_jobs,
            bytes: self.cfg.keep_jobs_bytes,
        };
        let doomed = past_keeping(&self.jobs, keep, |id| self.store.job_size(id).unwrap_or(0));
        if doomed.is_empty() {
            return None;
        }
        self.job_listing.changed();
        for id in &doomed {
            if let Some(entry) = self.jobs.remove(id) {
                drop_later(entry);
            }
        }
        let (store, deleted) = (self.store.clone(), self.counts.jobs_deleted.clone());
        // Out of the map, so no more of their lines go to the log writer;
        // those on their way are stored before the logs are deleted, or a
        // late one would be left behind as an orphan key.
        let flushed: Vec<_> = doomed.iter().map(|id| self.logs.forget(id)).collect();
        Some(tokio::spawn(async move {
            for (id, flushed) in doomed.into_iter().zip(flushed) {
                let _ = flushed.await;
                match store.delete_job(&id).await {
                    Ok(keys) => {
                        deleted.fetch_add(1, Ordering::Relaxed);
                        info!(job = %id, keys, "job deleted from the store (--keep-jobs, --keep-jobs-bytes)");
                    }
                    // Still listed in the store, so deleted again at the next start.
                    Err(e) => warn!(job = %id, "could not delete the job from the store: {e}"),
                }
            }
        }))
    }
}

/// What is kept of the ended jobs.
#[derive(Debug, Clone, Copy)]
pub struct Keep {
    /// Jobs, the latest ended.
    pub jobs: usize,
    /// Bytes in the store of those kept together; the job that ended last
    /// is kept whatever its size (its report was just made: someone reads it).
    pub bytes: u64,
}

/// The ended jobs past what `keep` keeps of those that ended last, latest
/// end first, `size` giving each one's bytes; none with work under way
/// (its report being made, or made again for results that came late).
pub fn past_keeping(
    jobs: &BTreeMap<String, JobEntry>,
    keep: Keep,
    size: impl Fn(&str) -> u64,
) -> Vec<String> {
    let mut ended: Vec<(u64, &String)> = jobs
        .iter()
        .filter(|(_, e)| e.state().is_terminal())
        .map(|(id, e)| (e.job.finished_unix_ms, id))
        .collect();
    // Ended last first; among equal ends, the newer id.
    ended.sort_unstable_by(|a, b| b.cmp(a));
    let mut bytes = 0u64;
    ended
        .into_iter()
        .enumerate()
        .filter(|(i, (_, id))| {
            bytes = bytes.saturating_add(size(id));
            *i >= keep.jobs || (*i > 0 && bytes > keep.bytes)
        })
        .filter(|(_, (_, id))| jobs[*id].settled())
        .map(|(_, (_, id))| id.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb::JobState;

    fn entry(id: &str, state: JobState, finished: u64) -> (String, JobEntry) {
        let mut e = JobEntry::default();
        e.job.id = id.into();
        e.job.set_state(state);
        e.job.finished_unix_ms = finished;
        (id.to_string(), e)
    }

    #[test]
    fn the_jobs_that_ended_last_are_kept_and_no_running_or_busy_one_goes() {
        let mut jobs: BTreeMap<String, JobEntry> = [
            // Submitted first, ended last: kept.
            entry("job-000001", JobState::Succeeded, 9_000),
            entry("job-000002", JobState::Failed, 2_000),
            entry("job-000003", JobState::Running, 0),
            entry("job-000004", JobState::Cancelled, 3_000),
            entry("job-000005", JobState::Succeeded, 5_000),
            entry("job-000006", JobState::Succeeded, 1_000),
        ]
        .into_iter()
        .collect();
        let keep = |jobs| Keep {
            jobs,
            bytes: u64::MAX,
        };
        let none = |_: &str| 0;
        assert_eq!(
            past_keeping(&jobs, keep(2), none),
            ["job-000004", "job-000002", "job-000006"]
        );
        // A report being made again for late results keeps its job.
        jobs.get_mut("job-000002").unwrap().stale = Some((1, 2));
        assert_eq!(
            past_keeping(&jobs, keep(2), none),
            ["job-000004", "job-000006"]
        );
        assert!(past_keeping(&jobs, keep(5), none).is_empty());
    }

    #[test]
    fn bytes_keep_the_latest_ended_that_fit_and_always_the_last_one() {
        let jobs: BTreeMap<String, JobEntry> = [
            entry("job-000001", JobState::Succeeded, 1_000),
            entry("job-000002", JobState::Failed, 2_000),
            entry("job-000003", JobState::Running, 0),
            entry("job-000004", JobState::Succeeded, 4_000),
        ]
        .into_iter()
        .collect();
        // A running job's bytes are not counted: it is not among the ended.
        let size = |id: &str| if id == "job-000004" { 70 } else { 30 };
        let keep = |bytes| Keep { jobs: 100, bytes };
        assert_eq!(
            past_keeping(&jobs, keep(100), size),
            ["job-000001"],
            "70 + 30 fit in 100, the third does not"
        );
        assert_eq!(past_keeping(&jobs, keep(130), size), Vec::<String>::new());
        // Bigger than the bound on its own: the last ended stays all the same.
        assert_eq!(
            past_keeping(&jobs, keep(10), size),
            ["job-000002", "job-000001"]
        );
    }
}

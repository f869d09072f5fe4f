//! Reports are built off the scheduler's task: at thousands of ranks a report
//! takes a good part of a second, and the scheduler must go on answering
//! heartbeats and people meanwhile.
//!
//! - A running job whose every rank reported is *judged* on a blocking
//!   thread: its verdict decides whether it succeeded, so it stays running
//!   (with its results handed to that thread) until [`ReportEvent::Judged`] comes
//!   back and it ends with the report already built.
//! - A job that ends for any other reason (failure, cancel, deadline, hang)
//!   ends at once; its report follows on a blocking thread, which queues it
//!   to the store and sends [`ReportEvent::ReportStored`].
//!
//! Meanwhile `GetReport` calls for the job wait (`state::Pending`). Results that
//! arrive late are stored at once and folded in together: the report is
//! made again from the store once they stop coming (a tick with none for
//! [`STALE_QUIET_MS`], or [`STALE_MAX_MS`] after the first), off the task.
//! At 32,768 ranks one rebuild takes seconds, and a fleet whose calls time
//! out sends its results again by the thousand.
//!
//! A rebuild holds every result of the job and its report in memory at
//! once: one job's at a time, and each job's at most once per
//! [`refold_gap_ms`]. A 16,384-node fleet fallen behind sends its failed
//! jobs' results for the whole minute they are taken; rebuilt every 10 s,
//! two jobs at once, the coordinator held gigabytes for those minutes.

use std::sync::Arc;
use std::time::Instant;

use gpuctl_proto::pb::{JobState, Report};
use tracing::{debug, info, warn};

use super::background;
use super::events::{Built, ReportEvent, ReportReply};
use super::recent;
use super::report_inputs::{from_store, ReportInputs};
use super::state::{JobEntry, Pending};
use super::Scheduler;
use crate::error::CoordinatorError;
use crate::judge::fleet;
use crate::judge::telemetry::Telemetry;
use crate::store::{Batch, Durable, StateStore, StoreError};

/// Late results are folded in once none came for this long…
pub const STALE_QUIET_MS: u64 = 2_000;
/// …or this long after the first, whichever is sooner.
pub const STALE_MAX_MS: u64 = 10_000;

/// A job's report is made again at most once per this much per rank: 2 s
/// at 4,096 ranks, 16 s at 32,768, 65 s at 131,072 (longer than results
/// are taken after a job's end: at most two rebuilds for its stragglers).
const REFOLD_GAP_US_PER_RANK: u64 = 500;

/// How long after its last rebuild a job of `world` ranks waits to be made
/// again (at least [`STALE_QUIET_MS`]).
pub fn refold_gap_ms(world: u32) -> u64 {
    (u64::from(world) * REFOLD_GAP_US_PER_RANK / 1000).max(STALE_QUIET_MS)
}

/// A job's last telemetry is queued to the store in writes of about this
/// size: the store holds a transaction's pages in memory until it commits,
/// and a job's end was one of 100 MB.
const TELEMETRY_WRITE_BYTES: usize = 8 << 20;

/// Queues a job's last telemetry to `store` after its report, in writes
/// of [`TELEMETRY_WRITE_BYTES`] (the store holds a transaction's pages in
/// memory until it commits), freeing each series once it is encoded.
pub(super) fn store_telemetry(store: &StateStore, job: &str, telemetry: Telemetry) {
    let queue = |part| drop(store.queue(part));
    Batch::telemetry_parts(job, telemetry.into_dirty(), TELEMETRY_WRITE_BYTES, queue);
}

/// Logs once `durable` (a job's report and end) is committed, with how long
/// after the job ended: the figure an operator waiting on reports watches.
pub(super) fn log_when_stored(job: &str, durable: Durable, since: Instant) {
    let job = job.to_string();
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(async move {
        match durable.wait().await {
            Ok(()) => info!(
                job = %job,
                ms = since.elapsed().as_millis() as u64,
                "report stored"
            ),
            // The writer logs the failed commit itself.
            Err(e) => debug!(job = %job, "report not stored: {e}"),
        }
    });
}

impl Scheduler {
    /// Reports made off the task come back: a verdict ends its job, a
    /// stored or remade report answers whoever waited.
    pub(super) async fn on_report(&mut self, ev: ReportEvent) {
        match ev {
            ReportEvent::Judged {
                job_id,
                attempt,
                state,
                message,
                built,
            } => self.judged(job_id, attempt, state, message, *built).await,
            ReportEvent::ReportStored { job_id, report } => {
                self.report_stored(job_id, *report).await
            }
            ReportEvent::Refolded { job_id, report } => {
                self.refolded(job_id, report.map(|r| *r)).await
            }
        }
    }

    /// Hands job `id`'s report to whoever waited for it, and keeps it a
    /// while for those who ask next.
    fn deliver(&mut self, id: &str, waiting: Vec<ReportReply>, report: Report) {
        let report = Arc::new(report);
        self.recent
            .keep(id, report.clone(), self.cfg.clock.now_ms());
        if !waiting.is_empty() {
            recent::answer(waiting, report);
        }
    }

    /// Hands a complete running job to a blocking thread for its verdict;
    /// whether the job is being judged (false: it is not complete).
    pub(super) fn judge_if_complete(&mut self, id: &str) -> bool {
        let Some(entry) = self.jobs.get_mut(id) else {
            return false;
        };
        if entry.judging() {
            return true;
        }
        let world = entry.world_size();
        if entry.state() != JobState::Running
            || entry.pending.is_some()
            || world == 0
            || ((entry.results.len() + entry.undelivered.len()) as u32) < world
        {
            return false;
        }
        entry.pending = Some(Pending {
            judging: true,
            ..Default::default()
        });
        let work = ReportInputs::take(entry, &self.cfg);
        let (id, attempt) = (id.to_string(), entry.job.attempt);
        let lane = self.first_lane.clone();
        background::judge("gpuctl-judge", move || {
            let mut work = work;
            let (began, ranks) = (work.since, work.results.len());
            let (state, message, built) = work.judge();
            info!(
                job = %id,
                ranks,
                ms = began.elapsed().as_millis() as u64,
                cpu_ms = gpuctl_core::cpu_time::thread_cpu_us() / 1_000,
                "judged; report made"
            );
            background::send(
                &lane,
                ReportEvent::Judged {
                    job_id: id,
                    attempt,
                    state,
                    message,
                    built: Box::new(built),
                },
            );
            drop(work);
        });
        true
    }

    /// A verdict came back: the job ends with its report.
    pub(super) async fn judged(
        &mut self,
        id: String,
        attempt: u32,
        state: JobState,
        message: String,
        built: Built,
    ) {
        let current = self
            .jobs
            .get(&id)
            .is_some_and(|e| e.job.attempt == attempt && e.state() == JobState::Running);
        if !current {
            // Its telemetry stored all the same; nothing of it freed on
            // this task (the results alone are tens of MB).
            let mut built = built;
            self.store_telemetry_later(&id, std::mem::take(&mut built.telemetry));
            background::drop_later(built);
            return;
        }
        let entry = self.jobs.get_mut(&id).expect("the job is there");
        let pending = entry.pending.take().unwrap_or_default();
        let mut built = built;
        let report = std::mem::take(&mut built.report);
        let stage_report = self.is_stage(&id).then(|| report.clone());
        self.deliver(&id, pending.waiting, report);
        self.finish_with(&id, state, message, None, Some(built))
            .await;
        if let Some(report) = stage_report {
            self.stage_ended(&id, state, &report).await;
        }
        if let Some(e) = self.jobs.get_mut(&id) {
            e.report_stored = true;
            if pending.straggled {
                e.mark_stale(self.cfg.clock.now_ms());
            }
        }
    }

    /// [`store_telemetry`] on a thread of its own, at the judge's priority.
    pub(super) fn store_telemetry_later(&self, id: &str, telemetry: Telemetry) {
        if telemetry.is_dirty() {
            let (store, id) = (self.store.clone(), id.to_string());
            background::judge("gpuctl-telemetry", move || {
                store_telemetry(&store, &id, telemetry);
                store.measure_later(&id);
            });
        } else {
            background::drop_later(telemetry);
            self.store.measure_later(id);
        }
    }

    /// Builds the report of a job that just ended on a blocking thread, which
    /// stores it and sends [`ReportEvent::ReportStored`]. The job's results and
    /// telemetry go with it.
    pub(super) fn build_report_later(&mut self, id: &str) {
        let Some(entry) = self.jobs.get_mut(id) else {
            return;
        };
        entry.pending = Some(Pending::default());
        let work = ReportInputs::take(entry, &self.cfg);
        let (store, fleet_view) = (self.store.clone(), self.fleet_view.clone());
        let lane = self.first_lane.clone();
        let id = id.to_string();
        background::judge("gpuctl-report", move || {
            // Queued before the scheduler hears of it, so that every read
            // that the scheduler answers from then on finds it stored.
            let mut work = work;
            let built = work.ended();
            log_when_stored(&id, store.queue(built.batch), built.since);
            fleet_view.store_runs(&id, built.history);
            background::send(
                &lane,
                ReportEvent::ReportStored {
                    job_id: id.clone(),
                    report: Box::new(built.report),
                },
            );
            drop(work);
            store_telemetry(&store, &id, built.telemetry);
            store.measure_later(&id);
        });
    }

    /// Makes the report of an ended job whose late results stopped coming
    /// again, once for all of them (called every tick): one job at a time,
    /// each no sooner than [`refold_gap_ms`] after its last rebuild.
    pub(super) fn refold_stale(&mut self) {
        if self.refolding.is_some() {
            return;
        }
        let now = self.cfg.clock.now_ms();
        let due = self
            .jobs
            .iter()
            .filter(|(_, e)| e.pending.is_none())
            .filter(|(_, e)| now.saturating_sub(e.refolded_ms) >= refold_gap_ms(e.world_size()))
            .find_map(|(id, e)| {
                let (first, last) = e.stale?;
                let quiet = now.saturating_sub(last) >= STALE_QUIET_MS;
                (quiet || now.saturating_sub(first) >= STALE_MAX_MS).then(|| id.clone())
            });
        if let Some(id) = due {
            self.rebuild_later(&id);
        }
    }

    /// Builds an ended job's report again from its stored results, off the
    /// task; [`ReportEvent::Refolded`] brings it back.
    fn rebuild_later(&mut self, id: &str) {
        let Some(entry) = self.jobs.get_mut(id) else {
            return;
        };
        entry.stale = None;
        entry.pending = Some(Pending::default());
        self.refolding = Some(id.to_string());
        let work = ReportInputs::copy(entry, &self.cfg);
        let (retired, store, lane) = (entry.retired, self.store.clone(), self.first_lane.clone());
        let fleet_view = self.fleet_view.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            let began = Instant::now();
            let report = match from_store(work, retired, &store).await {
                Ok(mut report) => {
                    // At 131,072 ranks one rebuild holds every result and
                    // the report at once: the bench reads how often.
                    info!(
                        job = %id,
                        ranks = report.world_size,
                        ms = began.elapsed().as_millis() as u64,
                        "report made again with late results"
                    );
                    // The late results may carry figures (links a stopped
                    // rank measured): the nodes' runs are made again too,
                    // under the same keys.
                    let runs = fleet::runs_of(&report)
                        .iter()
                        .fold(Batch::default(), Batch::run);
                    let mut batch = Batch::default().report(&mut report);
                    if !runs.is_empty() {
                        batch = batch.history_due(&id);
                    }
                    drop(store.queue(batch));
                    fleet_view.store_runs(&id, runs);
                    store.measure_later(&id);
                    Ok(Box::new(report))
                }
                Err(e) => {
                    warn!(job = %id, "could not make the report again with the late results: {e}");
                    Err(())
                }
            };
            if let Some(tx) = lane.upgrade() {
                let _ = tx
                    .send(ReportEvent::Refolded { job_id: id, report }.into())
                    .await;
            }
        });
    }

    /// A report made again is stored (or could not be made: the stored one
    /// stands); answer whoever waited meanwhile.
    pub(super) async fn refolded(&mut self, id: String, report: Result<Report, ()>) {
        if self.refolding.as_deref() == Some(id.as_str()) {
            self.refolding = None;
        }
        let Some(entry) = self.jobs.get_mut(&id) else {
            return;
        };
        entry.refolded_ms = self.cfg.clock.now_ms();
        let pending = entry.pending.take().unwrap_or_default();
        if pending.straggled {
            entry.mark_stale(self.cfg.clock.now_ms());
        }
        match report {
            Ok(report) => self.deliver(&id, pending.waiting, report),
            // Each reads the stored one.
            Err(()) => {
                for reply in pending.waiting {
                    self.get_report(&id, reply).await;
                }
            }
        }
    }

    /// The report of an ended job is stored: answer whoever waited, and
    /// fold in a result that arrived meanwhile.
    pub(super) async fn report_stored(&mut self, id: String, report: Report) {
        let Some(entry) = self.jobs.get_mut(&id) else {
            return;
        };
        let pending = entry.pending.take().unwrap_or_default();
        entry.report_stored = true;
        if pending.straggled {
            entry.mark_stale(self.cfg.clock.now_ms());
        }
        let stage_report = self.is_stage(&id).then(|| report.clone());
        self.deliver(&id, pending.waiting, report);
        if let Some(report) = stage_report {
            let state = self.jobs.get(&id).map_or(JobState::Failed, |e| e.state());
            self.stage_ended(&id, state, &report).await;
        }
    }

    /// An ended job's report built again from its stored results and
    /// telemetry (its stored report is gone).
    pub(super) async fn stored_report(&self, entry: &JobEntry) -> Result<Report, StoreError> {
        let work = ReportInputs::copy(entry, &self.cfg);
        from_store(work, entry.retired, &self.store).await
    }

    /// `GetReport`: a report on its way is waited for; otherwise as
    /// [`Scheduler::report`].
    pub(super) async fn get_report(&mut self, id: &str, reply: ReportReply) {
        let Some(entry) = self.jobs.get_mut(id) else {
            let _ = reply.send(Err(self.no_job(id)));
            return;
        };
        if let Some(p) = entry.pending.as_mut() {
            p.waiting.push(reply);
            return;
        }
        if let Some(report) = self.recent.get(id) {
            recent::answer(vec![reply], report);
            return;
        }
        if entry.report_stored {
            // Tens of megabytes at thousands of ranks: read and decoded on
            // a task of its own.
            let (store, id) = (self.store.clone(), id.to_string());
            tokio::spawn(async move {
                let answer = match store.report(&id).await {
                    Ok(Some(r)) => Ok(Arc::new(r)),
                    // Stored by this coordinator and gone: a failed commit,
                    // which the coordinator's log names.
                    Ok(None) => Err(CoordinatorError::Refused(format!(
                        "the report of {id} is not in the store; the coordinator's log says why"
                    ))),
                    Err(e) => Err(CoordinatorError::store(
                        format!("reading the report of {id}"),
                        e,
                    )),
                };
                let _ = reply.send(answer);
            });
            return;
        }
        let _ = reply.send(self.report(id).await.map(Arc::new));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bigger_job_is_rebuilt_less_often_and_the_biggest_past_the_late_window() {
        assert_eq!(refold_gap_ms(4), STALE_QUIET_MS);
        assert_eq!(refold_gap_ms(4_096), 2_048);
        assert_eq!(refold_gap_ms(32_768), 16_384);
        // Results are taken for 60 s after a job's end (`ranks::LATE_RESULT_MS`):
        // at 131,072 ranks one rebuild early, at most one more after.
        assert!(refold_gap_ms(131_072) > 60_000);
    }
}

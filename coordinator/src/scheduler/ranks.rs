//! What running ranks send: progress, results, exits, log lines and GPU
//! telemetry, and the telemetry series written while a job runs.

use gpuctl_core::timeline;
use gpuctl_proto::pb::{
    Ack, JobState, RankProgressReport, RankResult, StopReason, TelemetryBatch, WorkerExited,
    WorkerLog,
};
use tracing::{debug, warn};

use super::device;
use super::events::RankEvent;
use super::Scheduler;
use crate::error::CoordinatorError;
use crate::judge::report;
use crate::judge::telemetry::Encoded;
use crate::logs::LogBatch;
use crate::refusals::Refused;
use crate::store::{Batch, Durable};

/// What a worker hears back about its result: now (refused), or once the
/// result is durable.
enum Answer {
    Now((bool, String)),
    WhenStored(Durable, String),
}

/// How long after its job ended a rank's result is still taken: one in
/// flight as the job failed (another rank lost, say) is evidence; one that
/// comes later is not a worker's.
const LATE_RESULT_MS: u64 = 60_000;

/// How often a running job's telemetry series are written, at most often: a
/// coordinator crash loses this much of it, or more where
/// [`TELEMETRY_STORE_BYTES_PER_S`] binds.
const TELEMETRY_STORE_MS: u64 = 10_000;

/// Bytes a second the running jobs' telemetry is written at, at most
/// ([`Scheduler::store_telemetry`]).
const TELEMETRY_STORE_BYTES_PER_S: u64 = 4 << 20;

impl Scheduler {
    /// What ranks send, in the order below; the tick's share (telemetry
    /// written while a job runs) comes last.
    pub(super) async fn on_rank(&mut self, ev: RankEvent) {
        if let RankEvent::WorkerProgress { arrived_ms, .. }
        | RankEvent::WorkerResult { arrived_ms, .. } = &ev
        {
            self.heard(*arrived_ms);
        }
        match ev {
            RankEvent::WorkerProgress { report, reply, .. } => {
                let _ = reply.send(self.worker_progress(report));
            }
            RankEvent::WorkerResult { result, reply, .. } => match self.worker_result(result).await
            {
                Answer::Now(a) => {
                    let _ = reply.send(a);
                }
                // The worker hears back once its result is durable; the
                // scheduler goes on meanwhile.
                Answer::WhenStored(durable, message) => {
                    tokio::spawn(async move {
                        let a = match durable.wait().await {
                            Ok(()) => (true, message),
                            Err(e) => (false, format!("could not store the result: {e}")),
                        };
                        let _ = reply.send(a);
                    });
                }
            },
            RankEvent::WorkerExited { node, exited } => self.worker_exited(node, exited).await,
            RankEvent::WorkerLog { node, log } => self.worker_log(node, log),
            RankEvent::Telemetry { node, batch } => self.telemetry(node, batch),
        }
    }

    /// Notes how long a rank's report waited for the scheduler; a lag's
    /// start is logged, since hang clocks stand still from then on
    /// (`jobs::hearing`).
    fn heard(&mut self, arrived_ms: u64) {
        if let Some(waited_ms) = self.hearing.read(arrived_ms, self.cfg.clock.now_ms()) {
            warn!(
                waited_ms,
                "rank reports wait for the scheduler: their silence is not counted toward a hang until they are read on time"
            );
        }
    }

    /// Takes a rank's progress; the answer says when to send the next one
    /// (`gpuctl_core::spec::progress_interval_ms`).
    fn worker_progress(&mut self, report: RankProgressReport) -> Ack {
        let refuse = |message: String| Ack {
            ok: false,
            message,
            next_report_ms: 0,
        };
        let Some(entry) = self.jobs.get_mut(&report.job_id) else {
            return refuse(format!("unknown job `{}`", report.job_id));
        };
        if report.attempt != entry.job.attempt {
            return refuse(format!(
                "attempt {} of {} is over",
                report.attempt, report.job_id
            ));
        }
        if entry.state() != JobState::Running {
            return refuse(format!(
                "job {} is {}",
                report.job_id,
                entry.state().label()
            ));
        }
        let next_report_ms = entry.job.spec.as_ref().map_or(0, |spec| {
            gpuctl_core::spec::progress_interval_ms(entry.world_size(), spec) as u32
        });
        let Some(mut p) = report.progress else {
            return Ack {
                ok: true,
                message: "no progress in the report".into(),
                next_report_ms,
            };
        };
        // The plan says where a rank runs, not the rank (issue 46).
        p.node = entry
            .placement(p.rank)
            .map(|pl| pl.node.clone())
            .unwrap_or_default();
        if p.unix_ms == 0 {
            p.unix_ms = self.cfg.clock.now_ms();
        }
        if entry.placement(p.rank).is_some() {
            let before = entry.progress.get(&p.rank).map_or(0, |old| old.iterations);
            entry
                .watch
                .progress(p.rank, before, p.iterations, self.cfg.clock.now_ms());
        }
        entry.progress.insert(p.rank, p);
        Ack {
            ok: true,
            message: String::new(),
            next_report_ms,
        }
    }

    async fn worker_result(&mut self, mut result: RankResult) -> Answer {
        let Some(entry) = self.jobs.get_mut(&result.job_id) else {
            return Answer::Now((false, format!("unknown job `{}`", result.job_id)));
        };
        if result.attempt != entry.job.attempt {
            return Answer::Now((
                false,
                format!("attempt {} of {} is over", result.attempt, result.job_id),
            ));
        }
        let world = entry.world_size();
        let placement = entry.placement(result.rank).cloned();
        // A retired job keeps no placements: its ranks are 0..world.
        let known = placement.is_some() || (entry.retired && result.rank < world);
        if !known {
            return Answer::Now((
                false,
                format!(
                    "rank {} is not part of {} (world size {world})",
                    result.rank, result.job_id
                ),
            ));
        }
        if let Some(p) = placement {
            if let Err(why) = device::from_plan(&mut result, &p) {
                let sender = format!("rank {} of {}", result.rank, result.job_id);
                self.cfg.refusals.refuse(Refused::Result, &sender, &why);
                return Answer::Now((false, why));
            }
        }
        let id = result.job_id.clone();
        let rank = result.rank;
        // After the end a result is evidence only while it can still be in
        // flight: never for a cancelled job (a rank's secret stays valid,
        // and results posted after a cancel turned its ranks to pass).
        if entry.state() == JobState::Cancelled && !entry.results.contains_key(&rank) {
            return Answer::Now((
                false,
                format!("job {id} was cancelled: its results are no longer taken"),
            ));
        }
        let ending = entry.pending.is_some() || entry.state().is_terminal();
        if ending && entry.is_stored(rank) {
            // Sent again (its first call timed out): answered once the first
            // copy is durable, which everything queued so far will be.
            return Answer::WhenStored(self.store.flush(), "stored already".into());
        }
        if entry.state() == JobState::Cancelled {
            return Answer::WhenStored(self.store.flush(), "stored already".into());
        }
        let ended_ms = self
            .cfg
            .clock
            .now_ms()
            .saturating_sub(entry.job.finished_unix_ms);
        // Refused before it is marked: marked, the same result sent again
        // was answered "stored already" though it never was.
        if entry.state().is_terminal() && ended_ms > LATE_RESULT_MS {
            return Answer::Now((
                false,
                format!(
                    "job {id} ended {} s ago: results are taken for {} s after a job's end",
                    ended_ms / 1000,
                    LATE_RESULT_MS / 1000
                ),
            ));
        }
        if ending {
            entry.mark_stored(rank);
        }
        // A big job's ranks keep coarser timelines; workers thin theirs, an
        // older one's is thinned here.
        timeline::thin(&mut result, timeline::points_per_rank(world));
        // Durable before the worker hears back (the writer commits it before
        // anything queued after it): a crash from here on loses nothing.
        let durable = self.store.put_result(&result);
        self.counts.results += 1;
        // One line per rank is 32,768 lines at a big job's end: debug only.
        debug!(job = %id, rank, ok = result.ok, "result in");
        if let Some(p) = entry.pending.as_mut() {
            // The report is being made without it: folded in after.
            p.straggled = true;
            return Answer::WhenStored(durable, format!("stored; job {id} is ending"));
        }
        if entry.state().is_terminal() {
            entry.mark_stale(self.cfg.clock.now_ms());
            return Answer::WhenStored(durable, format!("stored; job {id} had already ended"));
        }
        // A rank that found the request cannot run ends the job at once:
        // its peers may wait for it in a rendezvous until a hang blames one.
        let request = (!result.ok)
            .then(|| gpuctl_core::request::of_rank(&result.error))
            .flatten()
            .map(|why| gpuctl_core::request::job_message(why, ""));
        entry.results.insert(rank, result);
        // A call that timed out at the worker may still be taken later.
        entry.undelivered.remove(&rank);
        entry.job.results_in = entry.results.len() as u32;
        if !self.judge_if_complete(&id) {
            if let Some(why) = request {
                self.finish(&id, JobState::Failed, why, None).await;
            }
        }
        Answer::WhenStored(durable, "stored".into())
    }

    async fn worker_exited(&mut self, node: String, ex: WorkerExited) {
        let Some(entry) = self.jobs.get_mut(&ex.job_id) else {
            return;
        };
        if ex.attempt != entry.job.attempt {
            return;
        }
        if !entry.holds(&node, ex.rank) {
            self.cfg.refusals.refuse(
                Refused::WorkerExit,
                &node,
                &format!(
                    "node {node} reported the exit of rank {} of {}, which the plan does not put on it",
                    ex.rank, ex.job_id
                ),
            );
            return;
        }
        let has_result = entry.results.contains_key(&ex.rank);
        if let Some(ended) = entry.ended.as_mut() {
            ended.grow(ex.rank as usize + 1);
            ended.insert(ex.rank as usize);
        }
        entry.exits.insert(ex.rank, ex.clone());
        if entry.state() != JobState::Running || has_result || entry.judging() {
            return;
        }
        let id = ex.job_id.clone();
        if report::undelivered(&ex) {
            // No fault of the node's: the job goes on, and is judged once
            // every other rank ended, this one unknown.
            entry.undelivered.insert(ex.rank);
            self.judge_if_complete(&id);
            return;
        }
        let label = entry
            .placement(ex.rank)
            .map(report::rank_label)
            .unwrap_or_else(|| format!("rank {} on node {node}", ex.rank));
        let stopped = ex.stopped_by() != StopReason::Unspecified;
        let how = if ex.exit_code == 0 && ex.signal.is_empty() && !stopped {
            "exited with code 0 without reporting a result".to_string()
        } else {
            report::exit_text(&ex)
        };
        self.finish(&id, JobState::Failed, format!("{label} {how}"), None)
            .await;
    }

    /// `GetLogs`' `settled`: `Some` once every line the job will have is
    /// with the log writer, answering when they are stored. That is once
    /// it ended and each rank's worker end was heard (the agent sends a
    /// worker's last lines before its end), or it did not start here, so
    /// nothing more can be known.
    pub(super) fn logs_settled(
        &self,
        id: &str,
    ) -> Result<Option<tokio::sync::oneshot::Receiver<()>>, CoordinatorError> {
        let entry = self.job(id)?;
        if !entry.state().is_terminal() {
            return Ok(None);
        }
        let heard = entry
            .ended
            .as_ref()
            .is_none_or(|e| e.count_ones(..) >= entry.world_size() as usize);
        Ok(heard.then(|| self.logs.stored()))
    }

    fn worker_log(&mut self, node: String, log: WorkerLog) {
        let Some(entry) = self.jobs.get(&log.job_id) else {
            return;
        };
        if log.lines.is_empty() {
            return;
        }
        if !entry.holds(&node, log.rank) {
            self.cfg.refusals.refuse(
                Refused::Log,
                &node,
                &format!(
                    "node {node} sent log lines of rank {} of {}, which the plan does not put on it",
                    log.rank, log.job_id
                ),
            );
            return;
        }
        self.counts.log_lines += log.lines.len() as u64;
        self.logs.send(LogBatch {
            job_id: log.job_id,
            rank: log.rank,
            node,
            lines: log.lines,
        });
    }

    /// Samples count toward the job they name, while it runs, from a node
    /// of its plan and of the GPUs that node registered; a batch naming
    /// another is refused whole and counted.
    fn telemetry(&mut self, node: String, batch: TelemetryBatch) {
        if let Some(entry) = self.jobs.get_mut(&batch.job_id) {
            if entry.state() == JobState::Running && entry.job.attempt == batch.attempt {
                if !entry.has_node(&node) {
                    self.cfg.refusals.refuse(
                        Refused::Telemetry,
                        &node,
                        &format!(
                            "node {node} sent telemetry for {}, which does not run on it",
                            batch.job_id
                        ),
                    );
                    return;
                }
                // A job keeps a series per GPU a sample names: a node naming
                // GPUs it did not register would grow them without bound and
                // show GPUs it does not have.
                let gpus = self.nodes.get(&node).map_or(&[][..], |e| &e.node.gpus[..]);
                let unknown = batch
                    .samples
                    .iter()
                    .find(|s| !gpus.iter().any(|g| g.index == s.index));
                if let Some(s) = unknown {
                    self.cfg.refusals.refuse(
                        Refused::Telemetry,
                        &node,
                        &format!(
                            "node {node} sent telemetry of GPU {} for {}, a GPU it did not register",
                            s.index, batch.job_id
                        ),
                    );
                    return;
                }
                self.counts.samples +=
                    entry.telemetry.add(&node, batch, self.cfg.clock.now_ms()) as u64;
            }
        }
    }

    /// The latest telemetry batch of every node of a job, for `gpuctl watch`.
    pub(super) fn latest_telemetry(
        &self,
        job_id: &str,
    ) -> Result<Vec<TelemetryBatch>, CoordinatorError> {
        Ok(self.job(job_id)?.telemetry.latest())
    }

    /// Writes a share of the telemetry series that changed, of every running
    /// job (all of them with `all`): each tick takes enough that every GPU's
    /// series is written about every [`TELEMETRY_STORE_MS`], so that a crash
    /// loses at most that much of it and no tick holds the scheduler with
    /// tens of thousands of series. Taking a series encodes only its newest
    /// bucket (the older ones are held encoded); the batch is made and
    /// queued off the task.
    ///
    /// These writes go in the store writer's second lane, one at a time, and
    /// at most [`TELEMETRY_STORE_BYTES_PER_S`]: every series is written again
    /// whole, so the bytes grow with the fleet and the job's length. At
    /// 16,384 nodes x 8 GPUs the writer committed 8-10 MB (~9,000 series) a
    /// second through a 2-minute job, 30 % of its time, and the whole of a
    /// 15-minute job's would be ~50 MB a second. A crash then loses up to
    /// the series' bytes over that rate (about 2 minutes of a 15-minute job
    /// at that size); a small fleet's every 10 s as before.
    pub(super) async fn store_telemetry(&mut self, all: bool) {
        use std::sync::atomic::Ordering;
        let now = self.cfg.clock.now_ms();
        if !all && now < self.telemetry_next_ms.load(Ordering::Acquire) {
            return;
        }
        let ticks = (TELEMETRY_STORE_MS / super::TICK.as_millis() as u64).max(1) as usize;
        let mut series: Vec<(String, Vec<Encoded>)> = Vec::new();
        for e in self.jobs.values_mut() {
            if e.state() != JobState::Running || !e.telemetry.is_dirty() {
                continue;
            }
            let share = if all {
                usize::MAX
            } else {
                e.telemetry.gpus().div_ceil(ticks).max(64)
            };
            series.push((e.job.id.clone(), e.telemetry.take_dirty_some(share)));
        }
        if series.is_empty() {
            return;
        }
        let batch = move || {
            let mut batch = Batch::default();
            for (job, list) in series {
                for s in list {
                    batch = batch.telemetry(&job, s);
                }
            }
            batch
        };
        if all {
            self.save(batch());
            return;
        }
        let (store, next) = (self.store.clone(), self.telemetry_next_ms.clone());
        next.store(u64::MAX, Ordering::Release);
        tokio::spawn(async move {
            let queued = tokio::task::spawn_blocking(move || {
                let batch = batch();
                let bytes = batch.bytes() as u64;
                (store.queue_later(batch), bytes)
            })
            .await;
            let mut pause_ms = 0;
            if let Ok((durable, bytes)) = queued {
                // A failed commit is logged by the writer; a later tick writes again.
                let _ = durable.wait().await;
                pause_ms = bytes * 1000 / TELEMETRY_STORE_BYTES_PER_S;
            }
            next.store(now + pause_ms, Ordering::Release);
        });
    }
}

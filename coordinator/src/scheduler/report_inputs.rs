//! What a report is made of, owned ([`ReportInputs`]), so that it can be
//! judged and built on a blocking thread while the scheduler goes on
//! (`reports.rs` decides when; this file is how): taken from a job as it
//! ends, copied from one whose late results are folded in.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use gpuctl_proto::pb::{Job, JobState, RankProgress, RankResult, Report, Verdict, WorkerExited};

use super::events::Built;
use super::state::{JobEntry, RETIRE_OVER_RANKS};
use super::SchedulerConfig;
use crate::jobs::hang::Watch;
use crate::judge::checks::health::HealthRules;
use crate::judge::checks::perf::rules::PerfRules;
use crate::judge::figures::Figures;
use crate::judge::fleet;
use crate::judge::report;
use crate::judge::telemetry::Telemetry;
use crate::store::{Batch, StateStore, StoreError, StoreResult};
use gpuctl_core::clock::Clock;

/// Everything a report is made of, owned, so that it can go to another
/// thread: the owned counterpart of `report::Inputs`.
pub(super) struct ReportInputs {
    /// See [`Built::since`].
    pub(super) since: Instant,
    pub(super) job: Job,
    pub(super) results: BTreeMap<u32, RankResult>,
    exits: BTreeMap<u32, WorkerExited>,
    progress: BTreeMap<u32, RankProgress>,
    watch: Watch,
    telemetry: Telemetry,
    health: Arc<HealthRules>,
    perf: Arc<PerfRules>,
    /// When a verdict or a rebuilt report is made, off the task.
    clock: Clock,
}

impl ReportInputs {
    /// Takes the results and telemetry of `entry` (a job keeps neither once
    /// its report is made) and copies the rest. A big job's exits, progress
    /// and clocks are taken too: it drops them once it ends
    /// ([`JobEntry::retire`]), and copying them held the scheduler 30-60 ms
    /// at 32,768 ranks, every other request waiting.
    pub(super) fn take(entry: &mut JobEntry, cfg: &SchedulerConfig) -> ReportInputs {
        let ranks: Vec<u32> = entry.results.keys().copied().collect();
        for rank in ranks {
            entry.mark_stored(rank);
        }
        let big = entry.world_size() > RETIRE_OVER_RANKS;
        fn part<T: Clone + Default>(v: &mut T, take: bool) -> T {
            if take {
                std::mem::take(v)
            } else {
                v.clone()
            }
        }
        ReportInputs {
            since: Instant::now(),
            job: entry.job.clone(),
            results: std::mem::take(&mut entry.results),
            exits: part(&mut entry.exits, big),
            progress: part(&mut entry.progress, big),
            watch: part(&mut entry.watch, big),
            telemetry: std::mem::take(&mut entry.telemetry),
            health: cfg.health_rules.clone(),
            perf: cfg.perf_rules.clone(),
            clock: cfg.clock.clone(),
        }
    }

    /// What `entry` has in memory, copied, without its results and
    /// telemetry: [`from_store`] reads those.
    pub(super) fn copy(entry: &JobEntry, cfg: &SchedulerConfig) -> ReportInputs {
        ReportInputs {
            since: Instant::now(),
            job: entry.job.clone(),
            results: BTreeMap::new(),
            exits: entry.exits.clone(),
            progress: entry.progress.clone(),
            watch: entry.watch.clone(),
            telemetry: Telemetry::default(),
            health: cfg.health_rules.clone(),
            perf: cfg.perf_rules.clone(),
            clock: cfg.clock.clone(),
        }
    }

    /// The report without the ranks' results, which [`ReportInputs::finish`] moves
    /// in, and the figures it was judged with.
    pub(super) fn build(&self, job: &Job, now: u64) -> (Report, Figures) {
        report::build_bare(&report::Inputs {
            job,
            results: &self.results,
            exits: &self.exits,
            progress: &self.progress,
            watch: &self.watch,
            telemetry: &self.telemetry,
            rules: &self.health,
            perf: &self.perf,
            now_ms: now,
        })
    }

    /// The report with what is stored beside it. What `self` keeps (the
    /// ranks' progress, exits and clocks) is for the caller to drop once
    /// the report is on its way: at 32,768 ranks freeing them took ~15 %
    /// of the judge's time.
    pub(super) fn finish(
        &mut self,
        judged: (Report, Figures),
        at_ms: u64,
        telemetry_bytes: u64,
    ) -> Built {
        let (mut report, figures) = judged;
        report.telemetry_bytes = telemetry_bytes;
        // At tens of thousands of ranks the results are a hundred MB or
        // more: the store gets the report without them (it has each), and
        // they are moved into it, not copied, for those who wait.
        // Encoding the report and making the runs each take a tenth of
        // judging 32,768 ranks, and neither needs the other.
        let (mut batch, history) = std::thread::scope(|s| {
            let runs = s.spawn(|| {
                fleet::runs(&report, &figures)
                    .iter()
                    .fold(Batch::default(), Batch::run)
            });
            let batch = Batch::default().bare_report(&report);
            let history = runs.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            (batch, history)
        });
        report::attach(&mut report, std::mem::take(&mut self.results));
        if !history.is_empty() {
            batch = batch.history_due(&report.job_id);
        }
        Built {
            report,
            at_ms,
            since: self.since,
            batch,
            history,
            telemetry: std::mem::take(&mut self.telemetry),
        }
    }

    /// The report of a job that ended for any reason but its verdict.
    pub(super) fn ended(&mut self) -> Built {
        let now = self.job.finished_unix_ms.max(1);
        let (judged, bytes) = self.measuring_telemetry(|w, job| w.build(job, now));
        self.finish(judged, now, bytes)
    }

    /// The verdict of a job whose every rank reported, and its report.
    pub(super) fn judge(&mut self) -> (JobState, String, Built) {
        let now = self.clock.now_ms();
        let ((state, message, judged), bytes) =
            self.measuring_telemetry(|w, job| w.verdict(job, now));
        (state, message, self.finish(judged, now, bytes))
    }

    /// `make`'s result, with what the job's telemetry takes in the store
    /// (`Report.telemetry_bytes`) measured on a second thread meanwhile:
    /// at 32,768 GPUs that is ~30 ms of encoded lengths. `make` has the
    /// job apart, to change as it judges ([`Self::verdict`]).
    pub(super) fn measuring_telemetry<T: Send>(
        &mut self,
        make: impl FnOnce(&ReportInputs, &mut Job) -> T + Send,
    ) -> (T, u64) {
        // The job's running view, no part of its report, goes before the
        // report's memory is taken.
        self.telemetry.forget_latest();
        let mut job = std::mem::take(&mut self.job);
        let id = job.id.clone();
        let this = &*self;
        let made = std::thread::scope(|s| {
            let bytes = s.spawn(|| this.telemetry.stored_bytes(&id));
            let made = make(this, &mut job);
            let bytes = bytes
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (made, bytes)
        });
        self.job = job;
        made
    }

    /// Built once as if the job succeeded (what almost every complete job
    /// does); a job that does not pass is judged as a running job, as always
    /// (a succeeded job is also held to the figures it was expected to
    /// produce, a running one not yet), and built again with its failure.
    /// One that passes as running failed only on those figures: it fails
    /// with the first build, which names the ranks that lacked them. (It
    /// ended "succeeded" beside a report whose ranks failed, and the fleet
    /// history, made from the report, already counted them failed.)
    /// `job` is changed in place, not copied, and left as the verdict ends
    /// it: a copy of a 131,072-rank plan is ~30 MB, held beside the
    /// results while the verdict is made.
    pub(super) fn verdict(&self, job: &mut Job, now: u64) -> (JobState, String, (Report, Figures)) {
        let results_in = self.results.len() as u32;
        let running = (job.state, job.finished_unix_ms, job.results_in);
        let end = |job: &mut Job, state: JobState| {
            job.set_state(state);
            job.finished_unix_ms = now;
            job.results_in = results_in;
        };
        end(job, JobState::Succeeded);
        let judged = self.build(job, now);
        let (first, first_why) = report::ranks_verdict(&judged.0);
        if first == Verdict::Pass {
            return (JobState::Succeeded, String::new(), judged);
        }
        (job.state, job.finished_unix_ms, job.results_in) = running;
        let (as_running, _) = self.build(job, now);
        let (verdict, why) = report::ranks_verdict(&as_running);
        if verdict == Verdict::Pass {
            end(job, JobState::Failed);
            job.message = first_why.clone();
            let (mut report, figures) = judged;
            report.state = job.state;
            return (JobState::Failed, first_why, (report, figures));
        }
        end(job, JobState::Failed);
        job.message = why.clone();
        (JobState::Failed, why, self.build(job, now))
    }
}

/// An ended job's report from its stored job, results and telemetry, with
/// the rest of `work`, built on a blocking thread.
pub(super) async fn from_store(
    mut work: ReportInputs,
    retired: bool,
    store: &StateStore,
) -> StoreResult<Report> {
    if retired {
        // A retired job keeps no plan in memory; the stored one has it.
        if let Some(job) = store.job(&work.job.id).await? {
            work.job = job;
        }
    }
    let (id, attempt) = (work.job.id.clone(), work.job.attempt);
    work.results = store
        .results(&id, attempt)
        .await?
        .into_iter()
        .map(|r| (r.rank, r))
        .collect();
    work.telemetry = Telemetry::from_stored(store.telemetry(&id).await?);
    tokio::task::spawn_blocking(move || {
        let (mut report, _) = work.build(&work.job, work.clock.now_ms());
        report.telemetry_bytes = work.telemetry.stored_bytes(&id);
        report::attach(&mut report, std::mem::take(&mut work.results));
        report
    })
    .await
    .map_err(|e| StoreError::Backend(format!("building the report failed: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb::{rank_result::Detail, JobSpec, Plan, RankPlacement, StressResult};

    const NOW: u64 = 9_000;

    /// A running stress job of `ranks` ranks, one a node, with a GPU each.
    fn running(ranks: u32) -> Job {
        let mut plan = Plan {
            world_size: ranks,
            ..Default::default()
        };
        for r in 0..ranks {
            plan.nodes.push(format!("node-{r}"));
            plan.ranks.push(RankPlacement {
                rank: r,
                node: format!("node-{r}"),
                node_rank: r,
                gpu_index: Some(0),
                ..Default::default()
            });
        }
        Job {
            id: "job-000001".into(),
            state: JobState::Running as i32,
            spec: Some(JobSpec {
                workload: "stress".into(),
                ..Default::default()
            }),
            plan: Some(plan),
            started_unix_ms: 1_000,
            ..Default::default()
        }
    }

    /// A stress result of an H100 (which has a built-in floor) that agrees
    /// with the others; with `figures`, the TFLOP/s a stress job that ran
    /// to its end is bound to report.
    fn stress(rank: u32, figures: bool) -> RankResult {
        let tflops = if figures { vec![600.0; 5] } else { vec![] };
        RankResult {
            rank,
            ok: true,
            device_name: "NVIDIA H100 80GB HBM3".into(),
            detail: Some(Detail::Stress(StressResult {
                digest: "d".into(),
                device_class: "H100".into(),
                checks: 10,
                dtype: "bf16".into(),
                matrix_size: 8192,
                tflops_median: if figures { 600.0 } else { 0.0 },
                tflops_per_interval: tflops,
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    fn inputs(job: Job, results: Vec<RankResult>) -> ReportInputs {
        ReportInputs {
            since: Instant::now(),
            job,
            results: results.into_iter().map(|r| (r.rank, r)).collect(),
            exits: BTreeMap::new(),
            progress: BTreeMap::new(),
            watch: Watch::default(),
            telemetry: Telemetry::default(),
            health: Arc::new(HealthRules::default()),
            perf: Arc::new(PerfRules::default()),
            clock: Clock::manual(NOW),
        }
    }

    /// The verdict changes the judge's job in place: ended as judged, with
    /// its plan and start as they were, whichever way it is reached.
    #[test]
    fn the_verdict_ends_the_job_in_place_as_judged() {
        // Every rank agrees: passed on the first build.
        let mut w = inputs(running(4), (0..4).map(|r| stress(r, true)).collect());
        let mut job = std::mem::take(&mut w.job);
        let (state, message, (report, _)) = w.verdict(&mut job, NOW);
        assert_eq!((state, message.as_str()), (JobState::Succeeded, ""));
        assert_eq!(job.state(), JobState::Succeeded);
        assert_eq!((job.finished_unix_ms, job.results_in), (NOW, 4));
        assert_eq!(report::ranks_verdict(&report).0, Verdict::Pass);

        // One rank failed, and another ended well without its figures:
        // failed on the build as a running job, which names the failed rank
        // alone (a job that failed is not held to every figure; as
        // succeeded, rank 1 would be named for its figures too).
        let mut results: Vec<_> = (0..4).map(|r| stress(r, true)).collect();
        results[1] = stress(1, false);
        results[2] = stress(2, false);
        results[2].ok = false;
        results[2].error = "CUDA error: an illegal memory access".into();
        let mut w = inputs(running(4), results);
        let mut job = std::mem::take(&mut w.job);
        let (state, message, (report, _)) = w.verdict(&mut job, NOW);
        assert_eq!(state, JobState::Failed);
        assert!(message.contains("rank 2"), "{message}");
        assert!(!message.contains("rank 1"), "{message}");
        assert_eq!(job.state(), JobState::Failed);
        assert_eq!(
            (job.message.as_str(), job.finished_unix_ms, job.results_in),
            (message.as_str(), NOW, 4)
        );
        assert_eq!(report.state(), JobState::Failed);
        assert_eq!(report::ranks_verdict(&report).0, Verdict::Fail);

        // Every rank ended well but none reported the figures a stress job
        // that ran to its end is bound to: it passes as a running job, and
        // fails on the first build, which names each rank.
        let mut w = inputs(running(4), (0..4).map(|r| stress(r, false)).collect());
        let mut job = std::mem::take(&mut w.job);
        let (state, message, (report, _)) = w.verdict(&mut job, NOW);
        assert_eq!(state, JobState::Failed);
        assert!(
            message.contains("rank 3") && message.contains("no stress_tflops"),
            "{message}"
        );
        assert_eq!(job.state(), JobState::Failed);
        assert_eq!(
            (job.message.as_str(), job.finished_unix_ms),
            (message.as_str(), NOW)
        );
        assert_eq!(
            report.state(),
            JobState::Failed,
            "the report says what the job is"
        );
        assert_eq!(
            (report.verdict(), report.reason.as_str()),
            (Verdict::Fail, message.as_str())
        );
        assert_eq!(job.started_unix_ms, 1_000);
        assert_eq!(
            job.plan,
            running(4).plan,
            "the plan is the job's own, untouched"
        );
    }
}

//! A job's life: submit (or only plan), start on free nodes, finish with a
//! stored report, cancel, deadlines; and the reads of jobs and reports.

use std::time::Duration;

use gpuctl_proto::pb::{CoordinatorMessage, Job, JobSpec, JobState, Node, Plan, Report};
use tracing::{debug, info, warn};

use super::assign::AssignmentInputs;
use super::background;
use super::events::{Built, JobEvent};
use super::reports;
use super::state::{self, job_id, JobEntry};
use super::{human, Scheduler};
use crate::error::CoordinatorError;
use crate::fleet::NodeEvent;
use crate::jobs::life::{self, JobStep};
use crate::jobs::{hang, timing};

use crate::plan::{planner, preflight};
use crate::store::{Batch, Durable};

/// What a submitter is told when its job's record could not be committed.
fn not_stored(e: crate::store::StoreError) -> CoordinatorError {
    CoordinatorError::store("could not store the job", e)
}

impl Scheduler {
    /// People submit and cancel jobs; the scheduler's threads bring back
    /// a submitted job's plan and a started job's assignments.
    pub(super) async fn on_job(&mut self, ev: JobEvent) {
        match ev {
            JobEvent::Submit { spec, reply } => self.submit_later(spec, reply),
            JobEvent::Planned { plan, reply } => {
                let submitted = match plan {
                    Ok(plan) => self.submit_planned(plan).await,
                    Err(e) => Err(e),
                };
                let (job, stored) = match submitted {
                    Ok(submitted) => submitted,
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        return;
                    }
                };
                // The submitter is told once the record is committed; the
                // scheduler goes on meanwhile.
                let lane = self.first_lane.clone();
                tokio::spawn(async move {
                    match stored.wait().await {
                        Ok(()) => drop(reply.send(Ok(job))),
                        Err(e) => {
                            let e = not_stored(e);
                            let (job_id, why) = (job.id, e.to_string());
                            if let Some(lane) = lane.upgrade() {
                                let ev = JobEvent::NotStored { job_id, why };
                                let _ = lane.send(ev.into()).await;
                            }
                            let _ = reply.send(Err(e));
                        }
                    }
                });
            }
            JobEvent::NotStored { job_id, why } => {
                self.finish(&job_id, JobState::Failed, why, None).await;
            }
            JobEvent::Cancel {
                job_id,
                reason,
                reply,
            } => {
                let _ = reply.send(self.cancel(job_id, reason).await);
            }
            JobEvent::Assignments {
                job_id,
                attempt,
                messages,
            } => self.send_assignments(job_id, attempt, messages).await,
        }
    }

    pub(super) fn job(&self, id: &str) -> Result<&JobEntry, CoordinatorError> {
        self.jobs.get(id).ok_or_else(|| self.no_job(id))
    }

    /// Why there is no job `id`: an id this coordinator gave out and no
    /// longer holds was deleted past `--keep-jobs` or `--keep-jobs-bytes` (ids are given out only
    /// to stored jobs, and only deletion takes one from the map).
    pub(super) fn no_job(&self, id: &str) -> CoordinatorError {
        let given = id
            .strip_prefix("job-")
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|n| n >= 1 && n <= self.job_seq && job_id(n) == id);
        if given {
            CoordinatorError::JobDeleted {
                id: id.to_string(),
                keep: self.cfg.keep_jobs,
                keep_bytes: self.cfg.keep_jobs_bytes,
            }
        } else {
            CoordinatorError::JobNotFound(id.to_string())
        }
    }

    /// The newest `limit` jobs (all with 0), oldest first.
    /// The newest `limit` jobs (0: all), oldest first, as summaries: a
    /// listing of jobs on thousands of GPUs must not carry every rank of
    /// every job (`GetJob` has them).
    pub(super) fn list_jobs(&self, limit: u32) -> Vec<Job> {
        let skip = match limit as usize {
            0 => 0,
            n => self.jobs.len().saturating_sub(n),
        };
        self.jobs
            .values()
            .skip(skip)
            .map(JobEntry::listed)
            .collect()
    }

    /// Plans, stores and starts a job here, on the task (a suite's stage;
    /// people's `Submit` plans off it, [`super::planning`]).
    pub(super) async fn submit(&mut self, spec: JobSpec) -> Result<Job, CoordinatorError> {
        let plan = self.plan(spec)?;
        let (job, stored) = self.submit_planned(plan).await?;
        if let Err(e) = stored.wait().await {
            let e = not_stored(e);
            self.finish(&job.id, JobState::Failed, e.to_string(), None)
                .await;
            return Err(e);
        }
        Ok(job)
    }

    /// Starts a job that `plan` was made for, its record queued: readers
    /// see it at once, and it is committed when the returned [`Durable`]
    /// resolves. Only then may the submitter be told of it. Not waited for
    /// here: the writer commits in order, and behind a 16,384 × 8 job's
    /// telemetry the record waited 1.4 s with the scheduler held.
    pub(super) async fn submit_planned(
        &mut self,
        plan: Plan,
    ) -> Result<(Job, Durable), CoordinatorError> {
        if let Some(e) = preflight::preflight_error(&plan) {
            return Err(e);
        }
        let spec = plan.spec.clone().unwrap_or_default();
        // The baseline as it is now: deleting or replacing it later does not
        // change how this job is judged.
        let baseline = match spec.baseline.trim() {
            "" => None,
            name => Some(
                self.store
                    .baseline(name)
                    .await
                    .map_err(|e| CoordinatorError::store("could not read the baseline", e))?
                    .ok_or_else(|| CoordinatorError::BaselineNotFound(name.to_string()))?,
            ),
        };
        let seq = self.job_seq + 1;
        let id = job_id(seq);
        let mut job = Job {
            id: id.clone(),
            spec: Some(spec),
            baseline,
            state: JobState::Pending as i32,
            attempt: 1,
            created_unix_ms: self.cfg.clock.now_ms(),
            ..Default::default()
        };
        let stored = self
            .store
            .queue(Batch::default().job(&mut job).job_seq(seq));
        self.job_seq = seq;
        self.counts.submitted += 1;
        info!(job = %id, workload = %job.spec.as_ref().map(|s| s.workload.as_str()).unwrap_or(""), "job submitted");
        self.job_listing.changed();
        self.jobs.insert(
            id.clone(),
            JobEntry {
                job,
                planned: Some(plan),
                ..Default::default()
            },
        );
        self.start_pending().await;
        if let Some(e) = self.jobs.get_mut(&id) {
            // It waits for nodes: planned again when they are free.
            e.planned = None;
        }
        // Bounded, as `gpuctl status` shows it: a 4,096-node job whole is
        // tens of megabytes to copy, and the CLI prints its id.
        Ok((self.job(&id)?.view_of(gpuctl_proto::VIEW_RANKS), stored))
    }

    /// Starts waiting jobs, oldest first, on whatever nodes are free.
    pub(super) async fn start_pending(&mut self) {
        let pending: Vec<String> = self
            .jobs
            .values()
            .filter(|j| j.state() == JobState::Pending)
            .map(|j| j.job.id.clone())
            .collect();
        for id in pending {
            let spec = self.jobs[&id].job.spec.clone().unwrap_or_default();
            let chosen: Option<Vec<String>> = match planner::choose(&spec, &self.candidates()) {
                Ok(Some(nodes)) => Some(nodes.iter().map(|n| n.name.clone()).collect()),
                Ok(None) => None,
                Err(e) => {
                    debug!(job = %id, "still waiting: {e}");
                    None
                }
            };
            if let Some(names) = chosen {
                self.start(&id, names).await;
            }
        }
    }

    async fn start(&mut self, id: &str, names: Vec<String>) {
        let now = self.cfg.clock.now_ms();
        let spec = self.jobs[id].job.spec.clone().unwrap_or_default();
        let planned = self.jobs.get_mut(id).and_then(|e| e.planned.take());
        let same = |p: &Plan| {
            let mut sorted: Vec<&String> = names.iter().collect();
            sorted.sort();
            p.nodes.iter().eq(sorted)
        };
        let mut plan = match planned.filter(same) {
            Some(plan) => plan,
            None => {
                let chosen: Vec<&Node> = names
                    .iter()
                    .filter_map(|n| self.nodes.get(n))
                    .map(|e| &*e.node)
                    .collect();
                planner::plan(&spec, &chosen)
            }
        };
        // Checked at submit on the nodes it would most likely get; it may
        // start on others. It fails as a whole then: no node is to blame.
        if let Err(e) = crate::plan::check_request(&spec, &plan) {
            if let Some(j) = self.jobs.get_mut(id) {
                j.set_plan(plan);
            }
            let why = gpuctl_core::request::job_message(
                &format!("{e}; on the nodes it was to start on"),
                "",
            );
            self.finish(id, JobState::Failed, why, None).await;
            return;
        }
        if let Some(err) = preflight::preflight_error(&plan) {
            if let Some(j) = self.jobs.get_mut(id) {
                j.set_plan(plan);
            }
            self.finish(id, JobState::Failed, err.to_string(), None)
                .await;
            return;
        }
        let deadline = timing::deadline(now, &spec);
        // This job's results will want the memory.
        self.recent.forget();
        let Some(entry) = self.jobs.get_mut(id) else {
            return;
        };
        let Ok(running) = life::transition(entry.life(), JobStep::Start) else {
            return;
        };
        entry.job.set_state(running);
        entry.job.started_unix_ms = now;
        self.job_listing.changed();
        // The assignments need no preflight checks (one or more per node).
        let checks = std::mem::take(&mut plan.checks);
        let to_assign = plan.clone();
        plan.checks = checks;
        entry.set_plan(plan);
        let plan = to_assign;
        entry.deadline_unix_ms = deadline;
        let attempt = entry.job.attempt;
        // The plan is stored this once: records written later leave it out.
        let batch = Batch::default().job(&mut entry.job).plan(&entry.job);
        // The nodes are not stored again: which job a node runs is known from
        // the running jobs at load. Each of a 4,096-node job's nodes, with its
        // GPUs and preflight, held the scheduler ~25 ms to encode at the job's
        // start and again at its end.
        for name in &plan.nodes {
            if let Some(n) = self.nodes.get_mut(name) {
                n.on(NodeEvent::JobSet { job: id }, now, &self.listing);
            }
        }
        self.save(batch);
        self.rdv.open(id, attempt);

        // Without the key no worker could report: fail now, saying why.
        let key = match self.store.rank_key().await {
            Ok(k) => k,
            Err(e) => {
                let msg = format!("no worker secrets: {e}");
                self.finish(id, JobState::Failed, msg, None).await;
                return;
            }
        };
        let nodes: Vec<(String, String)> = plan
            .nodes
            .iter()
            .filter_map(|name| {
                let n = self.nodes.get(name)?;
                Some((name.clone(), n.coordinator_url.clone()))
            })
            .collect();
        let work = AssignmentInputs {
            job_id: id.to_string(),
            attempt,
            spec,
            secrets: key.secrets(id, attempt),
            plan,
            deadline_unix_ms: deadline,
            nodes,
        };
        let lane = self.first_lane.clone();
        background::off_task(move || {
            let (job_id, attempt) = (work.job_id.clone(), work.attempt);
            let messages = work.build();
            background::send(
                &lane,
                JobEvent::Assignments {
                    job_id,
                    attempt,
                    messages,
                },
            );
        });
    }

    /// A started job's assignments, built: each goes on its node's session,
    /// unless the job ended meanwhile; a node whose session is gone fails
    /// the job, named.
    pub(super) async fn send_assignments(
        &mut self,
        id: String,
        attempt: u32,
        messages: Vec<(String, CoordinatorMessage)>,
    ) {
        let Some(entry) = self.jobs.get_mut(&id) else {
            return;
        };
        if entry.job.attempt != attempt || entry.state() != JobState::Running {
            return;
        }
        // From here each rank's worker may start, and its end be heard.
        let world = entry.world_size() as usize;
        entry.ended = Some(fixedbitset::FixedBitSet::with_capacity(world));
        let mut unreachable = Vec::new();
        for (name, msg) in messages {
            if !self.nodes.get(&name).is_some_and(|n| n.send(msg)) {
                unreachable.push(name);
            }
        }
        if let Some(plan) = self.jobs.get(&id).and_then(|e| e.job.plan.as_ref()) {
            info!(job = %id, nodes = %plan.nodes.join(","), world_size = plan.world_size, "job started");
        }
        if !unreachable.is_empty() {
            let msg = format!(
                "could not send the assignment to node {}: its agent session is gone",
                gpuctl_core::listing::names(&unreachable)
            );
            self.finish(&id, JobState::Failed, msg, None).await;
        }
    }

    /// Ends a job: state, stored report, nodes freed, other nodes told to stop,
    /// rendezvous waiters released. Does nothing to a job that already ended.
    pub(super) async fn finish(
        &mut self,
        id: &str,
        state: JobState,
        message: String,
        skip: Option<&str>,
    ) {
        self.finish_with(id, state, message, skip, None).await
    }

    /// [`Scheduler::finish`] with the report already built for exactly this
    /// ending (`prebuilt`, by [`Scheduler::judge_if_complete`]); without
    /// one, the report follows from a blocking thread
    /// ([`Scheduler::build_report_later`]).
    pub(super) async fn finish_with(
        &mut self,
        id: &str,
        state: JobState,
        message: String,
        skip: Option<&str>,
        prebuilt: Option<Built>,
    ) {
        let Some(entry) = self.jobs.get_mut(id) else {
            return;
        };
        let step = JobStep::End {
            state,
            verdict: prebuilt.is_some(),
        };
        // An ended job, or one whose verdict is being made (what happens
        // meanwhile, a node lost or a deadline, changes nothing).
        if let Err(why) = life::transition(entry.life(), step) {
            debug!(job = %id, to = state.label(), "not ended: {why}");
            return;
        }
        let now = prebuilt
            .as_ref()
            .map_or_else(|| self.cfg.clock.now_ms(), |b| b.at_ms);
        let since = prebuilt.as_ref().map(|b| b.since);
        entry.job.set_state(state);
        entry.job.message = message.clone();
        entry.job.finished_unix_ms = now;
        self.job_listing.changed();
        if prebuilt.is_none() {
            entry.job.results_in = entry.results.len() as u32;
        }
        let attempt = entry.job.attempt;
        let kind = entry.cancel_kind();
        let nodes: Vec<String> = entry
            .job
            .plan
            .as_ref()
            .map(|p| p.nodes.clone())
            .unwrap_or_default();
        let (mut batch, history, telemetry) = match prebuilt {
            Some(built) => (built.batch, built.history, Some(built.telemetry)),
            None => {
                self.build_report_later(id);
                (Batch::default(), Batch::default(), None)
            }
        };
        let entry = self.jobs.get_mut(id).expect("the job is there");
        // Results and telemetry went with the report (`ReportInputs::take`);
        // memory keeps only what a finished job shows.
        entry.slim();
        batch = batch.job(&mut entry.job);
        entry.retire();
        state::let_go_old(&mut self.jobs);
        drop(self.delete_old_jobs());
        for name in &nodes {
            let Some(n) = self.nodes.get_mut(name) else {
                continue;
            };
            // Not stored: see `start`.
            if n.node.current_job == id {
                n.on(NodeEvent::JobSet { job: "" }, now, &self.listing);
            }
            if state != JobState::Succeeded && skip != Some(name.as_str()) {
                n.send_cancel_as(id, attempt, &message, kind);
            }
        }
        self.rdv.close(id, attempt);
        match since {
            Some(since) => reports::log_when_stored(id, self.store.queue(batch), since),
            None => self.save(batch),
        }
        self.fleet_view.store_runs(id, history);
        if let Some(telemetry) = telemetry {
            // After the report: see `Built::telemetry`.
            self.store_telemetry_later(id, telemetry);
        }
        match state {
            JobState::Succeeded => info!(job = %id, "job succeeded"),
            _ => warn!(job = %id, state = state.label(), "job ended: {message}"),
        }
    }

    pub(super) async fn cancel(
        &mut self,
        id: String,
        reason: String,
    ) -> Result<Job, CoordinatorError> {
        if !self.job(&id)?.state().is_terminal() {
            let msg = if reason.trim().is_empty() {
                "cancelled by user".to_string()
            } else {
                format!("cancelled: {}", reason.trim())
            };
            self.finish(&id, JobState::Cancelled, msg, None).await;
        }
        // Bounded, as for `Submit`: the CLI prints the id and state.
        Ok(self.job(&id)?.view_of(gpuctl_proto::VIEW_RANKS))
    }

    /// Running jobs past their deadline (and its grace) fail, naming the ranks
    /// that have not reported.
    pub(super) async fn fail_overdue_jobs(&mut self) {
        let now = self.cfg.clock.now_ms();
        let overdue: Vec<(String, String)> = self
            .jobs
            .values()
            .filter(|j| {
                j.state() == JobState::Running
                    && !j.judging()
                    && timing::overdue(j.deadline_unix_ms, now)
            })
            .map(|j| {
                let missing: Vec<String> = j
                    .job
                    .plan
                    .iter()
                    .flat_map(|p| &p.ranks)
                    .filter(|p| !j.results.contains_key(&p.rank))
                    .take(8)
                    .map(|p| format!("{} on {}", p.rank, p.node))
                    .collect();
                let budget =
                    Duration::from_millis(j.deadline_unix_ms.saturating_sub(j.job.started_unix_ms));
                (
                    j.job.id.clone(),
                    format!(
                        "deadline passed ({} after start); ranks without a result: {}",
                        human(budget),
                        missing.join(", ")
                    ),
                )
            })
            .collect();
        for (id, msg) in overdue {
            self.finish(&id, JobState::Failed, msg, None).await;
        }
    }

    /// Running jobs with a rank that made no progress for the job's hang
    /// timeout fail, naming the rank to blame (`jobs::hang::find`); every
    /// worker of the job is then stopped with `CancelJob.kind` hang.
    pub(super) async fn fail_hung_jobs(&mut self) {
        let now = self.cfg.clock.now_ms();
        let hearing = &self.hearing;
        let heard = |t: u64| hearing.heard(t, now);
        let mut hung = Vec::new();
        for e in self.jobs.values_mut() {
            if e.state() != JobState::Running || e.judging() {
                continue;
            }
            if e.watch.since_ms == 0 {
                // The clock of ranks that never progress: the job's start as
                // this coordinator saw it.
                e.watch.since_ms = now;
            }
            let timeout = timing::hang_timeout(e.job.spec.as_ref());
            if !e.watch.may_have_hung(e.world_size(), hearing, now, timeout) {
                continue;
            }
            if let Some(mut h) = hang::find(&e.progress_clocks(heard), heard(now), timeout) {
                let from = h.rank.map_or(e.watch.since_ms, |r| e.watch.last_growth(r));
                let deaf = hearing.deaf_between(from, now);
                if deaf >= 1_000 {
                    let not_counted = format!(
                        " (not counting {} during which rank reports waited for the coordinator)",
                        human(Duration::from_secs(deaf.div_ceil(1_000)))
                    );
                    h.message.push_str(&not_counted);
                    h.why.push_str(&not_counted);
                }
                hung.push((e.job.id.clone(), h));
            }
        }
        for (id, h) in hung {
            let message = h.message.clone();
            if let Some(e) = self.jobs.get_mut(&id) {
                e.watch.hung = Some(h);
            }
            self.finish(&id, JobState::Failed, message, None).await;
        }
    }

    /// A running job's partial report from memory; an ended job's stored one.
    pub(super) async fn report(&self, id: &str) -> Result<Report, CoordinatorError> {
        let entry = self.job(id)?;
        if !entry.state().is_terminal() {
            return Ok(entry.report(self.cfg.clock.now_ms(), &self.cfg));
        }
        let unavailable = |e| CoordinatorError::store(format!("reading the report of {id}"), e);
        if let Some(r) = self.store.report(id).await.map_err(unavailable)? {
            return Ok(r);
        }
        self.stored_report(entry).await.map_err(unavailable)
    }
}

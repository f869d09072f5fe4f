//! The scheduler: one task owns the fleet and job state and processes typed
//! [`Event`]s in order, so there are no locks around state and every transition
//! happens in one place (docs/architecture.md, "Job life"). gRPC handlers talk
//! to it through a [`SchedulerHandle`] and await the reply.

pub mod events;
pub mod health;
pub mod nccl_env;
pub mod planner;
pub mod report;
pub mod state;
pub mod telemetry;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use gpuctl_proto::now_ms;
use gpuctl_proto::pb::{
    coordinator_message::Msg, Assignment, AssignmentAck, CancelJob, CoordinatorMessage, Heartbeat,
    Job, JobSpec, JobState, Node, NodeState, Plan, RankProgressReport, RankResult, RegisterRequest,
    RegisterResponse, Report, TelemetryBatch, WorkerExited, WorkerLog,
};
use gpuctl_proto::shutdown::Shutdown;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tonic::Status;
use tracing::{debug, info, warn};

pub use events::{Event, Reply, SessionTx};
use health::HealthRules;
use state::{job_id, JobEntry, NodeEntry, Session};
use telemetry::Telemetry;

use crate::logs::{LogBatch, LogSink};
use crate::metrics::Snapshot;
use crate::rendezvous::Rendezvous;
use crate::store::{Batch, StateStore, StoreError};

/// How often lost nodes, deadlines and waiting jobs are looked at.
pub const TICK: Duration = Duration::from_millis(500);
/// Grace after a job's deadline before the coordinator fails it itself; the
/// agent kills the workers at the deadline and should report first.
const DEADLINE_GRACE_MS: u64 = 10_000;
/// Timed workloads get their duration plus this for start-up and reporting.
const TIMED_GRACE_MS: u64 = 120_000;
const DEFAULT_TIMEOUT_MS: u64 = 3_600_000;
/// A node still running a job this long after it ended is told again to stop.
const STALE_JOB_MS: u64 = 5_000;
/// How often a running job's telemetry series are written: a coordinator crash
/// loses at most this much of it.
const TELEMETRY_STORE_MS: u64 = 10_000;

pub const RESTART_MESSAGE: &str = "coordinator restarted during the run";

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    pub node_timeout: Duration,
    pub heartbeat_interval: Duration,
    pub health_rules: Arc<HealthRules>,
}

/// How gRPC handlers reach the scheduler task.
#[derive(Clone)]
pub struct SchedulerHandle {
    tx: mpsc::Sender<Event>,
}

fn stopped() -> Status {
    Status::unavailable("the coordinator is shutting down")
}

impl SchedulerHandle {
    /// Sends an event that carries a reply and waits for the answer.
    pub async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Event) -> Result<T, Status> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(make(tx)).await.map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())
    }

    /// Sends an event that needs no answer.
    pub async fn tell(&self, event: Event) {
        if self.tx.send(event).await.is_err() {
            debug!("scheduler stopped; event dropped");
        }
    }
}

/// How long a job may run before its workers are killed.
pub fn job_budget_ms(spec: &JobSpec) -> u64 {
    let timed = gpuctl_proto::spec::workload(&spec.workload).is_some_and(|w| w.timed);
    if spec.timeout_ms > 0 {
        spec.timeout_ms
    } else if timed {
        spec.duration_ms + TIMED_GRACE_MS
    } else {
        DEFAULT_TIMEOUT_MS
    }
}

fn human(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

pub struct Scheduler {
    cfg: SchedulerConfig,
    store: StateStore,
    rdv: Rendezvous,
    logs: LogSink,
    nodes: BTreeMap<String, NodeEntry>,
    jobs: BTreeMap<String, JobEntry>,
    job_seq: u64,
    /// Counters since this coordinator started, for `/metrics`.
    counts: Counts,
}

#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    submitted: u64,
    results: u64,
    samples: u64,
    log_lines: u64,
}

impl Scheduler {
    /// Loads the stored state. Stored nodes are lost until their agents register
    /// again; jobs that were running failed with the coordinator.
    pub async fn load(
        cfg: SchedulerConfig,
        store: StateStore,
        rdv: Rendezvous,
        logs: LogSink,
    ) -> Result<Scheduler, StoreError> {
        let now = now_ms();
        let mut job_seq = store.job_seq().await?;
        let mut batch = Batch::default();
        let mut nodes = BTreeMap::new();
        for mut node in store.nodes().await? {
            node.set_state(NodeState::Lost);
            node.state_reason =
                "coordinator restarted; waiting for the agent to register again".into();
            node.current_job.clear();
            batch = batch.node(&node);
            nodes.insert(
                node.name.clone(),
                NodeEntry {
                    node,
                    session: None,
                    coordinator_url: String::new(),
                },
            );
        }
        let mut jobs = BTreeMap::new();
        for mut job in store.jobs().await? {
            if let Some(n) = job
                .id
                .strip_prefix("job-")
                .and_then(|s| s.parse::<u64>().ok())
            {
                job_seq = job_seq.max(n);
            }
            let mut entry = JobEntry::default();
            if job.state() == JobState::Running {
                job.set_state(JobState::Failed);
                job.message = RESTART_MESSAGE.into();
                job.finished_unix_ms = now;
                entry.results = store
                    .results(&job.id, job.attempt)
                    .await?
                    .into_iter()
                    .map(|r| (r.rank, r))
                    .collect();
                job.results_in = entry.results.len() as u32;
                // The telemetry stored up to the crash keeps its place in the report.
                // Unreadable telemetry costs the summary, not the coordinator's start.
                let series = store.telemetry(&job.id).await.unwrap_or_else(|e| {
                    warn!(job = %job.id, "stored telemetry unreadable: {e}");
                    Vec::new()
                });
                entry.telemetry = Telemetry::from_stored(series);
                entry.job = job;
                let report = entry.report(now, &cfg.health_rules);
                entry.results.clear();
                entry.telemetry.forget_series();
                batch = batch.job(&entry.job).report(&report);
                warn!(job = %entry.job.id, "{RESTART_MESSAGE}");
            } else {
                entry.job = job;
            }
            jobs.insert(entry.job.id.clone(), entry);
        }
        store.write(batch).await?;
        info!(
            nodes = nodes.len(),
            jobs = jobs.len(),
            job_seq,
            "state loaded"
        );
        Ok(Scheduler {
            cfg,
            store,
            rdv,
            logs,
            nodes,
            jobs,
            job_seq,
            counts: Counts::default(),
        })
    }

    /// Starts the event loop; it ends on `shutdown` or when every handle is gone.
    pub fn spawn(self, shutdown: Shutdown) -> (SchedulerHandle, JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(1024);
        let task = tokio::spawn(self.run(rx, shutdown));
        (SchedulerHandle { tx }, task)
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Event>, shutdown: Shutdown) {
        let stop = shutdown.cancelled_owned();
        tokio::pin!(stop);
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                ev = rx.recv() => match ev {
                    Some(ev) => self.handle(ev).await,
                    None => break,
                },
                _ = tick.tick() => self.handle(Event::Tick).await,
                _ = &mut stop => break,
            }
        }
        self.store_telemetry(true).await;
        // Ending the sessions lets the server's graceful shutdown complete.
        for e in self.nodes.values_mut() {
            e.session = None;
        }
        info!("scheduler stopped");
    }

    async fn handle(&mut self, ev: Event) {
        let may_start = !matches!(
            ev,
            Event::Heartbeat { .. }
                | Event::WorkerProgress { .. }
                | Event::WorkerLog { .. }
                | Event::GetJob { .. }
                | Event::ListJobs { .. }
                | Event::ListNodes { .. }
                | Event::GetReport { .. }
                | Event::GetTelemetry { .. }
                | Event::Telemetry { .. }
                | Event::Metrics { .. }
                | Event::Plan { .. }
        );
        match ev {
            Event::AgentRegistered {
                req,
                coordinator_url,
                reply,
            } => {
                let r = self.register(req, coordinator_url).await;
                let _ = reply.send(r);
            }
            Event::SessionOpened {
                node,
                session,
                tx,
                first,
                reply,
            } => {
                let r = self.session_opened(node, session, tx, first).await;
                let _ = reply.send(r);
            }
            Event::Heartbeat { node, session, hb } => self.heartbeat(node, session, hb).await,
            Event::SessionClosed { node, session } => self.session_closed(node, session),
            Event::AssignmentAck { node, ack } => self.assignment_ack(node, ack).await,
            Event::Submit { spec, reply } => {
                let r = self.submit(spec).await;
                let _ = reply.send(r);
            }
            Event::Plan { spec, reply } => {
                let _ = reply.send(self.plan(spec));
            }
            Event::Cancel {
                job_id,
                reason,
                reply,
            } => {
                let r = self.cancel(job_id, reason).await;
                let _ = reply.send(r);
            }
            Event::WorkerProgress { report, reply } => {
                let _ = reply.send(self.worker_progress(report));
            }
            Event::WorkerResult { result, reply } => {
                let r = self.worker_result(result).await;
                let _ = reply.send(r);
            }
            Event::WorkerExited { node, exited } => self.worker_exited(node, exited).await,
            Event::WorkerLog { node, log } => self.worker_log(node, log),
            Event::Telemetry { node, batch } => self.telemetry(node, batch),
            Event::GetTelemetry { job_id, reply } => {
                let r = self
                    .jobs
                    .get(&job_id)
                    .map(|j| j.telemetry.latest())
                    .ok_or_else(|| no_job(&job_id));
                let _ = reply.send(r);
            }
            Event::Tick => self.tick().await,
            Event::Metrics { reply } => {
                let _ = reply.send(self.snapshot());
            }
            Event::GetJob { job_id, reply } => {
                let r = self
                    .jobs
                    .get(&job_id)
                    .map(JobEntry::view)
                    .ok_or_else(|| no_job(&job_id));
                let _ = reply.send(r);
            }
            Event::ListJobs { limit, reply } => {
                let mut all: Vec<Job> = self.jobs.values().map(JobEntry::view).collect();
                if limit > 0 && all.len() > limit as usize {
                    all.drain(..all.len() - limit as usize);
                }
                let _ = reply.send(all);
            }
            Event::ListNodes { reply } => {
                let _ = reply.send(self.nodes.values().map(|e| e.node.clone()).collect());
            }
            Event::GetReport { job_id, reply } => {
                let r = self.report(&job_id).await;
                let _ = reply.send(r);
            }
        }
        if may_start {
            self.start_pending().await;
        }
    }

    /// Writes state; a failure is logged, since the in-memory state already moved on.
    async fn save(&self, batch: Batch) {
        if let Err(e) = self.store.write(batch).await {
            warn!("could not store state: {e}");
        }
    }

    // ───────────── agents ─────────────

    async fn register(
        &mut self,
        req: RegisterRequest,
        url: String,
    ) -> Result<RegisterResponse, Status> {
        let name = req.name.trim().to_string();
        if name.is_empty() {
            return Err(Status::invalid_argument(
                "name: the node name is empty; start the agent with --name NAME",
            ));
        }
        let now = now_ms();
        let entry = self.nodes.entry(name.clone()).or_insert_with(|| NodeEntry {
            node: Node::default(),
            session: None,
            coordinator_url: String::new(),
        });
        // An agent registers again after it lost its session, and it kills its
        // workers when that happens: a job it was running cannot finish.
        let interrupted = std::mem::take(&mut entry.node.current_job);
        let mut node = Node {
            name: name.clone(),
            facts: req.facts,
            gpus: req.gpus,
            state: NodeState::Ready as i32,
            last_heartbeat_unix_ms: now,
            current_job: String::new(),
            slots: 0,
            registered_unix_ms: now,
            state_reason: String::new(),
            preflight: req.preflight,
        };
        node.slots = planner::slots(&node);
        entry.node = node;
        entry.session = None;
        entry.coordinator_url = url.clone();
        let batch = Batch::default().node(&entry.node);
        info!(node = %name, slots = entry.node.slots, gpus = entry.node.gpus.len(), "agent registered");
        self.save(batch).await;
        if !interrupted.is_empty() {
            self.finish(
                &interrupted,
                JobState::Failed,
                format!(
                    "node {name} registered again during the run (its agent restarted or lost the coordinator), so its workers were stopped"
                ),
                Some(&name),
            )
            .await;
        }
        Ok(RegisterResponse {
            name,
            heartbeat_interval_ms: self.cfg.heartbeat_interval.as_millis() as u32,
            protocol_version: gpuctl_proto::PROTOCOL_VERSION,
            coordinator_url: url,
        })
    }

    async fn session_opened(
        &mut self,
        node: String,
        id: u64,
        tx: SessionTx,
        first: Heartbeat,
    ) -> Result<(), Status> {
        let Some(e) = self.nodes.get_mut(&node) else {
            return Err(Status::failed_precondition(format!(
                "node `{node}` is not registered with this coordinator; the agent must call Register before opening a session"
            )));
        };
        if e.coordinator_url.is_empty() {
            return Err(Status::failed_precondition(format!(
                "node `{node}` was registered with an earlier coordinator run; the agent must call Register again"
            )));
        }
        e.session = Some(Session { id, tx });
        e.node.last_heartbeat_unix_ms = first.unix_ms.max(now_ms());
        if e.lost() {
            e.node.set_state(NodeState::Ready);
            e.node.state_reason.clear();
            e.refresh_state();
            let batch = Batch::default().node(&e.node);
            self.save(batch).await;
        }
        info!(node = %node, session = id, "agent session open");
        Ok(())
    }

    async fn heartbeat(&mut self, node: String, session: u64, hb: Heartbeat) {
        let now = now_ms();
        let Some(e) = self.nodes.get_mut(&node) else {
            return;
        };
        if e.session.as_ref().map(|s| s.id) != Some(session) {
            return; // a replaced session still draining
        }
        e.node.last_heartbeat_unix_ms = now;
        if e.lost() {
            info!(node = %node, "heartbeats resumed");
            e.node.set_state(NodeState::Ready);
            e.node.state_reason.clear();
            e.refresh_state();
            let batch = Batch::default().node(&e.node);
            self.save(batch).await;
        }
        let Some(e) = self.nodes.get(&node) else {
            return;
        };
        // Workers of a job that is over (or unknown) are told again to stop.
        for rj in &hb.running {
            let stale = match self.jobs.get(&rj.job_id) {
                None => true,
                Some(j) => {
                    j.job.attempt != rj.attempt
                        || (j.state().is_terminal()
                            && now.saturating_sub(j.job.finished_unix_ms) > STALE_JOB_MS)
                }
            };
            if stale {
                debug!(node = %node, job = %rj.job_id, "node still runs an ended job; cancelling again");
                e.send(cancel_msg(&rj.job_id, rj.attempt, "the job is over"));
            }
        }
    }

    fn session_closed(&mut self, node: String, session: u64) {
        if let Some(e) = self.nodes.get_mut(&node) {
            if e.session.as_ref().map(|s| s.id) == Some(session) {
                e.session = None;
                warn!(node = %node, "agent session closed; the node is lost unless it reconnects within the node timeout");
            }
        }
    }

    async fn assignment_ack(&mut self, node: String, ack: AssignmentAck) {
        if ack.ok {
            debug!(node = %node, job = %ack.job_id, "assignment acknowledged");
            return;
        }
        let running = self
            .jobs
            .get(&ack.job_id)
            .is_some_and(|j| j.state() == JobState::Running && j.job.attempt == ack.attempt);
        if running {
            let msg = format!("node {node} could not start the workers: {}", ack.error);
            self.finish(&ack.job_id, JobState::Failed, msg, Some(&node))
                .await;
        }
    }

    async fn tick(&mut self) {
        let now = now_ms();
        let timeout = self.cfg.node_timeout;
        let mut lost = Vec::new();
        for (name, e) in self.nodes.iter_mut() {
            if !e.lost()
                && now.saturating_sub(e.node.last_heartbeat_unix_ms) > timeout.as_millis() as u64
            {
                e.node.set_state(NodeState::Lost);
                e.node.state_reason = format!("no heartbeat for {}", human(timeout));
                e.session = None;
                lost.push((
                    name.clone(),
                    std::mem::take(&mut e.node.current_job),
                    e.node.clone(),
                ));
            }
        }
        for (name, job, node) in lost {
            warn!(node = %name, "node lost: no heartbeat for {}", human(timeout));
            self.save(Batch::default().node(&node)).await;
            if !job.is_empty() {
                let msg = format!("node {name} lost: no heartbeat for {}", human(timeout));
                self.finish(&job, JobState::Failed, msg, Some(&name)).await;
            }
        }

        let overdue: Vec<(String, String)> = self
            .jobs
            .values()
            .filter(|j| {
                j.state() == JobState::Running
                    && j.deadline_unix_ms > 0
                    && now > j.deadline_unix_ms + DEADLINE_GRACE_MS
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
        self.store_telemetry(false).await;
    }

    /// Writes the telemetry series that changed, of running jobs whose last
    /// write is older than [`TELEMETRY_STORE_MS`] (all of them with `all`).
    async fn store_telemetry(&mut self, all: bool) {
        let now = now_ms();
        let mut batch = Batch::default();
        for e in self.jobs.values_mut() {
            if e.state() != JobState::Running || !e.telemetry.is_dirty() {
                continue;
            }
            if !all && now.saturating_sub(e.telemetry_stored_ms) < TELEMETRY_STORE_MS {
                continue;
            }
            e.telemetry_stored_ms = now;
            for series in e.telemetry.take_dirty() {
                batch = batch.telemetry(&e.job.id, &series);
            }
        }
        self.save(batch).await;
    }

    /// What `/metrics` shows.
    fn snapshot(&self) -> Snapshot {
        let mut snap = Snapshot {
            submitted: self.counts.submitted,
            results: self.counts.results,
            samples: self.counts.samples,
            log_lines: self.counts.log_lines,
            rendezvous_keys: self.rdv.key_count() as u64,
            ..Default::default()
        };
        for e in self.nodes.values() {
            *snap.nodes.entry(e.node.state().label()).or_default() += 1;
        }
        for e in self.jobs.values() {
            *snap.jobs.entry(e.state().label()).or_default() += 1;
        }
        snap
    }

    // ───────────── jobs ─────────────

    fn candidates(&self) -> Vec<planner::Candidate<'_>> {
        self.nodes.values().map(NodeEntry::candidate).collect()
    }

    /// Plans a spec on the nodes it would get now (or, if they are busy, the
    /// ones it would most likely get).
    fn plan(&self, spec: JobSpec) -> Result<Plan, Status> {
        let spec = gpuctl_proto::spec::normalize(&spec)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let cands = self.candidates();
        let chosen = match planner::choose(&spec, &cands)? {
            Some(c) => c,
            None => planner::likely(&spec, &cands),
        };
        Ok(planner::plan(&spec, &chosen))
    }

    async fn submit(&mut self, spec: JobSpec) -> Result<Job, Status> {
        let plan = self.plan(spec)?;
        if let Some(e) = planner::preflight_error(&plan) {
            return Err(e.into());
        }
        let spec = plan.spec.clone().unwrap_or_default();
        let seq = self.job_seq + 1;
        let id = job_id(seq);
        let job = Job {
            id: id.clone(),
            spec: Some(spec),
            state: JobState::Pending as i32,
            attempt: 1,
            created_unix_ms: now_ms(),
            ..Default::default()
        };
        self.store
            .write(Batch::default().job(&job).job_seq(seq))
            .await
            .map_err(|e| Status::unavailable(format!("could not store the job: {e}")))?;
        self.job_seq = seq;
        self.counts.submitted += 1;
        info!(job = %id, workload = %job.spec.as_ref().map(|s| s.workload.as_str()).unwrap_or(""), "job submitted");
        self.jobs.insert(
            id.clone(),
            JobEntry {
                job,
                ..Default::default()
            },
        );
        self.start_pending().await;
        Ok(self.jobs[&id].view())
    }

    /// Starts waiting jobs, oldest first, on whatever nodes are free.
    async fn start_pending(&mut self) {
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
        let now = now_ms();
        let spec = self.jobs[id].job.spec.clone().unwrap_or_default();
        let plan = {
            let chosen: Vec<&Node> = names
                .iter()
                .filter_map(|n| self.nodes.get(n))
                .map(|e| &e.node)
                .collect();
            planner::plan(&spec, &chosen)
        };
        if let Some(err) = planner::preflight_error(&plan) {
            if let Some(j) = self.jobs.get_mut(id) {
                j.job.plan = Some(plan);
            }
            self.finish(id, JobState::Failed, err.to_string(), None)
                .await;
            return;
        }
        let deadline = now + job_budget_ms(&spec);
        let Some(entry) = self.jobs.get_mut(id) else {
            return;
        };
        entry.job.set_state(JobState::Running);
        entry.job.started_unix_ms = now;
        entry.job.plan = Some(plan.clone());
        entry.deadline_unix_ms = deadline;
        let attempt = entry.job.attempt;
        let mut batch = Batch::default().job(&entry.job);
        for name in &plan.nodes {
            if let Some(n) = self.nodes.get_mut(name) {
                n.node.current_job = id.to_string();
                n.refresh_state();
                batch = batch.node(&n.node);
            }
        }
        self.save(batch).await;
        self.rdv.open(id, attempt);

        let env: std::collections::HashMap<String, String> = plan
            .env
            .iter()
            .map(|e| (e.name.clone(), e.value.clone()))
            .collect();
        let mut unreachable = Vec::new();
        for (node_rank, name) in plan.nodes.iter().enumerate() {
            let Some(n) = self.nodes.get(name) else {
                continue;
            };
            let a = Assignment {
                job_id: id.to_string(),
                attempt,
                spec: Some(spec.clone()),
                ranks: plan
                    .ranks
                    .iter()
                    .filter(|r| &r.node == name)
                    .cloned()
                    .collect(),
                env: env.clone(),
                world_size: plan.world_size,
                node_rank: node_rank as u32,
                nnodes: plan.nodes.len() as u32,
                master_addr: plan.master_addr.clone(),
                master_port: plan.master_port,
                deadline_unix_ms: deadline,
                coordinator_url: n.coordinator_url.clone(),
            };
            if !n.send(CoordinatorMessage {
                msg: Some(Msg::Assignment(a)),
            }) {
                unreachable.push(name.clone());
            }
        }
        info!(job = %id, nodes = %plan.nodes.join(","), world_size = plan.world_size, "job started");
        if !unreachable.is_empty() {
            let msg = format!(
                "could not send the assignment to node {}: its agent session is gone",
                unreachable.join(", ")
            );
            self.finish(id, JobState::Failed, msg, None).await;
        }
    }

    /// Ends a job: state, stored report, nodes freed, other nodes told to stop,
    /// rendezvous waiters released. Does nothing to a job that already ended.
    async fn finish(&mut self, id: &str, state: JobState, message: String, skip: Option<&str>) {
        let now = now_ms();
        let Some(entry) = self.jobs.get_mut(id) else {
            return;
        };
        if entry.state().is_terminal() {
            return;
        }
        entry.job.set_state(state);
        entry.job.message = message.clone();
        entry.job.finished_unix_ms = now;
        entry.job.results_in = entry.results.len() as u32;
        let report = entry.report(now, &self.cfg.health_rules);
        // Results and telemetry are stored and folded into the stored report;
        // memory keeps only what running jobs need.
        entry.results.clear();
        let series = entry.telemetry.take_dirty();
        entry.telemetry.forget_series();
        let attempt = entry.job.attempt;
        let nodes: Vec<String> = entry
            .job
            .plan
            .as_ref()
            .map(|p| p.nodes.clone())
            .unwrap_or_default();
        let mut batch = Batch::default().job(&entry.job).report(&report);
        for s in &series {
            batch = batch.telemetry(id, s);
        }
        for name in &nodes {
            let Some(n) = self.nodes.get_mut(name) else {
                continue;
            };
            if n.node.current_job == id {
                n.node.current_job.clear();
                n.refresh_state();
                batch = batch.node(&n.node);
            }
            if state != JobState::Succeeded && skip != Some(name.as_str()) {
                n.send(cancel_msg(id, attempt, &message));
            }
        }
        self.rdv.close(id, attempt);
        self.save(batch).await;
        match state {
            JobState::Succeeded => info!(job = %id, "job succeeded"),
            _ => warn!(job = %id, state = state.label(), "job ended: {message}"),
        }
    }

    async fn cancel(&mut self, id: String, reason: String) -> Result<Job, Status> {
        let Some(entry) = self.jobs.get(&id) else {
            return Err(no_job(&id));
        };
        if !entry.state().is_terminal() {
            let msg = if reason.trim().is_empty() {
                "cancelled by user".to_string()
            } else {
                format!("cancelled: {}", reason.trim())
            };
            self.finish(&id, JobState::Cancelled, msg, None).await;
        }
        Ok(self.jobs[&id].view())
    }

    async fn report(&self, id: &str) -> Result<Report, Status> {
        let Some(entry) = self.jobs.get(id) else {
            return Err(no_job(id));
        };
        if !entry.state().is_terminal() {
            return Ok(entry.report(now_ms(), &self.cfg.health_rules));
        }
        let unavailable =
            |e: StoreError| Status::unavailable(format!("reading the report of {id}: {e}"));
        if let Some(r) = self.store.report(id).await.map_err(unavailable)? {
            return Ok(r);
        }
        let results = self.stored_results(&entry.job).await.map_err(unavailable)?;
        let telemetry =
            Telemetry::from_stored(self.store.telemetry(id).await.map_err(unavailable)?);
        Ok(report::build(&report::Inputs {
            job: &entry.job,
            results: &results,
            exits: &entry.exits,
            telemetry: &telemetry,
            rules: &self.cfg.health_rules,
            now_ms: now_ms(),
        }))
    }

    async fn stored_results(&self, job: &Job) -> Result<BTreeMap<u32, RankResult>, StoreError> {
        Ok(self
            .store
            .results(&job.id, job.attempt)
            .await?
            .into_iter()
            .map(|r| (r.rank, r))
            .collect())
    }

    // ───────────── workers ─────────────

    fn worker_progress(&mut self, report: RankProgressReport) -> (bool, String) {
        let Some(entry) = self.jobs.get_mut(&report.job_id) else {
            return (false, format!("unknown job `{}`", report.job_id));
        };
        if report.attempt != entry.job.attempt {
            return (
                false,
                format!("attempt {} of {} is over", report.attempt, report.job_id),
            );
        }
        if entry.state() != JobState::Running {
            return (
                false,
                format!("job {} is {}", report.job_id, entry.state().label()),
            );
        }
        let Some(mut p) = report.progress else {
            return (true, "no progress in the report".into());
        };
        if p.node.is_empty() {
            p.node = entry
                .placement(p.rank)
                .map(|pl| pl.node.clone())
                .unwrap_or_default();
        }
        if p.unix_ms == 0 {
            p.unix_ms = now_ms();
        }
        entry.progress.insert(p.rank, p);
        (true, String::new())
    }

    async fn worker_result(&mut self, mut result: RankResult) -> (bool, String) {
        let Some(entry) = self.jobs.get_mut(&result.job_id) else {
            return (false, format!("unknown job `{}`", result.job_id));
        };
        if result.attempt != entry.job.attempt {
            return (
                false,
                format!("attempt {} of {} is over", result.attempt, result.job_id),
            );
        }
        let world = entry.world_size();
        let Some(p) = entry.placement(result.rank).cloned() else {
            return (
                false,
                format!(
                    "rank {} is not part of {} (world size {world})",
                    result.rank, result.job_id
                ),
            );
        };
        for (field, planned) in [
            (&mut result.node, p.node),
            (&mut result.device, p.device),
            (&mut result.device_name, p.device_name),
            (&mut result.gpu_uuid, p.gpu_uuid),
        ] {
            if field.is_empty() {
                *field = planned;
            }
        }
        // Durable before the worker hears back: a crash from here on loses nothing.
        if let Err(e) = self.store.put_result(&result).await {
            warn!(job = %result.job_id, rank = result.rank, "could not store a result: {e}");
            return (false, format!("could not store the result: {e}"));
        }
        let id = result.job_id.clone();
        let rank = result.rank;
        self.counts.results += 1;
        info!(job = %id, rank, ok = result.ok, "result in");
        if entry.state().is_terminal() {
            // A straggler: fold it into the stored report.
            let job = entry.job.clone();
            let stored = match self.stored_results(&job).await {
                Ok(results) => self.store.telemetry(&id).await.map(|t| (results, t)),
                Err(e) => Err(e),
            };
            match stored {
                Ok((results, series)) => {
                    let entry = &self.jobs[&id];
                    let report = report::build(&report::Inputs {
                        job: &job,
                        results: &results,
                        exits: &entry.exits,
                        telemetry: &Telemetry::from_stored(series),
                        rules: &self.cfg.health_rules,
                        now_ms: now_ms(),
                    });
                    self.save(Batch::default().report(&report)).await;
                }
                Err(e) => warn!(job = %id, "could not update the report: {e}"),
            }
            return (true, format!("stored; job {id} had already ended"));
        }
        entry.results.insert(rank, result);
        entry.job.results_in = entry.results.len() as u32;
        if entry.results.len() as u32 >= world && entry.state() == JobState::Running {
            let report = entry.report(now_ms(), &self.cfg.health_rules);
            let (verdict, why) = report::ranks_verdict(&report);
            if verdict == gpuctl_proto::pb::Verdict::Pass {
                self.finish(&id, JobState::Succeeded, String::new(), None)
                    .await;
            } else {
                self.finish(&id, JobState::Failed, why, None).await;
            }
        }
        (true, "stored".into())
    }

    async fn worker_exited(&mut self, node: String, ex: WorkerExited) {
        let Some(entry) = self.jobs.get_mut(&ex.job_id) else {
            return;
        };
        if ex.attempt != entry.job.attempt {
            return;
        }
        let has_result = entry.results.contains_key(&ex.rank);
        entry.exits.insert(ex.rank, ex.clone());
        if entry.state() != JobState::Running || has_result {
            return;
        }
        let label = entry
            .placement(ex.rank)
            .map(report::rank_label)
            .unwrap_or_else(|| format!("rank {} on node {node}", ex.rank));
        let how = if ex.exit_code == 0 && ex.signal.is_empty() && ex.killed_by.is_empty() {
            "exited with code 0 without reporting a result".to_string()
        } else {
            report::exit_text(&ex)
        };
        let id = ex.job_id.clone();
        self.finish(&id, JobState::Failed, format!("{label} {how}"), None)
            .await;
    }

    /// Samples count toward the job they name, while it runs.
    fn telemetry(&mut self, node: String, batch: TelemetryBatch) {
        if let Some(entry) = self.jobs.get_mut(&batch.job_id) {
            if entry.state() == JobState::Running && entry.job.attempt == batch.attempt {
                self.counts.samples += entry.telemetry.add(&node, batch, now_ms()) as u64;
            }
        }
    }

    fn worker_log(&mut self, node: String, log: WorkerLog) {
        if !self.jobs.contains_key(&log.job_id) || log.lines.is_empty() {
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
}

fn no_job(id: &str) -> Status {
    Status::not_found(format!("no job `{id}`; `gpuctl jobs` lists the jobs"))
}

fn cancel_msg(job: &str, attempt: u32, reason: &str) -> CoordinatorMessage {
    CoordinatorMessage {
        msg: Some(Msg::Cancel(CancelJob {
            job_id: job.to_string(),
            attempt,
            reason: reason.to_string(),
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_follow_the_spec() {
        let mut s = JobSpec {
            workload: "stress".into(),
            duration_ms: 60_000,
            ..Default::default()
        };
        assert_eq!(job_budget_ms(&s), 180_000);
        s.timeout_ms = 5_000;
        assert_eq!(job_budget_ms(&s), 5_000);
        let n = JobSpec {
            workload: "nccl".into(),
            ..Default::default()
        };
        assert_eq!(job_budget_ms(&n), 3_600_000);
    }
}

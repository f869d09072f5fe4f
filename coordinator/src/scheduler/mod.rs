//! The scheduler: one task owns the fleet and job state and processes typed
//! [`Event`]s in order, so there are no locks around state and every transition
//! happens in one place (docs/architecture.md, "Job life"). gRPC handlers talk
//! to it through a [`SchedulerHandle`] and await the reply.
//!
//! This file holds the state, its loading and the event loop; what each event
//! does lives in one `impl Scheduler` block per concern: [`agents`] (agents,
//! sessions, heartbeats, lost nodes), [`jobs`] (a job's life from submit to
//! report) and [`ranks`] (what running ranks send: progress, results, exits,
//! logs, telemetry).

mod agents;
mod assign;
mod background;
pub mod events;
mod jobs;
mod planning;
mod ranks;
mod recent;
mod reports;
mod retention;
pub mod snapshot;
pub mod state;
mod suites;
mod views;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use gpuctl_core::now_ms;
use gpuctl_core::pb::{JobState, ListNodesResponse, NodeState, Suite};
use gpuctl_core::shutdown::Shutdown;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

pub use events::{Event, Reply, SessionTx};
pub use jobs::job_budget_ms;
use snapshot::Counts;
pub use snapshot::Snapshot;
use state::{JobEntry, NodeEntry};

use crate::error::CoordinatorError;
use crate::judge::health::HealthRules;
use crate::judge::rules::PerfRules;
use crate::judge::telemetry::Telemetry;
use crate::logs::LogSink;
use crate::rendezvous::Rendezvous;
use crate::store::{Batch, StateStore, StoreError};

/// An event that holds the scheduler this long is logged.
const SLOW_EVENT: Duration = Duration::from_millis(200);

/// How often lost nodes, deadlines and waiting jobs are looked at.
pub const TICK: Duration = Duration::from_millis(500);

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    pub node_timeout: Duration,
    /// How long jobs found running at load wait for their nodes to come back.
    pub adopt_grace: Duration,
    pub heartbeat_interval: Duration,
    pub health_rules: Arc<HealthRules>,
    pub perf_rules: Arc<PerfRules>,
    /// Ended jobs kept in the store and here, newest first (`--keep-jobs`).
    pub keep_jobs: usize,
    /// Nodes that may be registered at once (`--max-nodes`).
    pub max_nodes: usize,
}

/// How gRPC handlers reach the scheduler task. People's requests (the CLI's)
/// have a lane of their own that the task serves first: at thousands of
/// nodes the fleet's own stream (heartbeats, progress, telemetry) keeps the
/// other lane full, and `gpuctl jobs` must not wait behind a second of it.
#[derive(Clone)]
pub struct SchedulerHandle {
    tx: mpsc::Sender<Event>,
    people: mpsc::Sender<Event>,
}

impl SchedulerHandle {
    /// Sends an event that carries a reply and waits for the answer.
    pub async fn ask<T>(
        &self,
        make: impl FnOnce(Reply<T>) -> Event,
    ) -> Result<T, CoordinatorError> {
        let (tx, rx) = oneshot::channel();
        self.lane(make(tx))
            .await
            .map_err(|_| CoordinatorError::ShuttingDown)?;
        rx.await.map_err(|_| CoordinatorError::ShuttingDown)
    }

    /// Every node, each whole or as `gpuctl nodes` shows it (`brief`).
    ///
    /// The caller's worker thread waits for the scheduler and copies whole
    /// nodes out of the runtime's rotation (`block_in_place`), not on the
    /// blocking pool: at a 32,768-rank job's start and end thousands of
    /// fleet calls were queued, and a handler woken from another thread
    /// waited 35-60 ms behind them with its listing already built. A brief
    /// listing's table comes built from the scheduler's task.
    pub async fn list_nodes(&self, brief: bool) -> Result<ListNodesResponse, CoordinatorError> {
        let (tx, rx) = oneshot::channel();
        self.lane(Event::ListNodes { brief, reply: tx })
            .await
            .map_err(|_| CoordinatorError::ShuttingDown)?;
        let listing = background::recv_in_place(rx)
            .await
            .map_err(|_| CoordinatorError::ShuttingDown)?;
        Ok(match listing {
            views::Listing::Table(t) => ListNodesResponse {
                table: Some(*t),
                ..Default::default()
            },
            views::Listing::Nodes(nodes) => background::in_place(move || ListNodesResponse {
                nodes: nodes.into_iter().map(Arc::unwrap_or_clone).collect(),
                table: None,
            }),
        })
    }

    /// Sends an event that needs no answer.
    pub async fn tell(&self, event: Event) {
        if self.lane(event).await.is_err() {
            debug!("scheduler stopped; event dropped");
        }
    }

    /// The fleet's lane, for a reader that keeps its place in line while
    /// it does other work (an agent's session; see `service::inbox`).
    pub fn fleet_lane(&self) -> tokio_util::sync::PollSender<Event> {
        tokio_util::sync::PollSender::new(self.tx.clone())
    }

    async fn lane(&self, ev: Event) -> Result<(), mpsc::error::SendError<Event>> {
        if ev.from_people() {
            self.people.send(ev).await
        } else {
            self.tx.send(ev).await
        }
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
    /// Jobs found running at load whose nodes have not all come back yet:
    /// job id → the Unix time (ms) by which they must.
    adopting: BTreeMap<String, u64>,
    /// Acceptance suites by id, and which suite each running stage job is of.
    suites: BTreeMap<String, Suite>,
    suite_seq: u64,
    jobs_of_suites: BTreeMap<String, String>,
    /// Counters since this coordinator started, for `/metrics`.
    counts: Counts,
    /// The report of the job that ended last, for a little while.
    recent: recent::Recent,
    /// The first lane, for blocking threads that build reports.
    first_lane: mpsc::WeakSender<Event>,
    /// Both lanes, made at load (a job judged then needs the first one) and
    /// handed out by `spawn`.
    lanes: Option<Lanes>,
}

struct Lanes {
    fleet: (mpsc::Sender<Event>, mpsc::Receiver<Event>),
    people: (mpsc::Sender<Event>, mpsc::Receiver<Event>),
}

impl Scheduler {
    /// Loads the stored state. Stored nodes are lost until their agents register
    /// again. Jobs that were running stay running, with their stored results
    /// and telemetry, awaiting adoption: their agents keep the workers for a
    /// grace and hand them back when they register (`register`); a job whose
    /// nodes do not all come back within `adopt_grace` fails naming them.
    pub async fn load(
        cfg: SchedulerConfig,
        store: StateStore,
        rdv: Rendezvous,
        logs: LogSink,
    ) -> Result<Scheduler, StoreError> {
        let now = now_ms();
        let adopt_by = now.saturating_add(cfg.adopt_grace.as_millis() as u64);
        let mut job_seq = store.job_seq().await?;
        let mut jobs = BTreeMap::new();
        let mut adopting = BTreeMap::new();
        // Node → the running job it is part of, so that the node stays tied to
        // it while it is lost (a Busy node when it comes back with the job).
        // Only from here: a node's stored record is not written at a job's
        // start or end.
        let mut running_on = BTreeMap::new();
        for job in store.jobs().await? {
            if let Some(n) = job
                .id
                .strip_prefix("job-")
                .and_then(|s| s.parse::<u64>().ok())
            {
                job_seq = job_seq.max(n);
            }
            let mut entry = JobEntry {
                job,
                ..Default::default()
            };
            if entry.state() == JobState::Running {
                let job = &mut entry.job;
                entry.results = store
                    .results(&job.id, job.attempt)
                    .await?
                    .into_iter()
                    .map(|r| (r.rank, r))
                    .collect();
                job.results_in = entry.results.len() as u32;
                // Unreadable telemetry costs the summary, not the coordinator's start.
                let series = store.telemetry(&job.id).await.unwrap_or_else(|e| {
                    warn!(job = %job.id, "stored telemetry unreadable: {e}");
                    Vec::new()
                });
                entry.telemetry = Telemetry::from_stored(series);
                // The deadline the agents were given with the assignment.
                let spec = job.spec.clone().unwrap_or_default();
                entry.deadline_unix_ms = job.started_unix_ms.saturating_add(job_budget_ms(&spec));
                for n in job.plan.iter().flat_map(|p| &p.nodes) {
                    running_on.insert(n.clone(), job.id.clone());
                }
                // Keys written before the restart are gone: ranks past their
                // rendezvous go on; ranks still in it see only new writes.
                rdv.open(&job.id, job.attempt);
                adopting.insert(job.id.clone(), adopt_by);
                info!(job = %job.id, results = job.results_in, "running at restart: awaiting adoption by its agents for {}", human(cfg.adopt_grace));
            }
            entry.retire();
            jobs.insert(entry.job.id.clone(), entry);
        }
        state::let_go_old(&mut jobs);
        // A crash between a report's commit and its runs'.
        let due = crate::history::catch_up(&store).await?;
        if due > 0 {
            info!(jobs = due, "fleet history caught up from stored reports");
        }
        let mut batch = Batch::default();
        let mut nodes = BTreeMap::new();
        for mut node in store.nodes().await? {
            node.set_state(NodeState::Lost);
            node.state_reason =
                "coordinator restarted; waiting for the agent to register again".into();
            node.current_job = running_on.get(&node.name).cloned().unwrap_or_default();
            batch = batch.node(&node);
            nodes.insert(node.name.clone(), NodeEntry::detached(node));
        }
        store.write(batch).await?;
        info!(
            nodes = nodes.len(),
            jobs = jobs.len(),
            adopting = adopting.len(),
            job_seq,
            "state loaded"
        );
        let suites: BTreeMap<String, Suite> = store
            .suites()
            .await?
            .into_iter()
            .map(|s| (s.id.clone(), s))
            .collect();
        let suite_seq = suites
            .keys()
            .filter_map(|id| id.strip_prefix("acc-")?.parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        let lanes = Lanes {
            fleet: mpsc::channel(1024),
            people: mpsc::channel(256),
        };
        let mut me = Scheduler {
            recent: recent::Recent::default(),
            first_lane: lanes.people.0.downgrade(),
            lanes: Some(lanes),
            cfg,
            store,
            rdv,
            logs,
            nodes,
            jobs,
            job_seq,
            adopting,
            suites,
            suite_seq,
            jobs_of_suites: BTreeMap::new(),
            counts: Counts::default(),
        };
        // A crash between the last result and the job's end leaves nothing
        // to wait for.
        let ids: Vec<String> = me.adopting.keys().cloned().collect();
        for id in ids {
            me.judge_if_complete(&id);
        }
        me.resume_suites().await;
        // Waited for: a crash or a store error left them listed, or
        // `--keep-jobs` was lowered.
        if let Some(deleting) = me.delete_old_jobs() {
            let _ = deleting.await;
        }
        Ok(me)
    }

    /// Starts the event loop; it ends on `shutdown` or when every handle is gone.
    /// Runs the scheduler on `on` (the fleet's runtime, beside the sessions
    /// that feed it most of its events).
    pub fn spawn(mut self, shutdown: Shutdown, on: &Handle) -> (SchedulerHandle, JoinHandle<()>) {
        let Lanes {
            fleet: (tx, rx),
            people: (people, people_rx),
        } = self.lanes.take().expect("a scheduler is spawned once");
        // Not `unconstrained`: a handler the scheduler wakes waits in its
        // worker's LIFO slot, which no other worker steals, until the
        // scheduler yields or wakes another, and unconstrained it never
        // yielded while a big job's fleet calls kept its lanes full. Tried
        // at 4,096 nodes: no gain told apart from run-to-run spread.
        let task = on.spawn(self.run(rx, people_rx, shutdown));
        (SchedulerHandle { tx, people }, task)
    }

    async fn run(
        mut self,
        mut rx: mpsc::Receiver<Event>,
        mut people: mpsc::Receiver<Event>,
        shutdown: Shutdown,
    ) {
        let stop = shutdown.cancelled_owned();
        tokio::pin!(stop);
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            // In this order: people, then the clock (deadlines, lost nodes),
            // then the fleet's stream.
            tokio::select! {
                biased;
                _ = &mut stop => break,
                Some(ev) = people.recv() => self.handle(ev).await,
                _ = tick.tick() => self.handle(Event::Tick).await,
                ev = rx.recv() => match ev {
                    Some(ev) => self.handle(ev).await,
                    None => break,
                },
            }
        }
        self.store_telemetry(true).await;
        // Ending the sessions lets the server's graceful shutdown complete.
        for e in self.nodes.values_mut() {
            e.session = None;
        }
        info!("scheduler stopped");
    }

    /// Handles one event; one that holds the task long is logged, since
    /// everything else waits meanwhile.
    async fn handle(&mut self, ev: Event) {
        let (name, began) = (ev.name(), std::time::Instant::now());
        self.handle_event(ev).await;
        let took = began.elapsed();
        if took >= SLOW_EVENT {
            warn!(
                event = name,
                ms = took.as_millis() as u64,
                "the scheduler was held"
            );
        }
    }

    async fn handle_event(&mut self, ev: Event) {
        let may_start = ev.may_start_jobs();
        match ev {
            Event::AgentRegistered {
                req,
                coordinator_url,
                reply,
            } => {
                let _ = reply.send(self.register(req, coordinator_url).await);
            }
            Event::SessionOpened {
                node,
                session,
                tx,
                first,
                reply,
            } => {
                let _ = reply.send(self.session_opened(node, session, tx, first).await);
            }
            Event::Heartbeat { node, session, hb } => self.heartbeat(node, session, hb).await,
            Event::SessionClosed { node, session, why } => self.session_closed(node, session, &why),
            Event::AssignmentAck { node, ack } => self.assignment_ack(node, ack).await,
            Event::Submit { spec, reply } => self.submit_later(spec, reply),
            Event::Planned { plan, reply } => {
                let job = match plan {
                    Ok(plan) => self.submit_planned(plan).await,
                    Err(e) => Err(e),
                };
                let _ = reply.send(job);
            }
            Event::Plan {
                spec,
                max_ranks,
                reply,
            } => self.plan_later(spec, max_ranks, reply),
            Event::Cancel {
                job_id,
                reason,
                reply,
            } => {
                let _ = reply.send(self.cancel(job_id, reason).await);
            }
            Event::WorkerProgress { report, reply } => {
                let _ = reply.send(self.worker_progress(report));
            }
            Event::WorkerResult { result, reply } => match self.worker_result(result).await {
                ranks::Answer::Now(a) => {
                    let _ = reply.send(a);
                }
                // The worker hears back once its result is durable; the
                // scheduler goes on meanwhile.
                ranks::Answer::WhenStored(durable, message) => {
                    tokio::spawn(async move {
                        let a = match durable.wait().await {
                            Ok(()) => (true, message),
                            Err(e) => (false, format!("could not store the result: {e}")),
                        };
                        let _ = reply.send(a);
                    });
                }
            },
            Event::WorkerExited { node, exited } => self.worker_exited(node, exited).await,
            Event::WorkerLog { node, log } => self.worker_log(node, log),
            Event::Telemetry { node, batch } => self.telemetry(node, batch),
            Event::GetTelemetry { job_id, reply } => {
                let _ = reply.send(self.latest_telemetry(&job_id));
            }
            Event::Tick => self.tick().await,
            Event::Metrics { reply } => {
                let _ = reply.send(self.snapshot());
            }
            Event::GetJob {
                job_id,
                max_ranks,
                reply,
            } => self.get_job(&job_id, max_ranks, reply),
            Event::ListJobs { limit, reply } => {
                let _ = reply.send(self.list_jobs(limit));
            }
            Event::ListNodes { brief, reply } => {
                let nodes = self.nodes.values();
                // The table is built here, from the nodes in place. Built by
                // the caller, it held every node's `Arc` meanwhile, and a
                // job's start or end, which changes all 4,096 nodes, copied
                // each one held (GPUs, facts, checks) on this task. Whole
                // nodes (`-o json`) are still copied by the caller: building
                // them here held the task 15-30 ms a call.
                let listing = if brief {
                    views::Listing::Table(Box::new(views::table(
                        nodes.map(|e| (e.node.as_ref(), e.fixed.as_ref())),
                    )))
                } else {
                    views::Listing::Nodes(nodes.map(|e| e.node.clone()).collect())
                };
                let _ = reply.send(listing);
            }
            Event::RemoveNode { name, reply } => {
                let _ = reply.send(self.remove_node(&name).await);
            }
            Event::GetReport { job_id, reply } => self.get_report(&job_id, reply).await,
            Event::SubmitSuite { req, reply } => {
                let _ = reply.send(self.submit_suite(req).await);
            }
            Event::GetSuite { id, reply } => {
                let _ = reply.send(self.suite(&id));
            }
            Event::CancelSuite { id, reply } => {
                let _ = reply.send(self.cancel_suite(&id).await);
            }
            Event::Judged {
                job_id,
                attempt,
                state,
                message,
                built,
            } => self.judged(job_id, attempt, state, message, *built).await,
            Event::Assignments {
                job_id,
                attempt,
                messages,
            } => self.send_assignments(job_id, attempt, messages).await,
            Event::ReportStored { job_id, report } => self.report_stored(job_id, *report).await,
            Event::Refolded { job_id, report } => self.refolded(job_id, report.map(|r| *r)).await,
        }
        if may_start {
            self.start_pending().await;
        }
    }

    async fn tick(&mut self) {
        self.lose_silent_nodes().await;
        self.fail_overdue_jobs().await;
        self.fail_hung_jobs().await;
        self.store_telemetry(false).await;
        self.refold_stale();
        self.recent.expire(now_ms());
    }

    /// Writes state; a failure is logged, since the in-memory state already moved on.
    /// Hands the batch to the store's writer (a failed commit is logged
    /// there): the scheduler never waits on the disk.
    fn save(&self, batch: Batch) {
        if !batch.is_empty() {
            drop(self.store.queue(batch));
        }
    }
}

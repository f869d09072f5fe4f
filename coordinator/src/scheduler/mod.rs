//! The scheduler: one task owns the fleet and job state and processes typed
//! [`Event`]s in order, so there are no locks around state and every transition
//! happens in one place (docs/architecture.md, "Job life"). gRPC handlers talk
//! to it through a [`SchedulerHandle`] and await the reply.
//!
//! Events come in groups by concern ([`events`]); `Scheduler::dispatch`
//! hands each group to the one method that handles it, in the file of its
//! concern, which reads top to bottom from there. The files:
//!
//! - `mod.rs`: the state, its loading, the event loop, the dispatch to each
//!   group's handler, the tick.
//! - `handle.rs`: [`SchedulerHandle`], the people's and the fleet's lanes in.
//! - `events.rs`: every event by group; what each is, said once (name, lane,
//!   whether it may start jobs); what they carry; how to add an RPC.
//! - `agents.rs`: [`AgentEvent`]s: registration and adoption, sessions,
//!   heartbeats, acknowledgements, lost nodes, node removal.
//! - `budget.rs`: what nodes may make the coordinator keep, each and all.
//! - `jobs.rs`: [`JobEvent`]s: submit, start, assignments sent, finish,
//!   cancel, deadlines, hangs.
//! - `ranks.rs`: [`RankEvent`]s: progress, results, exits, logs, telemetry.
//! - `reports.rs`: [`ReportEvent`]s: reports judged and built off the task;
//!   a report refolded with late results, and its nodes' runs again;
//!   `GetReport`.
//! - `suites.rs`: [`SuiteEvent`]s: acceptance suites; `certs.rs`: their
//!   signed certificates, handed off the task.
//! - `views.rs`: [`Query`]s: every read; bounded views for people and the
//!   nodes' table.
//! - `planning.rs`: a job planned off the task.
//! - `assign.rs`: a started job's assignments, built off the task.
//! - `background.rs`: work handed off the task; judging at a lower CPU
//!   priority.
//! - `state.rs`: the in-memory state: nodes with their sessions, jobs with
//!   their results, progress and hang clocks, reports on their way.
//! - `recent.rs`: the last ended job's report, kept a while.
//! - `retention.rs`: ended jobs past `--keep-jobs` deleted whole.
//! - `snapshot.rs`: what `/metrics` shows.
//! - `tests.rs`: lost nodes, deadlines and hangs under a manual [`Clock`].
//!
//! Imports between the files go one way, never round: `events` imports
//! only `snapshot` (whose type a query carries); `background` imports
//! `events`; `state` those two; `recent` and `views` import from there
//! down; `reports` also `recent`; `planning` also `views`; `jobs` also
//! `reports` and `assign`. The concern files reach each other's methods
//! through `impl Scheduler`, not imports.
//!
//! Time is read from the [`Clock`] in [`SchedulerConfig`], never from the
//! system, so that tests move it by hand.

mod agents;
mod assign;
mod background;
mod budget;
mod certs;
mod device;
pub mod events;
mod handle;
mod inventory;
mod jobs;
mod kept_view;
mod listing;
mod planning;
mod ranks;
mod recent;
mod report_inputs;
mod reports;
mod retention;
pub mod snapshot;
pub mod state;
mod suites;
#[cfg(test)]
mod tests;
mod views;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use gpuctl_core::shutdown::Shutdown;
use gpuctl_proto::pb::{JobState, Suite};
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{info, warn};

pub use events::{
    AgentEvent, Event, JobEvent, Query, RankEvent, Reply, ReportEvent, SessionTx, SuiteEvent,
};
pub use handle::SchedulerHandle;
use listing::{JobListing, NodeListing};
use snapshot::Counts;
pub use snapshot::Snapshot;
use state::{JobEntry, NodeEntry};

use crate::fleet::NodeEvent;
use crate::judge::checks::health::HealthRules;
use crate::judge::checks::perf::rules::PerfRules;
use crate::judge::telemetry::Telemetry;
use crate::logs::LogSink;
use crate::rendezvous::Rendezvous;
use crate::store::{Batch, StateStore, StoreError};
pub use gpuctl_core::clock::Clock;

/// An event that holds the scheduler this long is logged.
const SLOW_EVENT: Duration = Duration::from_millis(200);

/// How often lost nodes, deadlines and waiting jobs are looked at.
pub const TICK: Duration = Duration::from_millis(500);

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Signs each node's acceptance certificate when a suite ends (issue
    /// 50); `None` issues none.
    pub certs: Option<Arc<crate::cert::Authority>>,
    pub node_timeout: Duration,
    /// How long jobs found running at load wait for their nodes to come back.
    pub adopt_grace: Duration,
    pub heartbeat_interval: Duration,
    /// Heartbeats and telemetry batches a second the fleet is paced to
    /// (`--agent-messages-per-s`, `fleet/pace.rs`).
    pub agent_messages_per_s: u32,
    pub health_rules: Arc<HealthRules>,
    pub perf_rules: Arc<PerfRules>,
    /// Ended jobs kept in the store and here, newest first (`--keep-jobs`).
    pub keep_jobs: usize,
    /// Bytes the ended jobs kept may hold in the store (`--keep-jobs-bytes`).
    pub keep_jobs_bytes: u64,
    /// Nodes that may be registered at once (`--max-nodes`).
    pub max_nodes: usize,
    /// Where every time-dependent rule reads the time.
    pub clock: Clock,
    /// What nodes sent that they may not say, counted for `/metrics`.
    pub refusals: crate::refusals::Refusals,
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
    /// `gpuctl nodes`' table, kept for readers (`listing.rs`).
    listing: Arc<NodeListing>,
    /// `gpuctl jobs`' list, kept for readers (`listing.rs`).
    job_listing: Arc<JobListing>,
    /// Big jobs' views people read, kept beside it (`kept_view.rs`).
    views: Arc<kept_view::KeptViews>,
    /// What the nodes keep, against their budgets (`budget.rs`).
    budget: budget::Budget,
    jobs: BTreeMap<String, JobEntry>,
    job_seq: u64,
    /// Jobs found running at load whose nodes have not all come back yet:
    /// job id → the Unix time (ms) by which they must.
    adopting: BTreeMap<String, u64>,
    /// Acceptance suites by id, and which suite each running stage job is of.
    suites: BTreeMap<String, Suite>,
    suite_seq: u64,
    jobs_of_suites: BTreeMap<String, String>,
    /// How often the agents were last told to send (`fleet/pace.rs`).
    pace: crate::fleet::pace::Pace,
    /// Counters since this coordinator started, for `/metrics`.
    counts: Counts,
    /// How long rank reports waited for this task: hang clocks count
    /// silence only while ranks could be heard.
    hearing: crate::jobs::hearing::Hearing,
    /// The report of the job that ended last, for a little while.
    recent: recent::Recent,
    /// The job whose report is being made again with late results
    /// (`reports::refold_stale`): one at a time.
    refolding: Option<String>,
    /// When (Unix ms) the running jobs' telemetry may be written next;
    /// `u64::MAX` while a write is not yet committed (`ranks.rs`,
    /// `store_telemetry`).
    telemetry_next_ms: Arc<std::sync::atomic::AtomicU64>,
    /// The first lane, for blocking threads that build reports.
    first_lane: mpsc::WeakSender<Event>,
    /// `gpuctl fleet`'s kept answer, which ended jobs' runs are folded into
    /// as they are written (`fleet_view/ahead.rs`).
    fleet_view: crate::fleet_view::FleetView,
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
        let loading = std::time::Instant::now();
        let now = cfg.clock.now_ms();
        let adopt_by = crate::jobs::timing::adopt_by(now, cfg.adopt_grace);
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
                let began = std::time::Instant::now();
                entry.results = store
                    .results(&job.id, job.attempt)
                    .await?
                    .into_iter()
                    .map(|r| (r.rank, r))
                    .collect();
                job.results_in = entry.results.len() as u32;
                let results_ms = began.elapsed().as_millis() as u64;
                // Unreadable telemetry costs the summary, not the coordinator's start.
                let series = store.telemetry(&job.id).await.unwrap_or_else(|e| {
                    warn!(job = %job.id, "stored telemetry unreadable: {e}");
                    Vec::new()
                });
                entry.telemetry = Telemetry::from_stored(series);
                let telemetry_ms = began.elapsed().as_millis() as u64 - results_ms;
                // The deadline the agents were given with the assignment.
                let spec = job.spec.clone().unwrap_or_default();
                entry.deadline_unix_ms = crate::jobs::timing::deadline(job.started_unix_ms, &spec);
                for n in job.plan.iter().flat_map(|p| &p.nodes) {
                    running_on.insert(n.clone(), job.id.clone());
                }
                // Keys written before the restart are gone: ranks past their
                // rendezvous go on; ranks still in it see only new writes.
                rdv.open(&job.id, job.attempt);
                adopting.insert(job.id.clone(), adopt_by);
                info!(job = %job.id, results = job.results_in, results_ms, telemetry_ms, "running at restart: awaiting adoption by its agents for {}", human(cfg.adopt_grace));
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
        let listing = Arc::new(NodeListing::new(listing::NODES));
        let now = cfg.clock.now_ms();
        for node in store.nodes().await? {
            let job = running_on.get(&node.name).cloned().unwrap_or_default();
            let mut e = NodeEntry::detached(node);
            e.on(NodeEvent::Restarted { job: &job }, now, &listing);
            batch = batch.node(&e.node);
            nodes.insert(e.node.name.clone(), e);
        }
        store.write(batch).await?;
        info!(
            nodes = nodes.len(),
            jobs = jobs.len(),
            adopting = adopting.len(),
            job_seq,
            ms = loading.elapsed().as_millis() as u64,
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
        let pace =
            crate::fleet::pace::pace(nodes.len(), cfg.agent_messages_per_s, cfg.node_timeout);
        let fleet_view =
            crate::fleet_view::FleetView::new(store.clone(), cfg.perf_rules.drift_tolerance);
        let mut me = Scheduler {
            fleet_view,
            pace,
            recent: recent::Recent::default(),
            refolding: None,
            telemetry_next_ms: Arc::default(),
            first_lane: lanes.people.0.downgrade(),
            lanes: Some(lanes),
            cfg,
            store,
            rdv,
            logs,
            nodes,
            listing,
            job_listing: Arc::new(JobListing::new(listing::JOBS)),
            views: Arc::default(),
            budget: budget::Budget::default(),
            jobs,
            job_seq,
            adopting,
            suites,
            suite_seq,
            jobs_of_suites: BTreeMap::new(),
            counts: Counts::default(),
            hearing: Default::default(),
        };
        // A crash between the last result and the job's end leaves nothing
        // to wait for.
        let ids: Vec<String> = me.adopting.keys().cloned().collect();
        for id in ids {
            me.judge_if_complete(&id);
        }
        me.resume_suites().await;
        me.certify_missing().await;
        let ended: Vec<String> = (me.jobs.values())
            .filter(|e| e.state().is_terminal())
            .map(|e| e.job.id.clone())
            .collect();
        let unmeasured = me.store.load_job_sizes(&ended).await?;
        // Waited for: a crash or a store error left them listed, or
        // `--keep-jobs` or `--keep-jobs-bytes` was lowered.
        if let Some(deleting) = me.delete_old_jobs() {
            let _ = deleting.await;
        }
        // Ended before sizes were measured, or measured when the coordinator
        // stopped: one at a time, in the background (each reads its job's keys).
        let unmeasured: Vec<String> = (unmeasured.into_iter())
            .filter(|id| me.jobs.contains_key(id))
            .collect();
        if !unmeasured.is_empty() {
            let store = me.store.clone();
            tokio::spawn(async move {
                for id in unmeasured {
                    if let Err(e) = store.measure_job(&id).await {
                        warn!(job = %id, "could not measure what the job holds in the store: {e}");
                    }
                }
            });
        }
        Ok(me)
    }

    /// `gpuctl fleet`'s kept answer, which this scheduler's jobs write to.
    pub fn fleet_view(&self) -> crate::fleet_view::FleetView {
        self.fleet_view.clone()
    }

    /// Starts the event loop; it ends on `shutdown` or when every handle is gone.
    /// Runs the scheduler on `on` (the fleet's runtime, beside the sessions
    /// that feed it most of its events). On a thread of its own it was
    /// worse at 16,384 × 8: the kernel then interleaved it with the
    /// sessions' thread, its ticks held it 200-830 ms and a job's start up
    /// to 9.7 s, and short jobs failed; beside the sessions, none did.
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
        let clock = self.cfg.clock.clone();
        let refusals = self.cfg.refusals.clone();
        let (listing, job_listing) = (self.listing.clone(), self.job_listing.clone());
        let views = self.views.clone();
        let task = on.spawn(self.run(rx, people_rx, shutdown));
        (
            SchedulerHandle {
                tx,
                people,
                clock,
                refusals,
                listing,
                job_listing,
                views,
            },
            task,
        )
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
        crate::burst::say_left_out();
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
        self.dispatch(ev).await;
        let took = began.elapsed();
        if took >= SLOW_EVENT {
            warn!(
                event = name,
                ms = took.as_millis() as u64,
                "the scheduler was held"
            );
        }
    }

    /// Hands the event to its group's handler; waiting jobs are looked
    /// at after one that may start them.
    async fn dispatch(&mut self, ev: Event) {
        let may_start = ev.about().may_start_jobs;
        match ev {
            Event::Agent(ev) => self.on_agent(ev).await,
            Event::Job(ev) => self.on_job(ev).await,
            Event::Rank(ev) => self.on_rank(ev).await,
            Event::Report(ev) => self.on_report(ev).await,
            Event::Suite(ev) => self.on_suite(ev).await,
            Event::Query(q) => self.on_query(q).await,
            Event::Tick => self.tick().await,
        }
        if may_start {
            self.start_pending().await;
        }
        #[cfg(test)]
        self.job_list_is_current_or_not_kept();
        self.keep_listings();
    }

    async fn tick(&mut self) {
        self.lose_silent_nodes().await;
        crate::burst::say_left_out();
        self.fail_overdue_jobs().await;
        self.fail_hung_jobs().await;
        self.store_telemetry(false).await;
        self.refold_stale();
        self.recent.expire(self.cfg.clock.now_ms());
        // A job measured since (`--keep-jobs-bytes`) may put older ones past it.
        drop(self.delete_old_jobs());
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

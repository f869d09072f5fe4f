//! The scheduler's in-memory state: nodes with their sessions, jobs with their
//! live progress and results. Only the scheduler task touches it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use fixedbitset::FixedBitSet;

use gpuctl_proto::pb::{
    coordinator_message::Msg, CancelJob, CoordinatorMessage, Job, JobState, Node, NodeState, Plan,
    RankPlacement, RankProgress, RankResult, Report, StopReason, WorkerExited,
};

use super::background::drop_later;
use super::events::{ReportReply, SessionTx};
use super::listing::NodeListing;
use super::SchedulerConfig;
use crate::fleet::{self, Effects, Life, NodeEvent};
use crate::jobs::hang::{RankClock, Watch};
use crate::jobs::life::JobLife;
use crate::judge::report;
use crate::judge::telemetry::Telemetry;
use crate::plan::planner::Candidate;

pub struct Session {
    pub id: u64,
    pub tx: SessionTx,
}

pub struct NodeEntry {
    /// As stored; `state` is kept current (Ready, Busy or Lost). Shared
    /// with readers: a listing takes the 4,096 nodes of a fleet as they are
    /// and builds its answer off the scheduler's task (building it on the
    /// task held it 15-30 ms a call); a change made meanwhile copies the
    /// node.
    pub node: Arc<Node>,
    /// What a table of nodes shows of it that only a registration changes.
    pub fixed: Arc<Fixed>,
    pub session: Option<Session>,
    /// Where this node's workers reach the coordinator.
    pub coordinator_url: String,
}

/// What `gpuctl nodes` shows of a node that changes only with its
/// registration ([`NodeEntry::set_node`]; its GPUs and facts are not
/// changed otherwise), worked out once: read from each node's GPUs and
/// facts, spread over the heap, a 4,096-node listing took ~5 ms of cache
/// misses a call.
#[derive(Debug, Default)]
pub struct Fixed {
    /// GPU models, one per run of GPUs of one model in index order, ", "
    /// between them; empty for a CPU node.
    pub model: String,
    /// GPUs, else CPU ranks.
    pub slots: u32,
    pub shm_bytes: u64,
}

impl Fixed {
    pub fn of(n: &Node) -> Fixed {
        let mut model = String::new();
        let mut last: Option<&str> = None;
        for g in &n.gpus {
            if last == Some(g.name.as_str()) {
                continue;
            }
            if last.is_some() {
                model.push_str(", ");
            }
            model.push_str(&g.name);
            last = Some(&g.name);
        }
        let cpu_ranks = n.facts.as_ref().map_or(0, |f| f.cpu_ranks);
        let slots = match (n.gpus.len() as u32, n.slots) {
            (0, 0) => cpu_ranks,
            (0, s) => s,
            (g, s) => g.max(s),
        };
        Fixed {
            model,
            slots,
            shm_bytes: n.facts.as_ref().map_or(0, |f| f.shm_bytes),
        }
    }
}

impl NodeEntry {
    /// A node without a session and without a coordinator URL of this run:
    /// as loaded from the store, or before its registration is taken.
    pub fn detached(node: Node) -> NodeEntry {
        NodeEntry {
            fixed: Arc::new(Fixed::of(&node)),
            node: Arc::new(node),
            session: None,
            coordinator_url: String::new(),
        }
    }

    /// The node, to change; copied first if a reader holds it. Not its
    /// GPUs or facts: see [`Fixed`].
    pub fn node_mut(&mut self) -> &mut Node {
        Arc::make_mut(&mut self.node)
    }

    /// Replaces the node (a registration), counted as a change of the
    /// listing.
    pub fn set_node(&mut self, node: Node, listing: &NodeListing) {
        self.fixed = Arc::new(Fixed::of(&node));
        self.node = Arc::new(node);
        listing.changed();
    }

    /// What happened to the node, through its state machine
    /// ([`crate::fleet::node`]); the node, and each word it borrows from
    /// it, copied only when changed. The caller carries out the effects
    /// that reach beyond the node (storing it, failing its job); the
    /// session is dropped here. A change `gpuctl nodes` shows (not a
    /// heartbeat's time) is counted in `listing`.
    pub fn on(&mut self, event: NodeEvent<'_>, now: u64, listing: &NodeListing) -> Effects {
        let life = Life {
            state: self.node.state(),
            reason: self.node.state_reason.as_str().into(),
            job: self.node.current_job.as_str().into(),
            heard_unix_ms: self.node.last_heartbeat_unix_ms,
        };
        let (next, fx) = fleet::transition(&life, event, now);
        let (state, heard) = (next.state, next.heard_unix_ms);
        let reason = (next.reason != life.reason).then(|| next.reason.into_owned());
        let job = (next.job != life.job).then(|| next.job.into_owned());
        let shown = state != life.state || reason.is_some() || job.is_some();
        listing.changed_if(shown);
        if shown || heard != life.heard_unix_ms {
            let n = self.node_mut();
            n.set_state(state);
            n.last_heartbeat_unix_ms = heard;
            n.state_reason = reason.unwrap_or_else(|| std::mem::take(&mut n.state_reason));
            n.current_job = job.unwrap_or_else(|| std::mem::take(&mut n.current_job));
        }
        if fx.close_session {
            self.session = None;
        }
        fx
    }

    pub fn lost(&self) -> bool {
        self.node.state() == NodeState::Lost
    }

    pub fn candidate(&self) -> Candidate<'_> {
        let live = !self.lost();
        Candidate {
            node: &self.node,
            live,
            free: live && self.session.is_some() && self.node.current_job.is_empty(),
        }
    }

    /// Sends on the session; false when there is none or it is gone.
    pub fn send(&self, msg: CoordinatorMessage) -> bool {
        self.session
            .as_ref()
            .is_some_and(|s| s.tx.send(Box::new(msg)).is_ok())
    }

    /// Tells the agent to stop a job's workers; false when it cannot be reached.
    pub fn send_cancel(&self, job: &str, attempt: u32, reason: &str) -> bool {
        self.send_cancel_as(job, attempt, reason, StopReason::Cancel)
    }

    /// As [`Self::send_cancel`], with what the workers' exits will carry as
    /// `stopped_by` (hang, or a plain cancel).
    pub fn send_cancel_as(&self, job: &str, attempt: u32, reason: &str, why: StopReason) -> bool {
        self.send(CoordinatorMessage {
            msg: Some(Msg::Cancel(CancelJob {
                job_id: job.to_string(),
                attempt,
                reason: reason.to_string(),
                stopped_by: why as i32,
            })),
        })
    }
}

#[derive(Default)]
pub struct JobEntry {
    pub job: Job,
    /// The plan made when the job was submitted, used when it starts at
    /// once on the same nodes: planning 32,768 ranks twice held the
    /// scheduler for it twice.
    pub planned: Option<Plan>,
    pub progress: BTreeMap<u32, RankProgress>,
    /// Results of the current attempt; emptied once the job ends and its report
    /// is stored.
    pub results: BTreeMap<u32, RankResult>,
    pub exits: BTreeMap<u32, WorkerExited>,
    /// Ranks whose worker gave up sending its result (`UNDELIVERED_EXIT`)
    /// and whose result never came: unknown, and the job ends without them.
    pub undelivered: BTreeSet<u32>,
    /// Progress clocks and process states of the ranks, for hang detection.
    pub watch: Watch,
    pub telemetry: Telemetry,
    /// The ended job's report is in the store (known once this coordinator
    /// stored it): reads go there without the scheduler.
    pub report_stored: bool,
    pub deadline_unix_ms: u64,
    /// The report being built off the scheduler's task, if it is.
    pub pending: Option<Pending>,
    /// An ended big job keeps no per-rank parts in memory ([`Self::retire`]);
    /// they are read from the store when asked for.
    pub retired: bool,
    /// A retired job's bounded view (`VIEW_RANKS`, what `gpuctl status`
    /// asks for), made as it retired, as the store would give it: each call
    /// read and decoded the whole job (~2 MB at 32,768 ranks) while the
    /// store was busy with the job's end. A retired job does not change.
    pub retired_view: Option<Job>,
    /// Ranks whose result was stored once the report began: a worker that
    /// sends its result again (its first call timed out) is answered
    /// without a second write or another report.
    pub stored: FixedBitSet,
    /// Ranks whose worker's end was reported, of the attempt whose
    /// assignments this coordinator sent (`None`: none): each rank's last
    /// log lines come before it.
    pub ended: Option<FixedBitSet>,
    /// Results came in after the report was made: when the first and the
    /// last came (unix ms). The report is made again once they stop
    /// coming, not once per result ([`super::Scheduler::refold_stale`]).
    pub stale: Option<(u64, u64)>,
    /// When its report was last made again with late results (unix ms).
    pub refolded_ms: u64,
    /// The plan's checks that did not pass, worst first, found once per plan
    /// (`views`).
    pub plan_faults: std::sync::Mutex<Option<PlanFaults>>,
    /// A big running job's last bounded view, answered again a moment
    /// (`kept_view`).
    pub kept_view: std::sync::Mutex<Option<KeptView>>,
    /// The plan's nodes as a set, made at the first look once the plan is
    /// set ([`JobEntry::set_plan`]): [`JobEntry::has_node`] scanned a
    /// 16,384-node plan's names for every telemetry batch, a sixth of the
    /// scheduler's time at that size (docs/benchmarks.md, "Where the
    /// scheduler's time goes").
    pub(super) plan_nodes: std::sync::OnceLock<std::collections::HashSet<String>>,
}

/// A job's report on its way (`reports`): who waits for it, and whether a
/// result came in after its inputs were taken.
#[derive(Default)]
pub struct Pending {
    /// Judging: the job still runs until its verdict is known.
    pub(super) judging: bool,
    pub(super) waiting: Vec<ReportReply>,
    pub(super) straggled: bool,
}

/// The plan's checks that did not pass, worst first, of one plan (its
/// attempt and number of checks): a plan's checks do not change once it is
/// made, and a bounded view (`views`) scanned all of a 4,096-node plan's on
/// every `gpuctl status`.
pub struct PlanFaults {
    pub(super) of: (u32, usize),
    /// Indices into the plan's checks.
    pub(super) bad: Vec<u32>,
}

/// A big running job's bounded view as made, with what it was made of
/// (`kept_view`).
pub struct KeptView {
    /// Ranks asked for, attempt, state, results in.
    pub(super) of: (u32, u32, i32, u32),
    pub(super) made_ms: u64,
    pub(super) job: Job,
}

/// Nodes a job listing names of each job: `gpuctl jobs` shows a count past
/// three, and 50 jobs of 4,096 node names each were 200,000 strings to copy
/// and send on every call.
pub const LISTED_NODES: usize = 8;

/// Ended jobs with more ranks than this keep no per-rank parts in memory: at
/// 32,768 ranks they are tens of megabytes a job, kept for every job.
pub const RETIRE_OVER_RANKS: u32 = 1024;

/// Ended jobs kept whole in memory (their parts, a retired job's view), the
/// newest first; older ones are let go ([`JobEntry::let_go`]).
pub const KEEP_ENDED: usize = 8;

/// Lets go of the ended jobs past the newest [`KEEP_ENDED`] (ids sort by
/// submission).
pub fn let_go_old(jobs: &mut BTreeMap<String, JobEntry>) {
    jobs.values_mut()
        .rev()
        .filter(|e| e.state().is_terminal())
        .skip(KEEP_ENDED)
        .for_each(JobEntry::let_go);
}

impl JobEntry {
    pub fn state(&self) -> JobState {
        self.job.state()
    }

    /// Ended, with no work on it under way: its report is not being made,
    /// nor made again for results that came late. Only such a job may be
    /// let go ([`Self::let_go`]) or deleted (`retention`).
    pub fn settled(&self) -> bool {
        self.state().is_terminal() && self.pending.is_none() && self.stale.is_none()
    }

    /// Every rank reported and the verdict is being made: the job still
    /// runs, but nothing that happens to it now changes its end.
    pub fn judging(&self) -> bool {
        self.pending.as_ref().is_some_and(|p| p.judging)
    }

    /// What the job machine ([`crate::jobs::life`]) reads of this job.
    pub fn life(&self) -> JobLife {
        JobLife {
            state: self.state(),
            judging: self.judging(),
        }
    }

    /// Drops what only a running job needs once its report is built: the
    /// figures and messages of each rank's last progress, the workers'
    /// stderr tails of workers that exited cleanly (the report keeps both) and the latest telemetry. A
    /// finished job then costs a few bytes per rank, not kilobytes.
    pub fn slim(&mut self) {
        for p in self.progress.values_mut() {
            p.metrics = Default::default();
            p.message = String::new();
        }
        // A failed worker's tail stays: a straggler's result rebuilds the
        // report from these.
        for e in self.exits.values_mut() {
            if e.exit_code == 0 && e.signal.is_empty() {
                e.stderr_tail = String::new();
            }
        }
        self.telemetry = Default::default();
    }

    /// Drops an ended big job's per-rank parts (placements, checks,
    /// progress, exits, clocks): its stored job and report have them.
    /// Call once the job is stored in its final state.
    pub fn retire(&mut self) {
        if !self.state().is_terminal() || self.world_size() <= RETIRE_OVER_RANKS {
            return;
        }
        // The store keeps no progress: the view read back from it has none.
        let progress = std::mem::take(&mut self.progress);
        self.retired_view = Some(self.view_of(gpuctl_proto::VIEW_RANKS));
        drop_later(progress);
        self.drop_parts();
    }

    /// An ended job no longer among the newest [`KEEP_ENDED`], whatever its
    /// size: no per-rank parts and no kept view, so that what the
    /// coordinator holds does not grow with every job it has run (100
    /// simulated nodes × 8 GPUs: live heap +1.4 MB a job kept for the
    /// coordinator's life, +0.65 MB with this).
    /// `GetJob` and `GetReport` read it from the store, as for a retired job.
    /// Not while its report is being made or made again.
    pub fn let_go(&mut self) {
        if !self.settled() {
            return;
        }
        if !self.retired {
            self.drop_parts();
        }
        if let Some(view) = self.retired_view.take() {
            drop_later(view);
        }
        let faults = self
            .plan_faults
            .get_mut()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(faults) = faults.take() {
            drop_later(faults);
        }
    }

    fn drop_parts(&mut self) {
        let progress = std::mem::take(&mut self.progress);
        let plan = self
            .job
            .plan
            .as_mut()
            .map(|p| (std::mem::take(&mut p.ranks), std::mem::take(&mut p.checks)));
        let parts = (
            plan,
            std::mem::take(&mut self.job.start_checks),
            progress,
            std::mem::take(&mut self.exits),
            std::mem::take(&mut self.watch),
            std::mem::take(&mut self.plan_nodes),
        );
        self.retired = true;
        // Tens of thousands of small allocations: freed off the scheduler's task.
        drop_later(parts);
    }

    /// The job without its per-rank parts (plan placements and environment,
    /// progress, start checks).
    pub fn summary(&self) -> Job {
        self.summary_naming(usize::MAX)
    }

    /// [`Self::summary`] naming at most [`LISTED_NODES`] of the plan's
    /// nodes: what `ListJobs` returns.
    pub fn listed(&self) -> Job {
        self.summary_naming(LISTED_NODES)
    }

    fn summary_naming(&self, max_nodes: usize) -> Job {
        let j = &self.job;
        let nodes = j.plan.as_ref().map_or(&[][..], |p| &p.nodes[..]);
        let named = nodes.len().min(max_nodes);
        Job {
            id: j.id.clone(),
            spec: j.spec.clone(),
            state: j.state,
            attempt: j.attempt,
            created_unix_ms: j.created_unix_ms,
            started_unix_ms: j.started_unix_ms,
            finished_unix_ms: j.finished_unix_ms,
            message: j.message.clone(),
            plan: j.plan.as_ref().map(|p| Plan {
                nodes: nodes[..named].to_vec(),
                world_size: p.world_size,
                master_addr: p.master_addr.clone(),
                master_port: p.master_port,
                ..Default::default()
            }),
            progress: Vec::new(),
            results_in: j.results_in,
            baseline: j.baseline.clone(),
            start_checks: Vec::new(),
            // A summary is not a bounded view: it has no ranks at all.
            ranks_left_out: 0,
            checks_left_out: 0,
            nodes_left_out: (nodes.len() - named) as u32,
        }
    }

    /// The job as clients see it, with live progress.
    pub fn view(&self) -> Job {
        let mut j = self.job.clone();
        j.progress = self.progress.values().cloned().collect();
        j
    }

    pub fn placement(&self, rank: u32) -> Option<&RankPlacement> {
        self.job.plan.as_ref()?.placement(rank)
    }

    /// Whether the plan puts `rank` on `node`: what a node's session says
    /// of a rank (its exit, its log) counts only from the node holding it.
    /// A retired job keeps no placements: any of its nodes then, for a rank
    /// of its world.
    pub fn holds(&self, node: &str, rank: u32) -> bool {
        match self.placement(rank) {
            Some(p) => p.node == node,
            None => self.retired && rank < self.world_size() && self.has_node(node),
        }
    }

    /// Whether the plan has `node` in this job at all.
    pub fn has_node(&self, node: &str) -> bool {
        let Some(p) = self.job.plan.as_ref() else {
            return false;
        };
        // A few names are read faster than hashed.
        if p.nodes.len() <= 16 {
            return p.nodes.iter().any(|n| n == node);
        }
        self.plan_nodes
            .get_or_init(|| p.nodes.iter().cloned().collect())
            .contains(node)
    }

    /// The plan the job runs (or failed to start) with: the one place it
    /// is set, so that [`JobEntry::has_node`]'s set is of this plan.
    pub fn set_plan(&mut self, plan: Plan) {
        self.job.plan = Some(plan);
        self.plan_nodes = Default::default();
    }

    /// The `CancelJob.kind` for this job's workers when it ends now.
    pub fn cancel_kind(&self) -> StopReason {
        if self.watch.hung.is_some() {
            StopReason::Hang
        } else {
            StopReason::Cancel
        }
    }

    /// The ranks still expected to make progress: planned, without a
    /// result, worker not exited; each with when it last progressed, on
    /// the heard clock `heard` (`jobs::hearing`).
    pub fn progress_clocks(&self, heard: impl Fn(u64) -> u64) -> Vec<RankClock<'_>> {
        self.job
            .plan
            .iter()
            .flat_map(|p| &p.ranks)
            .filter(|p| !self.results.contains_key(&p.rank) && !self.exits.contains_key(&p.rank))
            .map(|p| RankClock {
                rank: p.rank,
                node: &p.node,
                last_growth_ms: heard(self.watch.last_growth(p.rank)),
                process: self.watch.processes.get(&p.rank),
                waiting: self
                    .progress
                    .get(&p.rank)
                    .is_some_and(|r| !r.waiting_for.is_empty()),
            })
            .collect()
    }

    /// Whether `rank`'s result was stored once the report began.
    pub fn is_stored(&self, rank: u32) -> bool {
        self.stored.contains(rank as usize)
    }

    /// Marks `rank`'s result stored; whether it was already.
    pub fn mark_stored(&mut self, rank: u32) -> bool {
        let rank = rank as usize;
        if rank >= self.stored.len() {
            self.stored.grow(rank + 1);
        }
        self.stored.put(rank)
    }

    /// A result came after the report was made.
    pub fn mark_stale(&mut self, now_ms: u64) {
        let first = self.stale.map_or(now_ms, |(first, _)| first);
        self.stale = Some((first, now_ms));
    }

    /// Per-rank entries this job holds in memory (`/metrics`): what must
    /// not pile up job after job.
    pub fn held_ranks(&self) -> u64 {
        let plan = self.job.plan.as_ref();
        let placed = plan.map_or(0, |p| p.ranks.len() + p.checks.len());
        let watch = self.watch.grew_ms.len() + self.watch.processes.len();
        (placed
            + self.job.start_checks.len()
            + self.progress.len()
            + self.results.len()
            + self.exits.len()
            + watch) as u64
    }

    pub fn world_size(&self) -> u32 {
        self.job.plan.as_ref().map_or(0, |p| p.world_size)
    }

    /// The report of this job as it stands (a running job's partial one).
    pub fn report(&self, now_ms: u64, cfg: &SchedulerConfig) -> Report {
        let mut report = report::build(&report::Inputs {
            job: &self.job,
            results: &self.results,
            exits: &self.exits,
            progress: &self.progress,
            watch: &self.watch,
            telemetry: &self.telemetry,
            rules: &cfg.health_rules,
            perf: &cfg.perf_rules,
            now_ms,
        });
        report.telemetry_bytes = self.telemetry.stored_bytes(&self.job.id);
        report
    }
}

/// `job-000001`: sortable and easy to type.
pub fn job_id(seq: u64) -> String {
    format!("job-{seq:06}")
}

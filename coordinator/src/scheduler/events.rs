//! Everything that can change the scheduler's state arrives as one
//! [`Event`], from gRPC handlers, the scheduler's own blocking threads or
//! the tick timer. Requests that need an answer carry a oneshot for it.
//!
//! Events are grouped by concern, and each group is handled top to bottom
//! by one method in one file:
//!
//! | group            | sent by                          | handled in                    |
//! |------------------|----------------------------------|-------------------------------|
//! | [`AgentEvent`]   | agents' sessions; `remove-node`  | `agents.rs`, `on_agent`       |
//! | [`JobEvent`]     | people; planning and assignments | `jobs.rs`, `on_job`           |
//! | [`RankEvent`]    | workers, through agents          | `ranks.rs`, `on_rank`         |
//! | [`ReportEvent`]  | threads that build reports       | `reports.rs`, `on_report`     |
//! | [`SuiteEvent`]   | people (`gpuctl accept`)         | `suites.rs`, `on_suite`       |
//! | [`Query`]        | people and `/metrics`: reads     | `views.rs`, `on_query`        |
//! | `Tick`           | the scheduler's timer            | `mod.rs`, `tick`              |
//!
//! What an event is (its name for logs, the lane it waits in, whether it
//! may start waiting jobs) is said once, in its group's `about`, beside
//! its definition here.
//!
//! # Adding an RPC
//!
//! 1. Add a variant to the group it concerns (a read goes in [`Query`]),
//!    and its line in that group's `about` below: the compiler asks for it.
//! 2. Handle it in the group's `on_*` method (the compiler asks for that
//!    too), calling a method of the concern's file.
//! 3. Send it from the gRPC handler in `service/` with
//!    `SchedulerHandle::ask` (an answer) or `tell` (none).
//!
//! This module imports nothing of the scheduler but [`Snapshot`]: the
//! files that handle events import it, never the other way round.

use std::time::Instant;

use gpuctl_proto::pb::{
    Ack, AssignmentAck, CoordinatorMessage, Heartbeat, Job, JobSpec, JobState, Node, NodeTable,
    Plan, RankProgressReport, RankResult, RegisterRequest, RegisterResponse, Report,
    SubmitSuiteRequest, Suite, TelemetryBatch, WorkerExited, WorkerLog,
};
use tokio::sync::{mpsc, oneshot};

use super::snapshot::Snapshot;
use crate::error::CoordinatorError;
use crate::judge::telemetry::Telemetry;
use crate::store::Batch;

pub type Reply<T> = oneshot::Sender<T>;

/// A job's report, shared: a 131,072-rank report is ~250 MB decoded, and
/// each caller that got a copy of its own held one more at the job's end
/// (jemalloc's heap profile). Each caller cuts from it what it sends
/// ([`crate::judge::thin::to_send`]).
pub type ReportReply = Reply<Result<std::sync::Arc<Report>, CoordinatorError>>;

/// The downstream half of an agent's session: what the scheduler tells that
/// agent. The service layer turns it into the gRPC stream.
/// Boxed: a channel allocates a block of 32 slots up front, and at the
/// size of an assignment that was 17 KB for every connected node.
pub type SessionTx = mpsc::UnboundedSender<Box<CoordinatorMessage>>;

/// Which of the scheduler's two lanes an event waits in
/// (`SchedulerHandle`): the task serves people's first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// A person (the CLI, a script, `/metrics`) is waiting, or may be.
    People,
    /// The fleet's own stream: agents and workers.
    Fleet,
}

/// What an event is, said once per event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct About {
    /// For logs.
    pub name: &'static str,
    pub lane: Lane,
    /// Handling it may free nodes or add a job, so waiting jobs are looked
    /// at afterwards. Reads and the per-second streams (heartbeats,
    /// progress, logs, telemetry) cannot; a node that comes back by
    /// heartbeat is picked up by the next tick.
    pub may_start_jobs: bool,
}

impl About {
    const fn people(name: &'static str) -> About {
        About {
            name,
            lane: Lane::People,
            may_start_jobs: false,
        }
    }

    const fn fleet(name: &'static str) -> About {
        About {
            name,
            lane: Lane::Fleet,
            may_start_jobs: false,
        }
    }

    const fn starts_jobs(self) -> About {
        About {
            may_start_jobs: true,
            ..self
        }
    }
}

#[derive(Debug)]
pub enum Event {
    Agent(AgentEvent),
    Job(JobEvent),
    Rank(RankEvent),
    Report(ReportEvent),
    Suite(SuiteEvent),
    Query(Query),
    /// Every 500 ms: lost nodes, deadlines, hangs, pending jobs.
    Tick,
}

impl Event {
    pub fn about(&self) -> About {
        match self {
            Event::Agent(e) => e.about(),
            Event::Job(e) => e.about(),
            Event::Rank(e) => e.about(),
            Event::Report(e) => e.about(),
            Event::Suite(e) => e.about(),
            Event::Query(e) => e.about(),
            Event::Tick => About::fleet("Tick").starts_jobs(),
        }
    }

    /// The event's name, for logs.
    pub fn name(&self) -> &'static str {
        self.about().name
    }
}

/// Agents and the nodes they run on.
// A group is never bigger than `Event` was as one flat enum, which a
// `RankResult` sized anyway: boxing its big variants would only add an
// allocation per message.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum AgentEvent {
    AgentRegistered {
        req: RegisterRequest,
        /// The URL workers on this node should use.
        coordinator_url: String,
        reply: Reply<Result<RegisterResponse, CoordinatorError>>,
    },
    SessionOpened {
        node: String,
        session: u64,
        tx: SessionTx,
        first: Heartbeat,
        reply: Reply<Result<(), CoordinatorError>>,
    },
    Heartbeat {
        node: String,
        session: u64,
        hb: Heartbeat,
    },
    SessionClosed {
        node: String,
        session: u64,
        /// What ended it, for the log.
        why: String,
    },
    AssignmentAck {
        node: String,
        ack: AssignmentAck,
    },
    /// `gpuctl remove-node`.
    RemoveNode {
        name: String,
        reply: Reply<Result<Node, CoordinatorError>>,
    },
}

impl AgentEvent {
    fn about(&self) -> About {
        match self {
            AgentEvent::AgentRegistered { .. } => About::fleet("AgentRegistered").starts_jobs(),
            AgentEvent::SessionOpened { .. } => About::fleet("SessionOpened").starts_jobs(),
            AgentEvent::Heartbeat { .. } => About::fleet("Heartbeat"),
            AgentEvent::SessionClosed { .. } => About::fleet("SessionClosed").starts_jobs(),
            AgentEvent::AssignmentAck { .. } => About::fleet("AssignmentAck").starts_jobs(),
            AgentEvent::RemoveNode { .. } => About::people("RemoveNode"),
        }
    }
}

/// A job's life as people and the scheduler's threads move it on.
#[derive(Debug)]
pub enum JobEvent {
    Submit {
        spec: JobSpec,
        reply: Reply<Result<Job, CoordinatorError>>,
    },
    /// A submitted job's plan, made off the task (`planning`).
    Planned {
        plan: Result<Plan, CoordinatorError>,
        reply: Reply<Result<Job, CoordinatorError>>,
    },
    Cancel {
        job_id: String,
        reason: String,
        reply: Reply<Result<Job, CoordinatorError>>,
    },
    /// A started job's assignments, built off the task, to send.
    Assignments {
        job_id: String,
        attempt: u32,
        messages: Vec<(String, CoordinatorMessage)>,
    },
    /// A submitted job's record could not be committed (the submitter is
    /// told so): the job fails.
    NotStored { job_id: String, why: String },
}

impl JobEvent {
    fn about(&self) -> About {
        match self {
            JobEvent::Submit { .. } => About::people("Submit"),
            JobEvent::Planned { .. } => About::people("Planned").starts_jobs(),
            JobEvent::Cancel { .. } => About::people("Cancel").starts_jobs(),
            // Someone may be waiting for the job to start.
            JobEvent::Assignments { .. } => About::people("Assignments").starts_jobs(),
            // Its nodes come free.
            JobEvent::NotStored { .. } => About::people("NotStored").starts_jobs(),
        }
    }
}

/// What running ranks send.
// A group is never bigger than `Event` was as one flat enum, which a
// `RankResult` sized anyway: boxing its big variants would only add an
// allocation per message.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum RankEvent {
    /// `arrived_ms`: when its call reached the coordinator, before it
    /// waited in the lane (`jobs::hearing`).
    WorkerProgress {
        report: RankProgressReport,
        arrived_ms: u64,
        reply: Reply<Ack>,
    },
    WorkerResult {
        result: RankResult,
        arrived_ms: u64,
        reply: Reply<(bool, String)>,
    },
    WorkerExited {
        node: String,
        exited: WorkerExited,
    },
    WorkerLog {
        node: String,
        log: WorkerLog,
    },
    Telemetry {
        node: String,
        batch: TelemetryBatch,
    },
}

impl RankEvent {
    fn about(&self) -> About {
        match self {
            RankEvent::WorkerProgress { .. } => About::fleet("WorkerProgress"),
            RankEvent::WorkerResult { .. } => About::fleet("WorkerResult").starts_jobs(),
            RankEvent::WorkerExited { .. } => About::fleet("WorkerExited").starts_jobs(),
            RankEvent::WorkerLog { .. } => About::fleet("WorkerLog"),
            RankEvent::Telemetry { .. } => About::fleet("Telemetry"),
        }
    }
}

/// Reports made off the task, coming back. In the people's lane:
/// someone may be waiting for them.
#[derive(Debug)]
pub enum ReportEvent {
    /// A complete job's verdict and report, from a blocking thread.
    Judged {
        job_id: String,
        attempt: u32,
        state: JobState,
        message: String,
        built: Box<Built>,
    },
    /// An ended job's report is in the store, from a blocking thread.
    ReportStored { job_id: String, report: Box<Report> },
    /// An ended job's report made again with its late results, stored
    /// (an error: it could not be made, the stored one stands).
    Refolded {
        job_id: String,
        report: Result<Box<Report>, ()>,
    },
}

impl ReportEvent {
    fn about(&self) -> About {
        match self {
            ReportEvent::Judged { .. } => About::people("Judged").starts_jobs(),
            ReportEvent::ReportStored { .. } => About::people("ReportStored"),
            ReportEvent::Refolded { .. } => About::people("Refolded"),
        }
    }
}

/// A report built off the task, with what the store gets beside it: what
/// [`ReportEvent::Judged`] brings back.
#[derive(Debug)]
pub struct Built {
    pub report: Report,
    pub at_ms: u64,
    /// When the job ended as the scheduler saw it (its last result handled,
    /// or its end decided): how long storing its report took is told from here.
    pub since: Instant,
    /// The report for the store.
    pub batch: Batch,
    /// The history's runs, committed after `batch` and apart from it
    /// (`history::store_runs`).
    pub history: Batch,
    /// The job's last telemetry, stored once `batch` is queued: the verdict
    /// is what an operator waits for, and at 32,768 GPUs the series are
    /// ~35 MB that the store committed ahead of it, 0.1-0.9 s, with their
    /// encoding taking CPU from the judge meanwhile.
    pub telemetry: Telemetry,
}

/// Acceptance suites that people start and stop.
#[derive(Debug)]
pub enum SuiteEvent {
    SubmitSuite {
        req: SubmitSuiteRequest,
        reply: Reply<Result<Suite, CoordinatorError>>,
    },
    CancelSuite {
        id: String,
        reply: Reply<Result<Suite, CoordinatorError>>,
    },
}

impl SuiteEvent {
    fn about(&self) -> About {
        match self {
            SuiteEvent::SubmitSuite { .. } => About::people("SubmitSuite").starts_jobs(),
            SuiteEvent::CancelSuite { .. } => About::people("CancelSuite").starts_jobs(),
        }
    }
}

/// Reads: they change nothing a person sees (a report waited for, a
/// report kept a while, are only ways to answer).
// A group is never bigger than `Event` was as one flat enum, which a
// `RankResult` sized anyway: boxing its big variants would only add an
// allocation per message.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Query {
    GetJob {
        job_id: String,
        /// See `GetJobRequest.max_ranks` (0: everything).
        max_ranks: u32,
        reply: Reply<Result<Job, CoordinatorError>>,
    },
    /// Whether a job's log lines are all in (`GetLogsResponse.settled`);
    /// `Some`: once they are stored.
    LogsSettled {
        job_id: String,
        reply: Reply<Result<Option<tokio::sync::oneshot::Receiver<()>>, CoordinatorError>>,
    },
    ListJobs {
        limit: u32,
        reply: Reply<Vec<Job>>,
    },
    /// Every node: a brief listing's table, built on the scheduler's task,
    /// or the nodes as the scheduler holds them, for the caller to copy
    /// (`SchedulerHandle::list_nodes`).
    ListNodes {
        brief: bool,
        reply: Reply<Listing>,
    },
    GetTelemetry {
        job_id: String,
        reply: Reply<Result<Vec<TelemetryBatch>, CoordinatorError>>,
    },
    GetReport {
        job_id: String,
        reply: ReportReply,
    },
    /// Counts for `/metrics`.
    Metrics {
        reply: Reply<Snapshot>,
    },
    GetSuite {
        id: String,
        reply: Reply<Result<Suite, CoordinatorError>>,
    },
    /// The session of a node, to send it requests that need no scheduling
    /// (`GetTrace`'s pieces); `None` while it has none.
    Session {
        node: String,
        reply: Reply<Option<SessionTx>>,
    },
    /// `gpuctl plan`: what a submit would do.
    Plan {
        spec: JobSpec,
        /// See `PlanRequest.max_ranks` (0: the whole plan).
        max_ranks: u32,
        reply: Reply<Result<Plan, CoordinatorError>>,
    },
}

impl Query {
    fn about(&self) -> About {
        match self {
            Query::GetJob { .. } => About::people("GetJob"),
            Query::LogsSettled { .. } => About::people("LogsSettled"),
            Query::ListJobs { .. } => About::people("ListJobs"),
            Query::ListNodes { .. } => About::people("ListNodes"),
            Query::GetTelemetry { .. } => About::people("GetTelemetry"),
            Query::GetReport { .. } => About::people("GetReport"),
            Query::Metrics { .. } => About::people("Metrics"),
            Query::GetSuite { .. } => About::people("GetSuite"),
            Query::Session { .. } => About::people("Session"),
            Query::Plan { .. } => About::people("Plan"),
        }
    }
}

/// What `ListNodes` takes from the scheduler: a brief listing's table, or
/// every node whole (`-o json`), which the caller copies out of its `Arc`s
/// (the table too: it is also kept, `listing.rs`).
#[derive(Debug)]
pub enum Listing {
    Table(std::sync::Arc<NodeTable>),
    Nodes(Vec<std::sync::Arc<Node>>),
}

macro_rules! into_event {
    ($($group:ident => $variant:ident),* $(,)?) => {
        $(impl From<$group> for Event {
            fn from(e: $group) -> Event {
                Event::$variant(e)
            }
        })*
    };
}

into_event!(
    AgentEvent => Agent,
    JobEvent => Job,
    RankEvent => Rank,
    ReportEvent => Report,
    SuiteEvent => Suite,
    Query => Query,
);

#[cfg(test)]
mod tests {
    use super::*;

    /// The facts that were three lists before, kept as they were: the
    /// lanes decide who waits behind whom.
    #[test]
    fn people_wait_in_their_lane_and_streams_start_no_jobs() {
        let (tx, _) = oneshot::channel();
        let list = Event::Query(Query::ListJobs {
            limit: 0,
            reply: tx,
        });
        assert_eq!(list.about(), About::people("ListJobs"));
        let hb = Event::Agent(AgentEvent::Heartbeat {
            node: "n".into(),
            session: 1,
            hb: Heartbeat::default(),
        });
        assert_eq!(
            (hb.name(), hb.about().lane, hb.about().may_start_jobs),
            ("Heartbeat", Lane::Fleet, false)
        );
        let (tx, _) = oneshot::channel();
        let cancel = Event::from(JobEvent::Cancel {
            job_id: "job-000001".into(),
            reason: String::new(),
            reply: tx,
        });
        assert_eq!(cancel.about(), About::people("Cancel").starts_jobs());
        assert!(Event::Tick.about().may_start_jobs);
    }
}

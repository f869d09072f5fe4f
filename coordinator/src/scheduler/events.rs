//! Everything that can change the scheduler's state arrives as one of these
//! events, from gRPC handlers or the tick timer. Requests that need an answer
//! carry a oneshot for it.

use gpuctl_core::pb::{
    Ack, AssignmentAck, CoordinatorMessage, Heartbeat, Job, JobSpec, JobState, Node, Plan,
    RankProgressReport, RankResult, RegisterRequest, RegisterResponse, Report, SubmitSuiteRequest,
    Suite, TelemetryBatch, WorkerExited, WorkerLog,
};
use tokio::sync::{mpsc, oneshot};

use super::reports::Built;
use super::snapshot::Snapshot;
use super::views::Listing;
use crate::error::CoordinatorError;

pub type Reply<T> = oneshot::Sender<T>;

/// The downstream half of an agent's session: what the scheduler tells that
/// agent. The service layer turns it into the gRPC stream.
/// Boxed: a channel allocates a block of 32 slots up front, and at the
/// size of an assignment that was 17 KB for every connected node.
pub type SessionTx = mpsc::UnboundedSender<Box<CoordinatorMessage>>;

#[derive(Debug)]
pub enum Event {
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
    Submit {
        spec: JobSpec,
        reply: Reply<Result<Job, CoordinatorError>>,
    },
    /// A submitted job's plan, made off the task ([`super::planning`]).
    Planned {
        plan: Result<Plan, CoordinatorError>,
        reply: Reply<Result<Job, CoordinatorError>>,
    },
    Plan {
        spec: JobSpec,
        /// See `PlanRequest.max_ranks` (0: the whole plan).
        max_ranks: u32,
        reply: Reply<Result<Plan, CoordinatorError>>,
    },
    Cancel {
        job_id: String,
        reason: String,
        reply: Reply<Result<Job, CoordinatorError>>,
    },
    WorkerProgress {
        report: RankProgressReport,
        reply: Reply<Ack>,
    },
    WorkerResult {
        result: RankResult,
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
    /// Every 500 ms: lost nodes, deadlines, pending jobs.
    Tick,
    GetJob {
        job_id: String,
        /// See `GetJobRequest.max_ranks` (0: everything).
        max_ranks: u32,
        reply: Reply<Result<Job, CoordinatorError>>,
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
    RemoveNode {
        name: String,
        reply: Reply<Result<Node, CoordinatorError>>,
    },
    GetTelemetry {
        job_id: String,
        reply: Reply<Result<Vec<TelemetryBatch>, CoordinatorError>>,
    },
    GetReport {
        job_id: String,
        reply: Reply<Result<Report, CoordinatorError>>,
    },
    /// Counts for `/metrics`.
    Metrics {
        reply: Reply<Snapshot>,
    },
    SubmitSuite {
        req: SubmitSuiteRequest,
        reply: Reply<Result<Suite, CoordinatorError>>,
    },
    GetSuite {
        id: String,
        reply: Reply<Result<Suite, CoordinatorError>>,
    },
    CancelSuite {
        id: String,
        reply: Reply<Result<Suite, CoordinatorError>>,
    },
    /// A started job's assignments, built off the task, to send.
    Assignments {
        job_id: String,
        attempt: u32,
        messages: Vec<(String, CoordinatorMessage)>,
    },
    /// A complete job's verdict and report, from a blocking thread.
    Judged {
        job_id: String,
        attempt: u32,
        state: JobState,
        message: String,
        built: Box<Built>,
    },
    /// An ended job's report is in the store, from a blocking thread.
    ReportStored {
        job_id: String,
        report: Box<Report>,
    },
    /// An ended job's report made again with its late results, stored
    /// (an error: it could not be made, the stored one stands).
    Refolded {
        job_id: String,
        report: Result<Box<Report>, ()>,
    },
}

impl Event {
    /// The variant's name, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Event::AgentRegistered { .. } => "AgentRegistered",
            Event::SessionOpened { .. } => "SessionOpened",
            Event::Heartbeat { .. } => "Heartbeat",
            Event::SessionClosed { .. } => "SessionClosed",
            Event::AssignmentAck { .. } => "AssignmentAck",
            Event::Submit { .. } => "Submit",
            Event::Planned { .. } => "Planned",
            Event::Plan { .. } => "Plan",
            Event::Cancel { .. } => "Cancel",
            Event::WorkerProgress { .. } => "WorkerProgress",
            Event::WorkerResult { .. } => "WorkerResult",
            Event::WorkerExited { .. } => "WorkerExited",
            Event::WorkerLog { .. } => "WorkerLog",
            Event::Telemetry { .. } => "Telemetry",
            Event::Tick => "Tick",
            Event::GetJob { .. } => "GetJob",
            Event::ListJobs { .. } => "ListJobs",
            Event::ListNodes { .. } => "ListNodes",
            Event::RemoveNode { .. } => "RemoveNode",
            Event::GetTelemetry { .. } => "GetTelemetry",
            Event::GetReport { .. } => "GetReport",
            Event::Metrics { .. } => "Metrics",
            Event::Judged { .. } => "Judged",
            Event::Assignments { .. } => "Assignments",
            Event::SubmitSuite { .. } => "SubmitSuite",
            Event::GetSuite { .. } => "GetSuite",
            Event::CancelSuite { .. } => "CancelSuite",
            Event::ReportStored { .. } => "ReportStored",
            Event::Refolded { .. } => "Refolded",
        }
    }

    /// Whether a person (the CLI, a script, `/metrics`) is waiting on this
    /// rather than an agent or a worker: served on the scheduler's first lane.
    pub fn from_people(&self) -> bool {
        matches!(
            self,
            Event::Submit { .. }
                | Event::Planned { .. }
                | Event::Plan { .. }
                | Event::Cancel { .. }
                | Event::GetJob { .. }
                | Event::ListJobs { .. }
                | Event::ListNodes { .. }
                | Event::RemoveNode { .. }
                | Event::GetTelemetry { .. }
                | Event::GetReport { .. }
                | Event::Metrics { .. }
                | Event::SubmitSuite { .. }
                | Event::GetSuite { .. }
                | Event::CancelSuite { .. }
                // Someone may be waiting for these.
                | Event::Assignments { .. }
                | Event::Judged { .. }
                | Event::ReportStored { .. }
                | Event::Refolded { .. }
        )
    }

    /// Whether handling this event may free nodes or add a job, so that
    /// waiting jobs are looked at afterwards. Reads and the per-second streams
    /// (heartbeats, progress, logs, telemetry) cannot; a node that comes back
    /// by heartbeat is picked up by the next tick.
    pub fn may_start_jobs(&self) -> bool {
        match self {
            Event::AgentRegistered { .. }
            | Event::SessionOpened { .. }
            | Event::SessionClosed { .. }
            | Event::AssignmentAck { .. }
            | Event::Planned { .. }
            | Event::Cancel { .. }
            | Event::WorkerResult { .. }
            | Event::WorkerExited { .. }
            | Event::Assignments { .. }
            | Event::Judged { .. }
            | Event::SubmitSuite { .. }
            | Event::CancelSuite { .. }
            | Event::Tick => true,
            Event::Heartbeat { .. }
            | Event::WorkerProgress { .. }
            | Event::WorkerLog { .. }
            | Event::Telemetry { .. }
            | Event::Submit { .. }
            | Event::Plan { .. }
            | Event::GetJob { .. }
            | Event::ListJobs { .. }
            | Event::ListNodes { .. }
            | Event::RemoveNode { .. }
            | Event::GetTelemetry { .. }
            | Event::GetReport { .. }
            | Event::ReportStored { .. }
            | Event::Refolded { .. }
            | Event::GetSuite { .. }
            | Event::Metrics { .. } => false,
        }
    }
}

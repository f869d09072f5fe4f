//! Everything that can change the scheduler's state arrives as one of these
//! events, from gRPC handlers or the tick timer. Requests that need an answer
//! carry a oneshot for it.

use gpuctl_proto::pb::{
    AssignmentAck, CoordinatorMessage, Heartbeat, Job, JobSpec, Node, Plan, RankProgressReport,
    RankResult, RegisterRequest, RegisterResponse, Report, TelemetryBatch, WorkerExited, WorkerLog,
};
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

pub type Reply<T> = oneshot::Sender<T>;

/// The downstream half of an agent's session.
pub type SessionTx = mpsc::UnboundedSender<Result<CoordinatorMessage, Status>>;

#[derive(Debug)]
pub enum Event {
    AgentRegistered {
        req: RegisterRequest,
        /// The URL workers on this node should use.
        coordinator_url: String,
        reply: Reply<Result<RegisterResponse, Status>>,
    },
    SessionOpened {
        node: String,
        session: u64,
        tx: SessionTx,
        first: Heartbeat,
        reply: Reply<Result<(), Status>>,
    },
    Heartbeat {
        node: String,
        session: u64,
        hb: Heartbeat,
    },
    SessionClosed {
        node: String,
        session: u64,
    },
    AssignmentAck {
        node: String,
        ack: AssignmentAck,
    },
    Submit {
        spec: JobSpec,
        reply: Reply<Result<Job, Status>>,
    },
    Plan {
        spec: JobSpec,
        reply: Reply<Result<Plan, Status>>,
    },
    Cancel {
        job_id: String,
        reason: String,
        reply: Reply<Result<Job, Status>>,
    },
    WorkerProgress {
        report: RankProgressReport,
        reply: Reply<(bool, String)>,
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
        reply: Reply<Result<Job, Status>>,
    },
    ListJobs {
        limit: u32,
        reply: Reply<Vec<Job>>,
    },
    ListNodes {
        reply: Reply<Vec<Node>>,
    },
    GetTelemetry {
        job_id: String,
        reply: Reply<Result<Vec<TelemetryBatch>, Status>>,
    },
    GetReport {
        job_id: String,
        reply: Reply<Result<Report, Status>>,
    },
    /// Counts for `/metrics`.
    Metrics {
        reply: Reply<crate::metrics::Snapshot>,
    },
}

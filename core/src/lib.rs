//! gpuctl-core: what every gpuctl process shares, so a newcomer looks here first
//! for anything two binaries agree on. The wire protocol (`gpuctl.v1`: the
//! generated messages and services in `pb`, the protocol version); the rules of
//! a job spec with the catalogue of workload parameters, the acceptance suites,
//! limits, statistics and the node and link search; and the plumbing every
//! binary shares: the one gRPC server and client builders, the shutdown signal,
//! leader election and the `/metrics` server.

pub mod auth;
pub mod catalogue;
pub mod client;
pub mod clock;
pub mod codec;
pub mod conn;
pub mod host_memory;
pub mod leader;
pub mod limits;
pub mod listing;
pub mod metrics_http;
pub mod metrics_tls;
pub mod pairs;
pub mod rendezvous_keys;
pub mod request;
pub mod search;
pub mod server;
pub mod server_tls;
pub mod shutdown;
pub mod spec;
pub mod stats;
pub mod suite;
pub mod timeline;
pub mod units;

/// Generated from `proto/gpuctl.proto`.
pub mod pb {
    tonic::include_proto!("gpuctl.v1");
}

/// Bumped whenever a message changes meaning. Agents send it on register and on
/// every heartbeat; the coordinator refuses a mismatch. 2: `RankPlacement`
/// names its GPU by `gpu_index` instead of a `device` string. 3: agents
/// re-register with the jobs they still run (adoption), ranks report an
/// iteration counter, WorkerService calls carry a per-rank secret. 4: why a
/// worker was stopped is the `StopReason` enum (`WorkerExited.stopped_by`,
/// `CancelJob.kind`), not a string.
pub const PROTOCOL_VERSION: u32 = 4;

/// How many ranks a person's view of a job shows (`gpuctl status`, the live
/// view): a job on thousands of GPUs is asked for those furthest behind
/// (`GetJobRequest.max_ranks`), not for every rank.
pub const VIEW_RANKS: u32 = 64;

/// Milliseconds since the Unix epoch, the one clock every message uses.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// How a rank's device is shown: `cuda:N` (N = NVML index) or `cpu`.
pub fn device_label(gpu_index: Option<u32>) -> String {
    match gpu_index {
        Some(i) => format!("cuda:{i}"),
        None => "cpu".into(),
    }
}

impl pb::RankPlacement {
    /// `cuda:N` or `cpu`, for tables, logs and messages (the report's plausibility check tells CPU ranks by it).
    pub fn device_label(&self) -> String {
        device_label(self.gpu_index)
    }

    /// Whether the rank runs on a GPU.
    pub fn is_gpu(&self) -> bool {
        self.gpu_index.is_some()
    }
}

impl pb::Plan {
    /// Each node's ranks, in plan order: one pass over the ranks instead of
    /// one per node (a 4,096-node plan has 32,768 ranks).
    pub fn ranks_by_node(&self) -> std::collections::HashMap<&str, Vec<&pb::RankPlacement>> {
        let mut out: std::collections::HashMap<&str, Vec<&pb::RankPlacement>> =
            std::collections::HashMap::with_capacity(self.nodes.len());
        for p in &self.ranks {
            out.entry(p.node.as_str()).or_default().push(p);
        }
        out
    }

    /// A rank's placement. The planner lists ranks in order, so this is an
    /// index; a plan written otherwise is searched.
    pub fn placement(&self, rank: u32) -> Option<&pb::RankPlacement> {
        match self.ranks.get(rank as usize) {
            Some(p) if p.rank == rank => Some(p),
            _ => self.ranks.iter().find(|p| p.rank == rank),
        }
    }
}

impl pb::JobState {
    /// Finished jobs never change state again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            pb::JobState::Succeeded | pb::JobState::Failed | pb::JobState::Cancelled
        )
    }

    /// Short lower-case name for tables and JSON.
    pub fn label(self) -> &'static str {
        match self {
            pb::JobState::Unspecified => "unknown",
            pb::JobState::Pending => "pending",
            pb::JobState::Running => "running",
            pb::JobState::Succeeded => "succeeded",
            pb::JobState::Failed => "failed",
            pb::JobState::Cancelled => "cancelled",
        }
    }
}

impl pb::StopReason {
    /// The word logs, messages and reports use ("hang", "coordinator-lost");
    /// empty when the worker was not stopped.
    pub fn label(self) -> &'static str {
        match self {
            pb::StopReason::Unspecified => "",
            pb::StopReason::Cancel => "cancel",
            pb::StopReason::Hang => "hang",
            pb::StopReason::Deadline => "deadline",
            pb::StopReason::CoordinatorLost => "coordinator-lost",
            pb::StopReason::AgentShutdown => "agent-shutdown",
        }
    }

    /// Whether the coordinator asked for the stop (the job ended around
    /// the worker: its own fault is not shown by it).
    pub fn by_coordinator(self) -> bool {
        matches!(self, pb::StopReason::Cancel | pb::StopReason::Hang)
    }
}

impl pb::Verdict {
    pub fn label(self) -> &'static str {
        match self {
            pb::Verdict::Unspecified => "unknown",
            pb::Verdict::Pass => "pass",
            pb::Verdict::Warn => "warn",
            pb::Verdict::Fail => "fail",
            pb::Verdict::Incomplete => "incomplete",
        }
    }
}

impl pb::NodeState {
    pub fn label(self) -> &'static str {
        match self {
            pb::NodeState::Unspecified => "unknown",
            pb::NodeState::Ready => "ready",
            pb::NodeState::Busy => "busy",
            pb::NodeState::Lost => "lost",
        }
    }
}

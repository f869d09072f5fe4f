//! gpuctl-proto: the `gpuctl.v1` wire, the one language every gpuctl process
//! speaks (CLI to coordinator, agent to coordinator, worker to coordinator
//! through its agent). Here and nowhere else: the messages and services
//! generated from `gpuctl.proto` (`pb`), the protocol version agents and the
//! coordinator compare (`PROTOCOL_VERSION`), the constants both ends of a call
//! agree on (`VIEW_RANKS`), the codec every service and client uses (`codec`),
//! what the generated types say of themselves (an enum's label, a plan's ranks
//! by node), and the brief listing of nodes, a `NodeTable` of columns built and
//! read back row by row (`listing`), and a report sent encoded read back
//! (`PackedReport::unpack`).
//!
//! The bounds on what one process accepts from another are checked against
//! these messages in `gpuctl_core::limits`: their refusals are the job-spec
//! errors (`gpuctl_core::catalogue::SpecError`) every binary shows.

pub mod codec;
pub mod listing;

/// Generated from `gpuctl.proto` (by `build.rs`).
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
/// (`GetJobRequest.max_ranks`), not for every rank. Both ends use it: the
/// coordinator keeps a retired job's view of this size ready.
pub const VIEW_RANKS: u32 = 64;

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

impl pb::PackedReport {
    /// The report it carries (`GetReportPacked`).
    pub fn unpack(self) -> Result<pb::Report, prost::DecodeError> {
        <pb::Report as prost::Message>::decode(self.report)
    }
}

//! The gpuctl wire protocol (`gpuctl.v1`) and what every process needs to speak it:
//! the generated messages and services, the protocol version, job-spec validation
//! shared by the CLI and the coordinator, and the one place that builds gRPC servers.

pub mod client;
pub mod metrics_http;
pub mod server;
pub mod shutdown;
pub mod spec;
pub mod units;

/// Generated from `proto/gpuctl.proto`.
pub mod pb {
    tonic::include_proto!("gpuctl.v1");
}

/// Bumped whenever a message changes meaning. Agents send it on register and on
/// every heartbeat; the coordinator refuses a mismatch.
pub const PROTOCOL_VERSION: u32 = 1;

/// Milliseconds since the Unix epoch, the one clock every message uses.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
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

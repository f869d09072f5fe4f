//! What the scheduler and the planner answer when they refuse or fail. The
//! messages are written for the user at the other end of the call; which gRPC
//! code each kind becomes is decided in `service/`, the only place that
//! speaks gRPC.

use gpuctl_core::spec::SpecError;

use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    /// No job by that id.
    #[error("no job `{0}`; `gpuctl jobs` lists the jobs")]
    JobNotFound(String),
    /// A job that ended and was deleted past `--keep-jobs` or
    /// `--keep-jobs-bytes`.
    #[error("job `{id}` was deleted: the coordinator keeps the {keep} jobs that ended last (--keep-jobs), {} of their data at most (--keep-jobs-bytes); what it found per node stays in `gpuctl fleet`", gpuctl_core::units::format_bytes(*keep_bytes))]
    JobDeleted {
        id: String,
        keep: usize,
        keep_bytes: u64,
    },
    /// No node by that name.
    #[error("no node `{0}`; `gpuctl nodes` lists them")]
    NodeNotFound(String),
    /// No saved baseline by that name.
    #[error("no baseline `{0}`; `gpuctl baseline list` lists them, `gpuctl baseline save JOB --name NAME` makes one")]
    BaselineNotFound(String),
    /// No acceptance certificate for that node.
    #[error(
        "node `{0}` has no certificate: `gpuctl accept` issues one per node when its suite ends"
    )]
    CertNotFound(String),
    /// One field of a request is wrong; the message names it.
    #[error("{field}: {message}")]
    InvalidField { field: String, message: String },
    /// Fewer live nodes match than the job asks for; the message names them.
    #[error("{0}")]
    NotEnoughNodes(String),
    /// A preflight check that stops a job failed; the message names the node
    /// and the fix.
    #[error("{0}")]
    PlanRefused(String),
    /// The request does not fit the current state (an agent's session before
    /// its registration, say); the message says what to do.
    #[error("{0}")]
    Refused(String),
    /// The state store failed while `doing` something.
    #[error("{doing}: {source}")]
    Store {
        doing: String,
        #[source]
        source: StoreError,
    },
    /// A new node would pass `--max-nodes`.
    #[error("the fleet holds {max} nodes, this coordinator's --max-nodes: remove nodes that left (`gpuctl nodes remove NAME`) or start the coordinator with a larger --max-nodes")]
    FleetFull { max: usize },
    /// The scheduler task has stopped.
    #[error("the coordinator is shutting down")]
    ShuttingDown,
}

impl CoordinatorError {
    pub fn store(doing: impl Into<String>, source: StoreError) -> Self {
        CoordinatorError::Store {
            doing: doing.into(),
            source,
        }
    }
}

impl From<SpecError> for CoordinatorError {
    fn from(e: SpecError) -> Self {
        CoordinatorError::InvalidField {
            field: e.field,
            message: e.message,
        }
    }
}

//! The three gRPC services. Handlers are thin: they check what they can alone,
//! turn the call into a scheduler event and wait for the answer. This is the
//! only layer that speaks gRPC: the scheduler's [`CoordinatorError`]s become
//! `tonic::Status` codes here.

pub mod admission;
pub mod agent;
pub mod auth;
pub mod baseline;
pub mod cert;
pub mod gate;
pub mod inbox;
pub mod job;
pub mod pieces;
pub mod trace;
pub mod worker;

use tonic::Status;

use crate::error::CoordinatorError;

/// Refusals quote what they refuse; a megabyte of name is not sent back.
const MAX_STATUS_MESSAGE: usize = 2048;

pub(crate) fn clip(mut message: String) -> String {
    if message.len() > MAX_STATUS_MESSAGE {
        let mut end = MAX_STATUS_MESSAGE;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        let cut = message.len() - end;
        message.truncate(end);
        message.push_str(&format!("… ({cut} more bytes)"));
    }
    message
}

impl From<CoordinatorError> for Status {
    fn from(e: CoordinatorError) -> Status {
        let message = clip(e.to_string());
        match e {
            CoordinatorError::JobNotFound(_)
            | CoordinatorError::JobDeleted { .. }
            | CoordinatorError::NodeNotFound(_)
            | CoordinatorError::BaselineNotFound(_)
            | CoordinatorError::CertNotFound(_) => Status::not_found(message),
            CoordinatorError::InvalidField { .. } => Status::invalid_argument(message),
            CoordinatorError::NotEnoughNodes(_)
            | CoordinatorError::PlanRefused(_)
            | CoordinatorError::Refused(_) => Status::failed_precondition(message),
            CoordinatorError::FleetFull { .. } => Status::resource_exhausted(message),
            CoordinatorError::Store { .. } | CoordinatorError::ShuttingDown => {
                Status::unavailable(message)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;
    use tonic::Code;

    #[test]
    fn each_error_keeps_its_message_under_its_code() {
        let cases = [
            (
                CoordinatorError::JobNotFound("job-000009".into()),
                Code::NotFound,
                "no job `job-000009`; `gpuctl jobs` lists the jobs",
            ),
            (
                CoordinatorError::JobDeleted {
                    id: "job-000002".into(),
                    keep: 200,
                    keep_bytes: 32 << 30,
                },
                Code::NotFound,
                "job `job-000002` was deleted: the coordinator keeps the 200 jobs that ended last (--keep-jobs), 32 GiB of their data at most (--keep-jobs-bytes); what it found per node stays in `gpuctl fleet`",
            ),
            (
                gpuctl_core::spec::parse_selector("gpu")
                    .unwrap_err()
                    .into(),
                Code::InvalidArgument,
                "--selector: `gpu` is not a selector",
            ),
            (
                CoordinatorError::NotEnoughNodes("asked for 2 nodes, 1 matches".into()),
                Code::FailedPrecondition,
                "asked for 2 nodes, 1 matches",
            ),
            (
                CoordinatorError::PlanRefused("preflight `shm` failed".into()),
                Code::FailedPrecondition,
                "preflight `shm` failed",
            ),
            (
                CoordinatorError::Refused("node `n` is not registered".into()),
                Code::FailedPrecondition,
                "node `n` is not registered",
            ),
            (
                CoordinatorError::store(
                    "could not store the job",
                    StoreError::Backend("disk full".into()),
                ),
                Code::Unavailable,
                "could not store the job: state store: disk full",
            ),
            (
                CoordinatorError::ShuttingDown,
                Code::Unavailable,
                "the coordinator is shutting down",
            ),
        ];
        for (err, code, message) in cases {
            let status = Status::from(err);
            assert_eq!(status.code(), code, "{}", status.message());
            assert!(
                status.message().starts_with(message),
                "{:?} does not start with {message:?}",
                status.message()
            );
        }
    }
}

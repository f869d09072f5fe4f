//! A job that fails for what it asked, not for what a node did (issue 47).
//! Every rule of a request that can be known before anything runs is
//! checked at submit and in `gpuctl plan` (`catalogue::shape`); what only a
//! running rank can find (a worker that knows other rules than its
//! coordinator, a shape the coordinator could not see) the rank says is
//! the request's, so that the coordinator records it as the job's error
//! and as no node's failure: not in the report's node verdicts, the fleet
//! history, the acceptance state, or a drain or taint decision.
//!
//! The wire has no field for it: `RankResult.error` is text, and a
//! request's error starts with [`RANK_MARK`]; the job's message then starts
//! with [`JOB_MARK`]. Only a worker's own words can say it, so a rank that
//! lies can hide its node's failure in a job that then fails as a whole,
//! as one that sends no result can; it cannot blame another node.

/// What a worker's error about the request starts with.
pub const RANK_MARK: &str = "request: ";

/// What the message of a job that failed for its request starts with.
pub const JOB_MARK: &str = "the request cannot run: ";

/// The metric of a report's finding that says the job failed for its request.
pub const FINDING_METRIC: &str = "request";

/// An error about the request itself, returned through `anyhow` by the code
/// that finds it; the worker marks its result's error when one is in the chain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RequestError(pub String);

impl From<crate::catalogue::SpecError> for RequestError {
    fn from(e: crate::catalogue::SpecError) -> Self {
        RequestError(e.to_string())
    }
}

/// A rank's error text about the request: `error` marked.
pub fn rank_error(error: &str) -> String {
    format!("{RANK_MARK}{error}")
}

/// The request's error of a rank's error text, if it is one.
pub fn of_rank(error: &str) -> Option<&str> {
    error.strip_prefix(RANK_MARK)
}

/// The message of a job that failed for its request: `why`, and who found it.
pub fn job_message(why: &str, found_by: &str) -> String {
    if found_by.is_empty() {
        format!("{JOB_MARK}{why}")
    } else {
        format!("{JOB_MARK}{why} (found by {found_by})")
    }
}

/// Whether a job's message (or its report's reason) says it failed for its request.
pub fn is_job_message(message: &str) -> bool {
    message.starts_with(JOB_MARK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_round_trip_and_nothing_else_is_a_request_error() {
        let e = rank_error("node a rank 0 (cpu): --pattern search needs 3 nodes or more");
        assert_eq!(
            of_rank(&e),
            Some("node a rank 0 (cpu): --pattern search needs 3 nodes or more")
        );
        assert_eq!(of_rank("node a rank 0 (cpu): request: no"), None);
        let m = job_message("--pattern search needs 3 nodes or more", "rank 0 on node a");
        assert!(is_job_message(&m), "{m}");
        assert!(m.ends_with("(found by rank 0 on node a)"), "{m}");
        assert!(!is_job_message("rank 0 on node a (cpu) exited with code 1"));
        let spec = crate::catalogue::SpecError {
            field: "--precision".into(),
            message: "tf32 needs a GPU".into(),
        };
        assert_eq!(RequestError::from(spec).0, "--precision: tf32 needs a GPU");
    }
}

//! When a running job is out of time. Every rule that ends a job by the
//! clock, except a hung rank's ([`super::hang`]) and a lost node's
//! ([`crate::fleet::node`]), is here, each a pure function of the job and
//! `now` so that tests move time by hand.
//!
//! ```text
//!   started ── budget (spec: timeout, or duration + grace) ──► deadline
//!     agents kill the workers here ─────────────────────────────┘
//!   deadline ── DEADLINE_GRACE_MS ──► overdue: the coordinator fails the job
//!   restart ── adopt grace ──► adopt_by: nodes not back fail their job
//! ```

use std::time::Duration;

use gpuctl_core::spec::{self, DEADLINE_GRACE_MS};
use gpuctl_proto::pb::JobSpec;

/// When the agents kill a job's workers (Unix ms); the deadline the
/// assignment carries.
pub fn deadline(started_unix_ms: u64, spec: &JobSpec) -> u64 {
    started_unix_ms.saturating_add(spec::job_budget_ms(spec))
}

/// Whether a job with `deadline_unix_ms` (0: none) is past its deadline and
/// its grace at `now`: its agents should have reported by then, so the
/// coordinator fails it itself.
pub fn overdue(deadline_unix_ms: u64, now: u64) -> bool {
    deadline_unix_ms > 0 && now > deadline_unix_ms.saturating_add(DEADLINE_GRACE_MS)
}

/// The hang timeout of a job (ms): its spec's, or the default.
pub fn hang_timeout(spec: Option<&JobSpec>) -> u64 {
    spec.map_or(spec::DEFAULT_HANG_TIMEOUT_MS, spec::hang_timeout_ms)
}

/// Until when a restarted coordinator waits for a running job's agents to
/// hand its workers back.
pub fn adopt_by(now: u64, grace: Duration) -> u64 {
    now.saturating_add(grace.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_overdue_only_past_its_deadline_and_the_grace() {
        let s = JobSpec {
            workload: "stress".into(),
            duration_ms: 60_000,
            ..Default::default()
        };
        let d = deadline(1_000, &s);
        assert_eq!(d, 1_000 + 60_000 + spec::TIMED_GRACE_MS);
        assert!(!overdue(d, d + DEADLINE_GRACE_MS));
        assert!(overdue(d, d + DEADLINE_GRACE_MS + 1));
        assert!(!overdue(0, u64::MAX), "no deadline, never overdue");
    }

    #[test]
    fn the_hang_timeout_is_the_specs_or_the_default() {
        assert_eq!(hang_timeout(None), spec::DEFAULT_HANG_TIMEOUT_MS);
        let s = JobSpec {
            hang_timeout_ms: 30_000,
            ..Default::default()
        };
        assert_eq!(hang_timeout(Some(&s)), 30_000);
        assert_eq!(adopt_by(5, Duration::from_secs(70)), 70_005);
    }
}

//! Planning, free of I/O and of scheduler state: which nodes a job gets, its
//! rank table and environment, and the preflight checks that decide whether
//! the plan can run. The scheduler asks; nothing here schedules.

pub mod memory;
pub mod nccl_env;
pub mod planner;
pub mod preflight;

use gpuctl_core::pb::{PreflightCheck, Verdict};

/// One check's finding; `node` is empty for a finding about the whole plan.
fn check(node: &str, name: &str, verdict: Verdict, detail: String, fix: &str) -> PreflightCheck {
    PreflightCheck {
        node: node.into(),
        name: name.into(),
        verdict: verdict as i32,
        detail,
        fix: fix.into(),
    }
}

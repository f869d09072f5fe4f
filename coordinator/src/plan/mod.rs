//! Planning, free of I/O and of scheduler state: which nodes a job gets, its
//! rank table and environment, and the preflight checks that decide whether
//! the plan can run. The scheduler asks; nothing here schedules.

pub mod nccl_env;
pub mod planner;

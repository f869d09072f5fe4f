//! Judging a job: performance figures against the fleet, baselines and floors.

pub mod figures;
pub mod perf;
pub mod rules;

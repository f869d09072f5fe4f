//! Judging, free of I/O and of scheduler state: GPU telemetry series and
//! their summaries, the health rules that read them, the performance figures
//! of a job against the fleet, a baseline and the floors, and the report that
//! turns results and telemetry into verdicts. The scheduler feeds it; nothing
//! here schedules.

pub mod bisect;
pub mod figures;
pub mod fleet;
pub mod health;
pub mod links;
pub mod metric;
pub mod p2p;
pub mod perf;
pub mod report;
pub mod rules;
pub mod search;
pub mod series;
pub mod telemetry;
pub mod thin;
pub mod votes;

//! Judging, free of I/O and of scheduler state: GPU telemetry series and
//! their summaries, every check that reads them or a job's figures
//! ([`checks`], one folder per kind), and the report that places the
//! checks' answers on ranks and nodes and turns them into verdicts. The
//! scheduler feeds it; nothing here schedules.

pub mod checks;
pub mod figures;
pub mod fleet;
pub mod metric;
pub mod report;
pub mod series;
pub mod telemetry;
pub mod thin;

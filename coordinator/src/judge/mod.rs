//! Judging, free of I/O and of scheduler state: GPU telemetry series and
//! their summaries, the health rules that read them, and the report that
//! turns results and telemetry into verdicts. The scheduler feeds it; nothing
//! here schedules.

pub mod health;
pub mod report;
pub mod series;
pub mod telemetry;

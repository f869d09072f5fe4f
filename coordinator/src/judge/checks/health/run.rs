//! What every GPU telemetry check reads and writes: one GPU's totals with
//! the counters at both ends taken out once ([`Run`]), and the list its
//! rules fire into ([`Sink`]), as [`Check`]s about that GPU.

use super::super::{Check, Level, Phase, Severity};
use crate::judge::series::{Bucket, Counters};

/// One GPU's totals as every family reads them: the counters at both ends
/// taken out once, not once per family.
pub struct Run<'a> {
    pub t: &'a Bucket,
    pub first: Counters,
    pub last: Counters,
    /// The minutes rates are taken over ([`rate_minutes`]).
    pub minutes: f64,
}

impl Run<'_> {
    pub fn of(t: &Bucket) -> Run<'_> {
        let (first, last) = t.counter_ends();
        Run {
            t,
            first,
            last,
            minutes: rate_minutes(t),
        }
    }

    /// How far a counter moved during the run; a counter reset is no move.
    pub fn delta(&self, f: fn(&Counters) -> u64) -> u64 {
        f(&self.last).saturating_sub(f(&self.first))
    }
}

/// What fired, in order. A rule set to `off` is dropped here, so that no
/// family has to ask.
#[derive(Default)]
pub struct Sink(pub(super) Vec<Check>);

impl Sink {
    pub fn fire(&mut self, severity: Severity, rule: &str, detail: String) {
        self.fire_in(severity, rule, detail, Phase::Run);
    }

    pub fn fire_in(&mut self, severity: Severity, rule: &str, detail: String, phase: Phase) {
        if let Some(level) = severity.level() {
            self.0.push(gpu_check(level, rule, detail, phase));
        }
    }
}

/// A health rule's answer about one GPU, before the GPU is named (the
/// telemetry summary names it: [`name_gpu`]).
pub fn gpu_check(level: Level, rule: &str, detail: String, phase: Phase) -> Check {
    Check {
        key: rule.to_string(),
        rule: rule.to_string(),
        phase,
        level,
        metric: "health".into(),
        detail,
        ..Default::default()
    }
}

/// Names the GPU a health check is about.
pub fn name_gpu(mut c: Check, node: &str, index: u32, uuid: &str) -> Check {
    c.node = node.to_string();
    c.gpu_index = Some(index);
    c.gpu_uuid = uuid.to_string();
    c
}

/// The minutes a bucket's rates are taken over: at least one, so a short
/// run's one replay is not a storm.
pub fn rate_minutes(t: &Bucket) -> f64 {
    (t.end_ms.saturating_sub(t.start_ms) as f64 / 60_000.0).max(1.0)
}

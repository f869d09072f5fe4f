//! The GPU telemetry checks run together: what in a job's telemetry fails or
//! warns a GPU, and why.
//! The defaults follow what DCGM's health watches and the cloud providers'
//! node checks flag (critical XIDs, uncorrectable ECC, retired pages and row
//! remapping, degraded PCIe and NVLink, hardware slowdown, heat); an operator
//! overrides any of them with `gpuctl-coordinator --health-rules FILE` (TOML or
//! JSON, format in docs/reports.md). Rules read the per-GPU totals that
//! [`super::series`] keeps, so they work the same on live and stored data.
//!
//! One folder per rule family beside this one, named as the findings name
//! it: [`xid`], [`ecc`] (ECC, retired pages, row remapping), [`pcie`],
//! [`nvlink`], [`clocks`] (slowdowns and unexplained low clocks),
//! [`temperature`] and [`idle`]; each has one `check(&HealthRules, &Run,
//! &mut Sink)` ([`idle`] reads the measured phase's totals instead).
//! [`HealthRules::evaluate_in`] runs them in the order a report lists their
//! findings; `rules.rs` reads the operator's file.

mod rules;

#[cfg(test)]
pub(super) mod fixtures;
#[cfg(test)]
mod tests;

use serde::Deserialize;

use super::{clocks, ecc, idle, nvlink, pcie, temperature, xid};
use super::{Check, Level, Phase};
use crate::judge::series::{Bucket, Counters};

pub use rules::HealthRules;

/// What a rule does when it fires, as an operator sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Fail,
    Warn,
    Off,
}

impl Severity {
    /// The level a rule set so fires at; `None` when it is off.
    pub fn level(self) -> Option<Level> {
        match self {
            Severity::Fail => Some(Level::Fail),
            Severity::Warn => Some(Level::Warn),
            Severity::Off => None,
        }
    }
}

/// One GPU's totals as every family reads them: the counters at both ends
/// taken out once, not once per family.
pub struct Run<'a> {
    pub(super) t: &'a Bucket,
    pub(super) first: Counters,
    pub(super) last: Counters,
    /// The minutes rates are taken over ([`rate_minutes`]).
    pub(super) minutes: f64,
}

impl Run<'_> {
    fn of(t: &Bucket) -> Run<'_> {
        Run {
            t,
            first: t.first.clone().unwrap_or_default(),
            last: t.last.clone().unwrap_or_default(),
            minutes: rate_minutes(t),
        }
    }

    /// How far a counter moved during the run; a counter reset is no move.
    pub(super) fn delta(&self, f: fn(&Counters) -> u64) -> u64 {
        f(&self.last).saturating_sub(f(&self.first))
    }
}

/// What fired, in order. A rule set to `off` is dropped here, so that no
/// family has to ask.
#[derive(Default)]
pub struct Sink(Vec<Check>);

impl Sink {
    pub(super) fn fire(&mut self, severity: Severity, rule: &str, detail: String) {
        self.fire_in(severity, rule, detail, Phase::Run);
    }

    pub(super) fn fire_in(&mut self, severity: Severity, rule: &str, detail: String, phase: Phase) {
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

impl HealthRules {
    /// The rules that fire on one GPU's totals over the run, `idle` judged
    /// over the same totals.
    pub fn evaluate(&self, t: &Bucket) -> Vec<Check> {
        self.evaluate_in(t, Some(t))
    }

    /// As [`Self::evaluate`], with `idle` judged only over `measured`: the
    /// samples taken while the GPU's rank ran its measured phase (`None`:
    /// not known, and `idle` is not judged).
    pub fn evaluate_in(&self, t: &Bucket, measured: Option<&Bucket>) -> Vec<Check> {
        let run = Run::of(t);
        let mut out = Sink::default();
        xid::check(self, &run, &mut out);
        ecc::check(self, &run, &mut out);
        pcie::check(self, &run, &mut out);
        nvlink::check(self, &run, &mut out);
        clocks::check(self, &run, &mut out);
        temperature::check(self, &run, &mut out);
        if let Some(m) = measured {
            idle::check(self, m, &mut out);
        }
        out.0
    }
}

/// The minutes a bucket's rates are taken over: at least one, so a short
/// run's one replay is not a storm.
pub fn rate_minutes(t: &Bucket) -> f64 {
    (t.end_ms.saturating_sub(t.start_ms) as f64 / 60_000.0).max(1.0)
}

//! GPU health rules: what in a job's telemetry fails or warns a GPU, and why.
//! The defaults follow what DCGM's health watches and the cloud providers'
//! node checks flag (critical XIDs, uncorrectable ECC, retired pages and row
//! remapping, degraded PCIe and NVLink, hardware slowdown, heat); an operator
//! overrides any of them with `gpuctl-coordinator --health-rules FILE` (TOML or
//! JSON, format in docs/reports.md). Rules read the per-GPU totals that
//! [`super::series`] keeps, so they work the same on live and stored data.
//!
//! One file per rule family, named as the findings name it: [`xid`],
//! [`memory`] (ECC, retired pages, row remapping), [`pcie`], [`nvlink`],
//! [`clocks`] (slowdowns and unexplained low clocks), [`temperature`] and
//! [`idle`]. [`HealthRules::evaluate_in`] runs them in the order a report
//! lists their findings.

mod clocks;
mod idle;
mod memory;
mod nvlink;
mod pcie;
mod rules;
mod temperature;
mod xid;

#[cfg(test)]
mod tests;

use serde::Deserialize;

use super::series::{Bucket, Counters};

pub use clocks::{HW_POWER_BRAKE, HW_SLOWDOWN, HW_THERMAL, SW_THERMAL};
pub use nvlink::{nvlink_crc, nvlink_crc_flit};
pub use rules::HealthRules;
pub use xid::CRITICAL_XIDS;

/// What a rule does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Fail,
    Warn,
    Off,
}

/// One rule that fired.
#[derive(Debug, Clone, PartialEq)]
pub struct Fired {
    pub level: Level,
    pub rule: &'static str,
    pub detail: String,
}

/// One GPU's totals as every family reads them: the counters at both ends
/// taken out once, not once per family.
struct Run<'a> {
    t: &'a Bucket,
    first: Counters,
    last: Counters,
    /// The minutes rates are taken over ([`rate_minutes`]).
    minutes: f64,
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
    fn delta(&self, f: fn(&Counters) -> u64) -> u64 {
        f(&self.last).saturating_sub(f(&self.first))
    }
}

/// What fired, in order. A rule set to `off` is dropped here, so that no
/// family has to ask.
#[derive(Default)]
struct Sink(Vec<Fired>);

impl Sink {
    fn fire(&mut self, level: Level, rule: &'static str, detail: String) {
        if level != Level::Off {
            self.0.push(Fired {
                level,
                rule,
                detail,
            });
        }
    }
}

impl HealthRules {
    /// The rules that fire on one GPU's totals over the run, `idle` judged
    /// over the same totals.
    pub fn evaluate(&self, t: &Bucket) -> Vec<Fired> {
        self.evaluate_in(t, Some(t))
    }

    /// As [`Self::evaluate`], with `idle` judged only over `measured`: the
    /// samples taken while the GPU's rank ran its measured phase (`None`:
    /// not known, and `idle` is not judged).
    pub fn evaluate_in(&self, t: &Bucket, measured: Option<&Bucket>) -> Vec<Fired> {
        let run = Run::of(t);
        let mut out = Sink::default();
        xid::check(self, &run, &mut out);
        memory::check(self, &run, &mut out);
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

//! The GPU telemetry checks run together: what in a job's telemetry fails or
//! warns a GPU, and why.
//! The defaults follow what DCGM's health watches and the cloud providers'
//! node checks flag (critical XIDs, uncorrectable ECC, retired pages and row
//! remapping, degraded PCIe and NVLink, hardware slowdown, heat); an operator
//! overrides any of them with `gpuctl-coordinator --health-rules FILE` (TOML or
//! JSON, format in docs/reports.md). Rules read the per-GPU totals that
//! [`crate::judge::series`] keeps, so they work the same on live and stored data.
//!
//! One folder per rule family beside this one, named as the findings name
//! it: [`xid`], [`ecc`] (ECC, retired pages, row remapping), [`pcie`],
//! [`nvlink`], [`clocks`] (slowdowns and unexplained low clocks),
//! [`temperature`] and [`idle`]; each has one `check(&HealthRules, &Run,
//! &mut Sink)` ([`idle`] reads the measured phase's totals instead).
//! [`HealthRules::evaluate_in`] runs them in the order a report lists their
//! findings; `rules.rs` reads the operator's file, `run.rs` is what every
//! family reads and writes.

pub mod rules;
pub mod run;

#[cfg(test)]
pub(super) mod fixtures;
#[cfg(test)]
mod tests;

use super::Check;
use super::{clocks, ecc, idle, nvlink, pcie, temperature, xid};
use crate::judge::series::Bucket;

pub use rules::HealthRules;
pub use run::{gpu_check, name_gpu, rate_minutes, Run, Sink};

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

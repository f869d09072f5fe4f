//! Acceptance suites: a level (`quick`, `standard`, `burn-in`) or a user's file
//! is a list of stages, each a catalogue workload with its parameters (or the
//! nodes' preflight checks), run one after another on the same nodes. This
//! module holds what a checked suite is and the shipped levels; reading and
//! checking a file (TOML, docs/acceptance.md) lives in [`file`], and the
//! planner's side, how long a suite takes and the job specs its stages
//! submit, in [`plan`], so that the rules a user's file meets and the
//! arithmetic of time can each be read apart. It runs nothing itself.

mod file;
mod plan;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use crate::catalogue::{err, NcclPattern, SpecError};
pub use crate::limits::MAX_SUITE_BYTES;

/// The shipped levels, in order of length.
pub const LEVELS: &[&str] = &["quick", "standard", "burn-in"];

const BUILTIN: &[(&str, &str)] = &[
    ("quick", include_str!("../../suites/quick.toml")),
    ("standard", include_str!("../../suites/standard.toml")),
    ("burn-in", include_str!("../../suites/burn-in.toml")),
];

/// The stage "workload" that runs no job: it judges each node's latest
/// preflight checks.
pub const PREFLIGHT: &str = "preflight";
/// Stages in one suite: each is a job, and a suite is read by people.
pub const MAX_STAGES: usize = 32;
/// A suite's or a stage's name.
pub const MAX_NAME: usize = 64;
/// The shortest timed stage: below a second a stress run measures nothing
/// (and 0 would mean the catalogue's default).
pub const MIN_TIMED_MS: u64 = 1_000;

/// What every job stage is expected to spend besides its work: workers
/// starting, CUDA contexts and NCCL communicators, the report.
pub const JOB_START_MS: u64 = 10_000;
/// A preflight stage without `estimate`: it reads checks the agents have.
pub const PREFLIGHT_MS: u64 = 5_000;
/// An untimed job stage without `estimate`.
pub const UNTIMED_MS: u64 = 60_000;

/// A checked suite.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suite {
    pub name: String,
    pub about: String,
    /// The nominal time; for a suite with a `rest` stage, the default total
    /// that `--duration` overrides. Without `duration` in the file: the
    /// estimate ([`Suite::estimate_ms`]).
    pub duration_ms: u64,
    pub stages: Vec<Stage>,
}

/// One stage: a workload run on the nodes still in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    /// Unique within the suite.
    pub name: String,
    /// A catalogue workload, or [`PREFLIGHT`].
    pub workload: String,
    /// A timed workload's run time (None for `rest` and untimed stages).
    pub duration_ms: Option<u64>,
    /// Runs for what is left of the suite's total (one stage at most).
    pub rest: bool,
    /// How long an untimed stage takes, for progress (`estimate` in the file).
    pub estimate_ms: Option<u64>,
    /// Parameters as `gpuctl submit` takes them, for every device.
    pub params: BTreeMap<String, String>,
    /// Laid over `params` when the suite runs on GPU nodes: sizes a CPU rank
    /// cannot run (a CPU keeps the catalogue's per-device default).
    pub gpu_params: BTreeMap<String, String>,
}

impl Stage {
    pub fn is_preflight(&self) -> bool {
        self.workload == PREFLIGHT
    }

    /// The fewest nodes the stage can run on (`pattern = "pairs"` and
    /// `"search"`: 2, `"bisect"`: 3, else 1): with fewer still in, the
    /// coordinator skips it.
    pub fn min_nodes(&self, gpu: bool) -> u32 {
        let pattern = gpu
            .then(|| self.gpu_params.get("pattern"))
            .flatten()
            .or(self.params.get("pattern"));
        pattern
            .and_then(|p| NcclPattern::parse(p))
            .map_or(1, |p| p.in_suite(2).min_nodes().0)
    }
}

impl Suite {
    /// A shipped level: `quick`, `standard` or `burn-in`.
    pub fn builtin(level: &str) -> Result<Suite, SpecError> {
        let text = Self::builtin_text(level).ok_or_else(|| {
            err(
                "--level",
                format!(
                    "unknown level `{level}`; choose {} (or give your own with --suite FILE)",
                    LEVELS.join(", ")
                ),
            )
        })?;
        Suite::parse(text)
    }

    /// A shipped level's file, to show or to start one's own from.
    pub fn builtin_text(level: &str) -> Option<&'static str> {
        BUILTIN.iter().find(|(l, _)| *l == level).map(|(_, t)| *t)
    }
}

//! Every check a report makes, one folder per kind, and the one shape they
//! all answer in. A check looked at something (a GPU's telemetry, a figure,
//! a link, a host before the job) and says pass, warn, fail or unknown, with
//! its evidence: that is a [`Check`], whatever did the looking. The report
//! only places checks on ranks and nodes and turns them into the wire's
//! `Finding` once (`report::findings`).
//!
//! | folder | reads | rules |
//! |---|---|---|
//! | [`xid`] | the driver's XID events | `xid` |
//! | [`ecc`] | ECC counters, retired pages, row remapping | `ecc_uncorrected`, `ecc_corrected`, `retired_pages`, `row_remap` |
//! | [`pcie`] | link generation and width under load, replays | `pcie_link`, `pcie_replay` |
//! | [`nvlink`] | links down, CRC, replays, recoveries; the job's bandwidth to confirm a link down | `nvlink`, `nvlink_crc`, `nvlink_replay`, `nvlink_recovery` |
//! | [`clocks`] | slowdown reasons and counters, SM clock against its maximum | `throttle`, `clock_low` |
//! | [`temperature`] | the hottest sample | `temperature` |
//! | [`idle`] | utilisation in the rank's measured phase | `idle` |
//! | [`perf`] | each figure against the fleet, a baseline, the floors | one per metric (`stress_tflops`, `busbw`, `samples_per_s`, `loader_*`, ...) |
//! | [`links`] | node pairs' bandwidth | `link_busbw` |
//! | [`p2p`] | GPU pairs inside a node, each direction against its reverse | `p2p_pair`, `p2p_direction`, `p2p_pairs` |
//! | [`bisect`], [`search`] | the node and link searches the workers ran | `bisect`, `search` |
//! | [`preflight`] | a host before the job: the plan's checks and the agent's at start | the check's own name (`shm`, `driver`, ...) |
//!
//! The GPU telemetry checks (the first seven) share one signature,
//! `fn check(&HealthRules, &Run, &mut Sink)` (`health/run.rs`), run in the
//! order [`health`] lists; their settings (one operator file,
//! `--health-rules`) are read in `health/rules.rs`, each default in the
//! `defaults.rs` of its rule's folder.

pub mod bisect;
pub mod clocks;
pub mod ecc;
pub mod health;
pub mod idle;
pub mod links;
pub mod nvlink;
pub mod p2p;
pub mod pcie;
pub mod perf;
pub mod preflight;
pub mod search;
pub mod temperature;
pub mod xid;

use gpuctl_proto::pb::Verdict;
use serde::Deserialize;

/// What a check says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Level {
    Pass,
    Warn,
    Fail,
    /// What it needed could not be read: never a failure.
    #[default]
    Unknown,
}

impl Level {
    /// The wire's verdict of the same name; unknown is unspecified.
    pub fn verdict(self) -> Verdict {
        match self {
            Level::Pass => Verdict::Pass,
            Level::Warn => Verdict::Warn,
            Level::Fail => Verdict::Fail,
            Level::Unknown => Verdict::Unspecified,
        }
    }

    /// A verdict read off the wire (an agent's preflight check).
    pub fn of(v: Verdict) -> Level {
        match v {
            Verdict::Pass => Level::Pass,
            Verdict::Warn => Level::Warn,
            Verdict::Fail => Level::Fail,
            Verdict::Unspecified | Verdict::Incomplete => Level::Unknown,
        }
    }
}

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

/// The stretch of a job a check judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Phase {
    /// The plan, from the facts the agents registered with.
    Plan,
    /// The agent's checks when the assignment arrived.
    Start,
    /// The whole run (telemetry from the first sample to the last).
    #[default]
    Run,
    /// The workload's measured phase alone (its figures, its utilisation).
    Measured,
    /// A rank's result as it reported it.
    Result,
}

impl Phase {
    /// As the wire's `Finding.phase` says it.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Plan => "plan",
            Phase::Start => "start",
            Phase::Run => "run",
            Phase::Measured => "measured",
            Phase::Result => "result",
        }
    }
}

/// One check's answer: what it is about (node, rank, GPU; all empty for
/// the job's nodes together), what it looked at, the level, the value
/// against its reference, the evidence in a sentence, the phase judged.
/// Field for field the wire's `Finding`, which `report::findings` makes
/// of it, plus what only some checks know (`fix`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Check {
    pub level: Level,
    pub node: String,
    pub rank: Option<u32>,
    pub gpu_index: Option<u32>,
    pub gpu_uuid: String,
    /// The family looked at: a figure's metric (`stress_tflops`, `busbw`,
    /// ...), or `health`, `preflight`, `result`.
    pub metric: String,
    /// Which of it: a figure's key (`bf16 8192`), a health rule's name.
    pub key: String,
    pub value: f64,
    /// The reference expected a figure the job did not produce.
    pub missing: bool,
    pub reference: f64,
    /// `fleet`, `baseline`, `floor`, `reverse`; empty without a reference.
    pub reference_kind: String,
    /// The rule's name (`xid`) or the rule as a sentence (perf's).
    pub rule: String,
    pub unit: String,
    /// The sentence a person reads: what was seen, the evidence.
    pub detail: String,
    /// What to do about it, where the check knows (preflight's).
    pub fix: String,
    pub phase: Phase,
}

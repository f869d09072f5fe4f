//! Performance verdicts (docs/reports.md, "Performance verdicts"). Every figure
//! a job produced is compared with up to three references: the rest of the
//! fleet in the same job (the median of the rank's device class), a saved
//! baseline, and floors per GPU model shipped with gpuctl. A comparison that
//! misses becomes a [`Check`] naming node, GPU, metric, value, reference and
//! rule. A figure that a reference expects and the job did not produce fails:
//! nothing passes by absence.
//!
//! Figures come in two kinds. Per-rank figures (GEMM TFLOP/s, a training
//! rank's rate without communication, the largest batch) belong to one GPU and
//! can blame it. Job figures (collective bus bandwidth, synchronous training
//! rates, step times, scaling efficiency) are made by all ranks together: a
//! slow rank slows every rank, so they are judged once for the job and never
//! pinned on a node unless the job ran on one node only.
//!
//! One file per reference ([`fleet`], [`baseline`], [`floors`]), the
//! comparison the last two share ([`reference`]) and the findings every one
//! of them writes ([`finding`]); here, the judgement they fill and the order
//! they run in.

mod baseline;
mod finding;
mod fleet;
mod floors;
pub mod job;
mod reference;
pub mod rules;
pub mod votes;

#[cfg(test)]
mod tests;

use std::collections::BTreeSet;

use gpuctl_proto::pb::Baseline;

use super::Check;

pub use crate::judge::figures::{Expected, Figure, JobFigures, RankFigures};
pub use crate::judge::metric::Metric;
pub use finding::fmt_value;
pub use rules::PerfRules;

/// Findings and the sentences that say which references applied.
#[derive(Debug, Default)]
pub struct Judgement {
    pub findings: Vec<Check>,
    pub notes: Vec<String>,
    /// The figures some reference judged, by (metric, key).
    judged: BTreeSet<(Metric, String)>,
}

/// Judges a job's figures against the fleet, a baseline and the floors.
pub fn judge(
    ranks: &[RankFigures],
    job: &JobFigures,
    expected: &Expected,
    rules: &PerfRules,
    baseline: Option<&Baseline>,
) -> Judgement {
    let mut out = Judgement::default();
    fleet::fleet(ranks, rules, &mut out);
    if let Some(b) = baseline {
        baseline::against_baseline(ranks, job, expected, rules, b, &mut out);
    }
    floors::floors(ranks, job, expected, rules, &mut out);
    if let Some(note) = unjudged(ranks, job, &out.judged, rules) {
        // First: what a reader must not take for a pass.
        out.notes.insert(0, note);
    }
    out
}

/// The figures no reference judged (no fleet of enough ranks, no baseline,
/// no floor for the GPU model): said in the report's first lines, since a
/// figure judged against nothing passes by default. A p2p median is left
/// out: its pairs are judged against each other (`judge::checks::p2p`).
fn unjudged(
    ranks: &[RankFigures],
    job: &JobFigures,
    judged: &BTreeSet<(Metric, String)>,
    rules: &PerfRules,
) -> Option<String> {
    // Borrowed: a key copied per rank's figure was 262,144 allocations at
    // 131,072 ranks.
    let judged: BTreeSet<(Metric, &str)> = judged.iter().map(|(m, k)| (*m, k.as_str())).collect();
    let mut left: BTreeSet<(Metric, &str)> = BTreeSet::new();
    let figures = ranks
        .iter()
        .filter(|r| r.reported)
        .flat_map(|r| &r.figures)
        .chain(&job.figures);
    for f in figures.filter(|f| f.metric != Metric::P2pGbps) {
        if !judged.contains(&(f.metric, &*f.key)) {
            left.insert((f.metric, &f.key));
        }
    }
    if left.is_empty() {
        return None;
    }
    let names: Vec<String> = left
        .iter()
        .map(|(m, k)| {
            if k.is_empty() {
                m.name().to_string()
            } else {
                format!("{} `{k}`", m.name())
            }
        })
        .collect();
    Some(format!(
        "judged against nothing (fewer than {} ranks of a device class for a fleet reference, no baseline, no floor for this GPU model): {}; save a baseline of a healthy run (`gpuctl baseline save`) or give floors (--rules) to judge them",
        rules.fleet_min_ranks.max(2),
        names.join(", ")
    ))
}

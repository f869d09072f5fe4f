//! Performance onto ranks, nodes and the job: the job's figures judged
//! against the fleet, a baseline and the floors ([`crate::judge::perf`]). A
//! per-rank figure that misses fails (or warns) its rank; a job figure is
//! pinned on the node only when the job ran on one node, else it stays the
//! job's.

use std::borrow::Cow;

use gpuctl_proto::pb::{CollectiveRow, Finding, JobSpec, JobState, Plan, RankResult, Verdict};

use super::ranks::{RankStates, Source};
use super::Inputs;
use crate::judge::figures::{
    device_class, expected, intervals, job_figures, rank_figures, Figures,
};
use crate::judge::perf::{self, fmt_value, Expected, Metric, RankFigures};
use crate::judge::rules::PerfRules;

/// What performance found, and which references applied.
pub(super) struct Outcome {
    pub findings: Vec<Finding>,
    pub notes: Vec<String>,
    /// The figures judged, for the fleet history's runs.
    pub figures: Figures,
}

/// The rules of this job: the coordinator's, with the job's `--rules` over them.
pub(super) fn rules<'a>(
    base: &'a PerfRules,
    spec: &JobSpec,
    notes: &mut Vec<String>,
) -> Cow<'a, PerfRules> {
    if spec.rules.trim().is_empty() {
        return Cow::Borrowed(base);
    }
    match base.overlay(&spec.rules) {
        Ok(r) => {
            notes.push(
                "performance rules: the coordinator's, with the job's --rules over them".into(),
            );
            Cow::Owned(r)
        }
        Err(e) => {
            // Refused at submit; a stored job from an older coordinator may still carry it.
            notes.push(format!(
                "the job's --rules were not usable ({e:#}); the coordinator's rules applied"
            ));
            Cow::Borrowed(base)
        }
    }
}

/// "stress_tflops bf16 8192 = 3.1 TFLOP/s, fleet 6.8 (0.46×)": a finding as
/// a rank's reason, the rank being named already.
fn reason(f: &Finding) -> String {
    let what = format!("{} {}", f.metric, f.key);
    let Some(metric) = Metric::from_name(&f.metric) else {
        return f.detail.clone();
    };
    let reference = fmt_value(metric, f.reference);
    if f.missing {
        format!("no {what} ({} reference {reference})", f.reference_kind)
    } else {
        format!(
            "{what} = {} against {} reference {reference}",
            fmt_value(metric, f.value),
            f.reference_kind
        )
    }
}

pub(super) fn judge(
    inp: &Inputs,
    spec: &JobSpec,
    plan: &Plan,
    collectives: &[CollectiveRow],
    rules: &PerfRules,
    states: &mut RankStates,
) -> Outcome {
    let mut notes = Vec::new();
    let ranks: Vec<RankFigures> = plan
        .ranks
        .iter()
        .map(|p| {
            let r = inp.results.get(&p.rank);
            RankFigures {
                rank: p.rank,
                node: p.node.clone(),
                gpu_index: p.gpu_index,
                gpu_uuid: p.gpu_uuid.clone(),
                model: r.map_or_else(|| p.device_name.clone(), |r| r.device_name.clone()),
                class: r.map(device_class).unwrap_or_default(),
                reported: r.is_some_and(|r| r.ok),
                figures: r
                    .map(|r| rank_figures(&spec.workload, r))
                    .unwrap_or_default(),
                intervals: r.map(intervals).unwrap_or(0),
            }
        })
        .collect();
    let results: Vec<&RankResult> = inp.results.values().collect();
    let job = job_figures(&spec.workload, &results, collectives, &plan.nodes);
    // Only a job that ran to its end was bound to produce every figure.
    let wanted = if inp.job.state() == JobState::Succeeded {
        let gpu = plan.ranks.iter().any(|p| p.gpu_index.is_some());
        expected(spec, gpu, plan.world_size)
    } else {
        Expected::new()
    };
    let j = perf::judge(&ranks, &job, &wanted, rules, inp.job.baseline.as_ref());
    for f in &j.findings {
        let Some(st) = f.rank.and_then(|r| states.get_mut(&r)) else {
            continue;
        };
        match f.level() {
            Verdict::Fail => st.fail_from(Source::Performance, reason(f)),
            _ => st.warn_from(Source::Performance, reason(f)),
        }
    }
    notes.extend(j.notes);
    Outcome {
        findings: j.findings,
        notes,
        figures: Figures { ranks, job },
    }
}

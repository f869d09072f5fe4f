//! A job's figures gathered from its ranks' results and judged: the rules
//! that apply to it (the coordinator's, with the job's `--rules` over
//! them), the figures each rank and the job produced, and what the spec
//! asked for.

use std::borrow::Cow;
use std::collections::BTreeMap;

use gpuctl_proto::pb::{CollectiveRow, Job, JobSpec, JobState, Plan, RankResult};

use super::{judge as judge_figures, Expected, PerfRules, RankFigures};
use crate::judge::checks::Check;
use crate::judge::figures::{expected, intervals, job_figures, rank_figures, Figures, Names};

/// What performance found, and which references applied.
pub struct Outcome {
    pub findings: Vec<Check>,
    pub notes: Vec<String>,
    /// The figures judged, for the fleet history's runs.
    pub figures: Figures,
}

/// The rules of this job: the coordinator's, with the job's `--rules` over them.
pub fn rules<'a>(
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

pub fn judge(
    job: &Job,
    results: &BTreeMap<u32, RankResult>,
    spec: &JobSpec,
    plan: &Plan,
    collectives: &[CollectiveRow],
    rules: &PerfRules,
) -> Outcome {
    let mut notes = Vec::new();
    let mut names = Names::default();
    let ranks: Vec<RankFigures> = plan
        .ranks
        .iter()
        .map(|p| {
            let r = results.get(&p.rank);
            RankFigures {
                rank: p.rank,
                node: names.name(&p.node),
                gpu_index: p.gpu_index,
                gpu_uuid: p.gpu_uuid.clone(),
                model: names.name(r.map_or(&p.device_name, |r| &r.device_name)),
                class: match r {
                    Some(r) => names.class(r),
                    None => names.name(""),
                },
                reported: r.is_some_and(|r| r.ok),
                figures: r
                    .map(|r| names.figures(rank_figures(&spec.workload, r)))
                    .unwrap_or_default(),
                intervals: r.map(intervals).unwrap_or(0),
            }
        })
        .collect();
    let results: Vec<&RankResult> = results.values().collect();
    let job_figs = job_figures(&spec.workload, &results, collectives, &plan.nodes);
    // Only a job that ran to its end was bound to produce every figure.
    let wanted = if job.state() == JobState::Succeeded {
        let gpu = plan.ranks.iter().any(|p| p.gpu_index.is_some());
        expected(spec, gpu, plan.world_size)
    } else {
        Expected::new()
    };
    let j = judge_figures(&ranks, &job_figs, &wanted, rules, job.baseline.as_ref());
    notes.extend(j.notes);
    Outcome {
        findings: j.findings,
        notes,
        figures: Figures {
            ranks,
            job: job_figs,
        },
    }
}

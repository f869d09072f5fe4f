//! Reference 2: a saved baseline, applied only to the device classes it was
//! saved on; what it holds for other classes is said, not judged.

use std::collections::BTreeSet;

use gpuctl_proto::pb::Baseline;

use super::finding::ratio_rule;
use super::reference::{compare, Reference, Scope};
use super::{Expected, JobFigures, Judgement, Metric, RankFigures};
use crate::judge::checks::perf::rules::PerfRules;

/// Reference 2: a saved baseline, per device class.
pub(super) fn against_baseline(
    ranks: &[RankFigures],
    job: &JobFigures,
    expected: &Expected,
    rules: &PerfRules,
    b: &Baseline,
    out: &mut Judgement,
) {
    let job_classes: BTreeSet<&str> = ranks
        .iter()
        .filter(|r| r.reported)
        .map(|r| &*r.class)
        .collect();
    let saved: BTreeSet<&str> = b.figures.iter().map(|f| f.device_class.as_str()).collect();
    let applied: Vec<&str> = saved.intersection(&job_classes).copied().collect();
    for class in saved.difference(&job_classes) {
        out.notes.push(format!(
            "baseline `{}` holds figures for `{class}`, which no rank of this job ran on: not applied to them",
            b.name
        ));
    }
    if applied.is_empty() {
        out.notes.push(format!(
            "baseline `{}` (from {}) does not apply: it was saved on another device class",
            b.name, b.job_id
        ));
        return;
    }
    out.notes.push(format!(
        "baseline `{}` (from {}) applied to {}",
        b.name,
        b.job_id,
        applied
            .iter()
            .map(|c| format!("`{c}`"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    for bf in b
        .figures
        .iter()
        .filter(|f| applied.contains(&f.device_class.as_str()))
    {
        let Some(metric) = Metric::from_name(&bf.metric) else {
            out.notes.push(format!(
                "baseline `{}`: unknown metric `{}` skipped",
                b.name, bf.metric
            ));
            continue;
        };
        let rule = rules.metric(metric);
        let (fail, warn) = (rule.baseline_fail(), rule.baseline_warn());
        let text = ratio_rule(
            "baseline",
            metric,
            fail,
            warn,
            &format!("baseline `{}`", b.name),
        );
        compare(
            ranks,
            job,
            expected,
            &Reference {
                metric,
                key: &bf.key,
                class_or_model: Scope::Class(&bf.device_class),
                value: bf.value,
                kind: "baseline",
                fail,
                warn: Some(warn),
                ratio: true,
                rule: text,
            },
            out,
        );
    }
}

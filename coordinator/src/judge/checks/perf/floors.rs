//! Reference 3: the floors per GPU model, built in or from `--rules`: figures
//! a model must reach whatever the fleet or a baseline says.

use std::collections::{BTreeMap, BTreeSet};

use super::finding::fmt_value;
use super::reference::{compare, Reference, Scope};
use super::{Expected, JobFigures, Judgement, Metric, RankFigures};
use crate::judge::checks::perf::rules::{Floor, PerfRules};

/// Reference 3: the floors per GPU model (built in, or from `--rules`).
pub(super) fn floors(
    ranks: &[RankFigures],
    job: &JobFigures,
    expected: &Expected,
    rules: &PerfRules,
    out: &mut Judgement,
) {
    let models: BTreeSet<&str> = ranks
        .iter()
        .filter(|r| r.reported)
        .map(|r| &*r.model)
        .collect();
    let mut used: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut lone = false;
    for floor in &rules.floors {
        let Some(metric) = Metric::from_name(&floor.metric) else {
            continue; // refused when the rules were loaded
        };
        let single_node = job.single_node.is_some();
        let Some(model) = models.iter().find(|m| floor.fits(m, single_node)).copied() else {
            continue;
        };
        if Floor::lone_link(metric, ranks.len()) {
            lone |= expected.iter().any(|(m, _)| *m == Metric::Busbw);
            continue;
        }
        used.entry(model)
            .or_default()
            .push(format!("{} {}", metric.name(), floor.key));
        let mut rule = format!(
            "floor for {} {} {}: fail {} {}",
            floor.gpu,
            metric.name(),
            floor.key,
            if metric.higher_is_better() {
                "below"
            } else {
                "above"
            },
            fmt_value(metric, floor.fail)
        );
        if let Some(w) = floor.warn {
            rule.push_str(&format!(", warn {}", fmt_value(metric, w)));
        }
        if !floor.source.is_empty() {
            rule.push_str(&format!(" (source: {})", floor.source));
        }
        compare(
            ranks,
            job,
            expected,
            &Reference {
                metric,
                key: &floor.key,
                class_or_model: Scope::Model(model),
                value: floor.fail,
                kind: "floor",
                fail: floor.fail,
                warn: floor.warn,
                ratio: false,
                rule,
            },
            out,
        );
    }
    if lone {
        out.notes.push(
            "bus bandwidth floors not used: one rank moves nothing over a link (busbw is 0 by nccl-tests' formula); run on 2 GPUs or more to judge links".into(),
        );
    }
    for (m, checked) in &used {
        out.notes.push(format!(
            "floors for `{m}` applied where the job ran what they measure: {}",
            checked.join(", ")
        ));
    }
    for m in models.iter().filter(|m| !used.contains_key(*m)) {
        out.notes.push(format!(
            "no floors for `{m}` in the rules: judged by the fleet and baseline references only"
        ));
    }
}

//! Reference 1: each rank against the other ranks of its device class in the
//! same job, one vote per node, so a node of many ranks cannot outvote the
//! rest (the votes are [`crate::judge::checks::perf::votes`]).

use std::collections::{BTreeMap, BTreeSet};

use super::finding::{finding, level_of, ratio_rule, score, Miss, Subject};
use super::{Judgement, Metric, RankFigures};
use crate::judge::checks::perf::rules::{MetricRule, PerfRules};
use crate::judge::checks::perf::votes::{name_nodes, Basis, Votes};

/// Per-rank figures by (device class, metric, key), each with its rank.
type FleetGroups<'a> = BTreeMap<(&'a str, Metric, &'a str), Vec<(&'a RankFigures, f64)>>;

/// Reference 1: each per-rank figure against the median of its device class.
pub(super) fn fleet(ranks: &[RankFigures], rules: &PerfRules, out: &mut Judgement) {
    let mut groups: FleetGroups = BTreeMap::new();
    let mut classes: BTreeMap<&str, usize> = BTreeMap::new();
    let mut short = None;
    for r in ranks.iter().filter(|r| r.reported) {
        *classes.entry(&*r.class).or_default() += 1;
        // A few seconds of GEMMs tell a slow GPU from noise only on quiet
        // hardware; ranks are compared from `min_intervals` samples on.
        if r.intervals > 0 && r.intervals < rules.fleet_min_intervals {
            short = Some(short.map_or(r.intervals, |s: u32| s.min(r.intervals)));
            continue;
        }
        for f in &r.figures {
            if f.metric.per_rank() && rules.metric(f.metric).fleet {
                groups
                    .entry((&*r.class, f.metric, &*f.key))
                    .or_default()
                    .push((r, f.value));
            }
        }
    }
    if let Some(n) = short {
        out.notes.push(format!(
            "fleet reference not used for stress ranks with fewer than {} sampling intervals (the shortest had {n}): too few to tell a slow GPU from noise; run longer",
            rules.fleet_min_intervals
        ));
    }
    let min = rules.fleet_min_ranks.max(2);
    // One note per class: how its references were made.
    let mut said: BTreeSet<&str> = BTreeSet::new();
    for ((class, metric, key), members) in groups {
        let votes = Votes::new(members.iter().map(|(r, v)| (&*r.node, *v)));
        if said.insert(class) {
            out.notes.push(votes.note(class, classes[&class], min));
        }
        let rule: &MetricRule = rules.metric(metric);
        // Marked once a group, not once a rank (131,072 keys made and
        // looked up at a big job's end).
        let mut judged = false;
        for (r, value) in members {
            let Some(reference) = votes.reference(&r.node, min) else {
                continue;
            };
            if reference.value <= 0.0 {
                continue;
            }
            judged = true;
            let s = score(metric, value, reference.value);
            let (fail, warn) = rule.fleet_ratios(r.gpu_index.is_none());
            if let Some(level) = level_of(s, fail, warn) {
                let subject = Subject::of(r);
                let of = match &reference.basis {
                    Basis::Nodes => format!(
                        "the median of {} nodes' medians of `{class}` ({})",
                        votes.nodes(),
                        name_nodes(&votes.node_names())
                    ),
                    Basis::OwnNode(n) => {
                        format!("the median of node {}'s {n} ranks of `{class}`", r.node)
                    }
                };
                out.findings.push(finding(Miss {
                    subject: &subject,
                    metric,
                    key,
                    value: Some(value),
                    reference: reference.value,
                    kind: "fleet",
                    level,
                    rule: ratio_rule("fleet", metric, fail, warn, &of),
                }));
            }
        }
        if judged {
            out.judged.insert((metric, key.to_string()));
        }
    }
}

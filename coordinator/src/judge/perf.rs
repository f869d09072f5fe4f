//! Performance verdicts (docs/reports.md, "Performance verdicts"). Every figure
//! a job produced is compared with up to three references: the rest of the
//! fleet in the same job (the median of the rank's device class), a saved
//! baseline, and floors per GPU model shipped with gpuctl. A comparison that
//! misses becomes a [`Finding`] naming node, GPU, metric, value, reference and
//! rule. A figure that a reference expects and the job did not produce fails:
//! nothing passes by absence.
//!
//! Figures come in two kinds. Per-rank figures (GEMM TFLOP/s, a training
//! rank's rate without communication, the largest batch) belong to one GPU and
//! can blame it. Job figures (collective bus bandwidth, synchronous training
//! rates, step times, scaling efficiency) are made by all ranks together: a
//! slow rank slows every rank, so they are judged once for the job and never
//! pinned on a node unless the job ran on one node only.

use std::collections::{BTreeMap, BTreeSet};

use gpuctl_core::pb::{Baseline, Finding, Verdict};

pub use super::figures::{Expected, Figure, JobFigures, RankFigures};
pub use super::metric::Metric;
use super::rules::{MetricRule, PerfRules};
use super::votes::{name_nodes, Basis, Votes};

/// Findings and the sentences that say which references applied.
#[derive(Debug, Default)]
pub struct Judgement {
    pub findings: Vec<Finding>,
    pub notes: Vec<String>,
    /// The figures some reference judged, by (metric, key).
    judged: BTreeSet<(Metric, String)>,
}

/// How good `value` is against `reference`, 1.0 = equal, lower = worse.
fn score(metric: Metric, value: f64, reference: f64) -> f64 {
    if metric.higher_is_better() {
        value / reference
    } else if value > 0.0 {
        reference / value
    } else {
        1.0
    }
}

/// A figure with as many digits as its size needs, and its unit.
pub fn fmt_value(metric: Metric, v: f64) -> String {
    let unit = metric.unit();
    let num = if v.abs() >= 100.0 || metric == Metric::MaxBatch {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    };
    if unit.is_empty() {
        num
    } else {
        format!("{num} {unit}")
    }
}

/// Who a finding is about.
#[derive(Debug, Clone, Default)]
struct Subject {
    node: String,
    rank: Option<u32>,
    gpu_index: Option<u32>,
    gpu_uuid: String,
}

impl Subject {
    fn of(r: &RankFigures) -> Subject {
        Subject {
            node: r.node.clone(),
            rank: Some(r.rank),
            gpu_index: r.gpu_index,
            gpu_uuid: r.gpu_uuid.clone(),
        }
    }

    fn job(job: &JobFigures) -> Subject {
        Subject {
            node: job.single_node.clone().unwrap_or_default(),
            ..Default::default()
        }
    }

    fn label(&self) -> String {
        let who = match (self.rank, self.node.is_empty()) {
            (Some(rank), _) => format!("rank {rank} on node {}", self.node),
            (None, false) => format!("node {}", self.node),
            (None, true) => "the job's nodes together".to_string(),
        };
        match self.gpu_index {
            Some(i) => format!("{who} (GPU {i})"),
            None => who,
        }
    }
}

/// A comparison that missed, or a figure that is missing.
struct Miss<'a> {
    subject: &'a Subject,
    metric: Metric,
    key: &'a str,
    value: Option<f64>,
    reference: f64,
    kind: &'static str,
    level: Verdict,
    rule: String,
}

fn finding(m: Miss) -> Finding {
    let what = format!("{} {}", m.metric.name(), m.key);
    let detail = match m.value {
        Some(v) => format!(
            "{}: {what} = {} against {} reference {} ({:.2}×); {}",
            m.subject.label(),
            fmt_value(m.metric, v),
            m.kind,
            fmt_value(m.metric, m.reference),
            score(m.metric, v, m.reference),
            m.rule
        ),
        None => format!(
            "{}: no {what} although the {} reference expects it ({}); {}",
            m.subject.label(),
            m.kind,
            fmt_value(m.metric, m.reference),
            m.rule
        ),
    };
    Finding {
        node: m.subject.node.clone(),
        rank: m.subject.rank,
        gpu_index: m.subject.gpu_index,
        gpu_uuid: m.subject.gpu_uuid.clone(),
        metric: m.metric.name().to_string(),
        key: m.key.to_string(),
        value: m.value.unwrap_or(0.0),
        missing: m.value.is_none(),
        reference: m.reference,
        reference_kind: m.kind.to_string(),
        rule: m.rule,
        level: m.level as i32,
        unit: m.metric.unit().to_string(),
        detail,
    }
}

/// The level a score earns under `fail`/`warn` ratios, if any.
fn level_of(score: f64, fail: f64, warn: f64) -> Option<Verdict> {
    if score < fail {
        Some(Verdict::Fail)
    } else if score < warn {
        Some(Verdict::Warn)
    } else {
        None
    }
}

fn ratio_rule(kind: &str, metric: Metric, fail: f64, warn: f64, what: &str) -> String {
    let (below, scale) = if metric.higher_is_better() {
        ("below", "×")
    } else {
        ("above", "÷")
    };
    format!(
        "{kind} rule {}: fail {below} {fail:.2}{scale} {what}, warn {below} {warn:.2}{scale}",
        metric.name()
    )
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
    fleet(ranks, rules, &mut out);
    if let Some(b) = baseline {
        against_baseline(ranks, job, expected, rules, b, &mut out);
    }
    floors(ranks, job, expected, rules, &mut out);
    if let Some(note) = unjudged(ranks, job, &out.judged, rules) {
        // First: what a reader must not take for a pass.
        out.notes.insert(0, note);
    }
    out
}

/// The figures no reference judged (no fleet of enough ranks, no baseline,
/// no floor for the GPU model): said in the report's first lines, since a
/// figure judged against nothing passes by default. A p2p median is left
/// out: its pairs are judged against each other (`judge::p2p`).
fn unjudged(
    ranks: &[RankFigures],
    job: &JobFigures,
    judged: &BTreeSet<(Metric, String)>,
    rules: &PerfRules,
) -> Option<String> {
    let mut left: BTreeSet<(Metric, &str)> = BTreeSet::new();
    let figures = ranks
        .iter()
        .filter(|r| r.reported)
        .flat_map(|r| &r.figures)
        .chain(&job.figures);
    for f in figures.filter(|f| f.metric != Metric::P2pGbps) {
        if !judged.contains(&(f.metric, f.key.clone())) {
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

/// Per-rank figures by (device class, metric, key), each with its rank.
type FleetGroups<'a> = BTreeMap<(&'a str, Metric, &'a str), Vec<(&'a RankFigures, f64)>>;

/// Reference 1: each per-rank figure against the median of its device class.
fn fleet(ranks: &[RankFigures], rules: &PerfRules, out: &mut Judgement) {
    let mut groups: FleetGroups = BTreeMap::new();
    let mut classes: BTreeMap<&str, usize> = BTreeMap::new();
    let mut short = None;
    for r in ranks.iter().filter(|r| r.reported) {
        *classes.entry(r.class.as_str()).or_default() += 1;
        // A few seconds of GEMMs tell a slow GPU from noise only on quiet
        // hardware; ranks are compared from `min_intervals` samples on.
        if r.intervals > 0 && r.intervals < rules.fleet_min_intervals {
            short = Some(short.map_or(r.intervals, |s: u32| s.min(r.intervals)));
            continue;
        }
        for f in &r.figures {
            if f.metric.per_rank() && rules.metric(f.metric).fleet {
                groups
                    .entry((r.class.as_str(), f.metric, f.key.as_str()))
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
        let votes = Votes::new(members.iter().map(|(r, v)| (r.node.as_str(), *v)));
        if said.insert(class) {
            out.notes.push(votes.note(class, classes[&class], min));
        }
        let rule: &MetricRule = rules.metric(metric);
        for (r, value) in members {
            let Some(reference) = votes.reference(&r.node, min) else {
                continue;
            };
            if reference.value <= 0.0 {
                continue;
            }
            out.judged.insert((metric, key.to_string()));
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
    }
}

/// Reference 2: a saved baseline, per device class.
fn against_baseline(
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
        .map(|r| r.class.as_str())
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

/// Which ranks a reference applies to.
enum Scope<'a> {
    Class(&'a str),
    /// A GPU model name, compared without regard to case.
    Model(&'a str),
}

impl Scope<'_> {
    fn covers_rank(&self, r: &RankFigures) -> bool {
        match self {
            Scope::Class(c) => r.class == *c,
            Scope::Model(m) => r.model.eq_ignore_ascii_case(m),
        }
    }

    fn covers_job(&self, job: &JobFigures) -> bool {
        match self {
            Scope::Class(c) => job.class.as_deref() == Some(*c),
            Scope::Model(m) => job
                .model
                .as_deref()
                .is_some_and(|x| x.eq_ignore_ascii_case(m)),
        }
    }
}

/// One reference value for one figure.
struct Reference<'a> {
    metric: Metric,
    key: &'a str,
    class_or_model: Scope<'a>,
    value: f64,
    kind: &'static str,
    /// With `ratio`, fail/warn are ratios of `value`; otherwise absolute
    /// thresholds (floors).
    fail: f64,
    warn: Option<f64>,
    ratio: bool,
    rule: String,
}

impl Reference<'_> {
    fn level(&self, v: f64) -> Option<Verdict> {
        if self.ratio {
            let s = score(self.metric, v, self.value);
            return level_of(s, self.fail, self.warn.unwrap_or(self.fail));
        }
        let worse = |limit: f64| {
            if self.metric.higher_is_better() {
                v < limit
            } else {
                v > limit
            }
        };
        if worse(self.fail) {
            Some(Verdict::Fail)
        } else if self.warn.is_some_and(worse) {
            Some(Verdict::Warn)
        } else {
            None
        }
    }

    fn miss(&self, subject: &Subject, value: Option<f64>, level: Verdict) -> Finding {
        finding(Miss {
            subject,
            metric: self.metric,
            key: self.key,
            value,
            reference: self.value,
            kind: self.kind,
            level,
            rule: self.rule.clone(),
        })
    }
}

/// Compares every rank (per-rank metrics) or the job (job metrics) that the
/// reference covers; a covered figure that is missing fails when the job was
/// asked to produce it.
fn compare(
    ranks: &[RankFigures],
    job: &JobFigures,
    expected: &Expected,
    reference: &Reference,
    out: &mut Judgement,
) {
    let (metric, key) = (reference.metric, reference.key);
    let asked = expected.contains(&(metric, key.to_string()));
    let find = |figs: &[Figure]| {
        figs.iter()
            .find(|f| f.metric == metric && f.key == key)
            .map(|f| f.value)
    };
    let mut check = |subject: Subject, figures: &[Figure]| match find(figures) {
        Some(v) => {
            out.judged.insert((metric, key.to_string()));
            if let Some(level) = reference.level(v) {
                out.findings.push(reference.miss(&subject, Some(v), level));
            }
        }
        None if asked => out
            .findings
            .push(reference.miss(&subject, None, Verdict::Fail)),
        None => {}
    };
    if metric.per_rank() {
        for r in ranks
            .iter()
            .filter(|r| r.reported && reference.class_or_model.covers_rank(r))
        {
            check(Subject::of(r), &r.figures);
        }
    } else if reference.class_or_model.covers_job(job) {
        check(Subject::job(job), &job.figures);
    }
}

/// Reference 3: the floors per GPU model (built in, or from `--rules`).
fn floors(
    ranks: &[RankFigures],
    job: &JobFigures,
    expected: &Expected,
    rules: &PerfRules,
    out: &mut Judgement,
) {
    let models: BTreeSet<&str> = ranks
        .iter()
        .filter(|r| r.reported)
        .map(|r| r.model.as_str())
        .collect();
    let mut used: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut lone = false;
    for floor in &rules.floors {
        let Some(metric) = Metric::from_name(&floor.metric) else {
            continue; // refused when the rules were loaded
        };
        let Some(model) = models
            .iter()
            .find(|m| m.eq_ignore_ascii_case(&floor.gpu))
            .copied()
        else {
            continue;
        };
        if floor.single_node && job.single_node.is_none() {
            continue;
        }
        // One rank moves nothing over a link: nccl-tests' bus bandwidth is 0
        // by its formula (2(n-1)/n), and a healthy one-GPU host failed on it.
        if metric == Metric::Busbw && ranks.len() < 2 {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::figures::baseline_figures;
    use crate::judge::rules::Floor;

    fn rank(rank: u32, node: &str, tflops: f64) -> RankFigures {
        RankFigures {
            rank,
            node: node.into(),
            gpu_index: Some(rank % 2),
            gpu_uuid: format!("GPU-{rank}"),
            model: "Test GPU".into(),
            class: "Test GPU · torch 2.11".into(),
            reported: true,
            figures: vec![Figure {
                metric: Metric::StressTflops,
                key: "bf16 8192".into(),
                value: tflops,
            }],
            intervals: 10,
        }
    }

    fn expected(pairs: &[(Metric, &str)]) -> Expected {
        pairs.iter().map(|(m, k)| (*m, k.to_string())).collect()
    }

    #[test]
    fn fleet_names_the_slow_rank_only() {
        // Four nodes of two GPUs: one vote per node, the median of
        // 652.5, 484, 650.5 and 650.5.
        let ranks: Vec<_> = [650.0, 655.0, 648.0, 320.0, 650.0, 651.0, 649.0, 652.0]
            .iter()
            .enumerate()
            .map(|(i, v)| rank(i as u32, &format!("n{}", i / 2), *v))
            .collect();
        let j = judge(
            &ranks,
            &JobFigures::default(),
            &Expected::new(),
            &PerfRules::default(),
            None,
        );
        let fails: Vec<_> = j
            .findings
            .iter()
            .filter(|f| f.level() == Verdict::Fail)
            .collect();
        assert_eq!(fails.len(), 1, "{:#?}", j.findings);
        assert_eq!(fails[0].rank, Some(3));
        assert_eq!(fails[0].node, "n1");
        assert_eq!(fails[0].reference_kind, "fleet");
        assert!((fails[0].reference - 650.5).abs() < 1e-9);
        assert!(fails[0].detail.contains("rank 3 on node n1 (GPU 1)"));
        assert!(
            fails[0].rule.contains("4 nodes' medians"),
            "{}",
            fails[0].rule
        );
        assert!(j
            .notes
            .iter()
            .any(|n| n.contains("one vote per node (n0, n1, n2, n3)")));
    }

    /// What the README's local fleet saw: 8 CPU ranks on 2 cores, two of
    /// them at 0.89x of the median. A CPU rank that far under passes, one
    /// as slow as a CPU quota makes it fails, and a GPU that far under fails.
    /// The with-comm spread measured on healthy H100s (0.896x at worst)
    /// passes its own rule from the built-in rules; the same spread of
    /// plain stress fails, and a with-comm rank far off still fails.
    #[test]
    fn stress_beside_an_all_reduce_is_judged_by_its_own_ratios() {
        let rules = PerfRules::default();
        let levels = |metric: Metric, values: [f64; 4]| {
            let ranks: Vec<_> = values
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let mut r = rank(i as u32, "n0", *v);
                    r.figures[0].metric = metric;
                    r
                })
                .collect();
            let j = judge(
                &ranks,
                &JobFigures::default(),
                &Expected::new(),
                &rules,
                None,
            );
            j.findings
                .iter()
                .map(|f| (f.rank.unwrap(), f.level()))
                .collect::<Vec<_>>()
        };
        let healthy = [524.0, 584.0, 596.0, 585.0];
        assert_eq!(levels(Metric::StressTflopsComm, healthy), []);
        assert_eq!(levels(Metric::StressTflops, healthy), [(0, Verdict::Fail)]);
        assert_eq!(
            levels(Metric::StressTflopsComm, [480.0, 584.0, 596.0, 585.0]),
            [(0, Verdict::Warn)]
        );
        assert_eq!(
            levels(Metric::StressTflopsComm, [450.0, 584.0, 596.0, 585.0]),
            [(0, Verdict::Fail)]
        );
    }

    /// As measured on 4 x H100 (2026-11-27): another process's GEMMs on GPU
    /// 3 took all four ranks to 263-265 TFLOP/s beside the all_reduce, alike;
    /// alone, GPU 3's GEMMs are the slow ones. The phase alone names it, and
    /// only it.
    #[test]
    fn stress_with_comm_names_a_slow_gpu_by_its_gemms_alone() {
        use crate::judge::figures::{intervals, rank_figures};
        use gpuctl_core::pb::{rank_result::Detail, RankResult, StressResult};
        let rules = PerfRules::default();
        let ranks: Vec<RankFigures> = [662.0, 668.0, 665.0, 301.0]
            .iter()
            .enumerate()
            .map(|(i, alone)| {
                let res = RankResult {
                    detail: Some(Detail::Stress(StressResult {
                        dtype: "bf16".into(),
                        matrix_size: 8192,
                        with_comm: true,
                        tflops_per_interval: vec![264.0; 9],
                        tflops_median: 264.0,
                        solo_tflops_per_interval: vec![*alone; 6],
                        solo_tflops_median: *alone,
                        ..Default::default()
                    })),
                    ..Default::default()
                };
                let mut r = rank(i as u32, "n0", 0.0);
                r.figures = rank_figures("stress", &res);
                r.intervals = intervals(&res);
                r
            })
            .collect();
        assert_eq!(ranks[0].intervals, 6);
        let j = judge(
            &ranks,
            &JobFigures::default(),
            &Expected::new(),
            &rules,
            None,
        );
        let named: Vec<_> = j
            .findings
            .iter()
            .map(|f| {
                (
                    f.rank.unwrap(),
                    f.level(),
                    f.metric.as_str(),
                    f.key.as_str(),
                )
            })
            .collect();
        assert_eq!(
            named,
            [
                (3, Verdict::Fail, "stress_tflops", "bf16 8192"),
                (3, Verdict::Fail, "stress_tflops_worst", "bf16 8192"),
            ],
            "{:#?}",
            j.findings
        );
    }

    #[test]
    fn cpu_ranks_have_their_own_fleet_ratios() {
        let cpu = |mut r: RankFigures| {
            r.gpu_index = None;
            r.class = "AMD EPYC · torch 2.11".into();
            r
        };
        let judged = |ranks: &[RankFigures]| {
            let j = judge(
                ranks,
                &JobFigures::default(),
                &Expected::new(),
                &PerfRules::default(),
                None,
            );
            j.findings
                .iter()
                .filter(|f| f.level() == Verdict::Fail)
                .map(|f| f.rank)
                .collect::<Vec<_>>()
        };
        let speeds = [0.017, 0.017, 0.017, 0.017, 0.017, 0.017, 0.0151, 0.0149];
        let ranks: Vec<_> = speeds
            .iter()
            .enumerate()
            .map(|(i, v)| cpu(rank(i as u32, &format!("n{}", i / 2), *v)))
            .collect();
        assert!(judged(&ranks).is_empty(), "healthy CPU ranks failed");
        let mut slowed = ranks.clone();
        slowed[7].figures[0].value = 0.003;
        assert_eq!(judged(&slowed), [Some(7)]);
        let gpus: Vec<_> = speeds
            .iter()
            .enumerate()
            .map(|(i, v)| rank(i as u32, &format!("n{}", i / 2), *v))
            .collect();
        assert_eq!(judged(&gpus), [Some(6), Some(7)]);
    }

    #[test]
    fn short_stress_runs_are_not_compared_and_the_report_says_so() {
        let mut ranks: Vec<_> = [650.0, 655.0, 648.0, 320.0]
            .iter()
            .enumerate()
            .map(|(i, v)| rank(i as u32, "n", *v))
            .collect();
        for r in &mut ranks {
            r.intervals = 2;
        }
        let j = judge(
            &ranks,
            &JobFigures::default(),
            &Expected::new(),
            &PerfRules::default(),
            None,
        );
        assert!(j.findings.is_empty(), "{:#?}", j.findings);
        assert!(j
            .notes
            .iter()
            .any(|n| n.contains("fewer than 5 sampling intervals")));
    }

    #[test]
    fn fleet_needs_three_ranks_and_says_so() {
        let ranks = vec![rank(0, "a", 600.0), rank(1, "a", 100.0)];
        let j = judge(
            &ranks,
            &JobFigures::default(),
            &Expected::new(),
            &PerfRules::default(),
            None,
        );
        assert!(j.findings.is_empty());
        assert!(j
            .notes
            .iter()
            .any(|n| n.contains("fleet reference not used")));
        // Nothing else judged them: the first note says so, by name.
        assert!(
            j.notes[0].starts_with("judged against nothing")
                && j.notes[0].contains("stress_tflops `bf16 8192`"),
            "{:?}",
            j.notes
        );
        // Four nodes make a fleet reference: nothing is left unjudged.
        let ranks: Vec<_> = ["a", "b", "c", "d"]
            .iter()
            .enumerate()
            .map(|(i, n)| rank(i as u32, n, 600.0))
            .collect();
        let j = judge(
            &ranks,
            &JobFigures::default(),
            &Expected::new(),
            &PerfRules::default(),
            None,
        );
        assert!(
            !j.notes
                .iter()
                .any(|n| n.starts_with("judged against nothing")),
            "{:?}",
            j.notes
        );
    }

    /// A healthy one-GPU H200 failed `nccl` on its busbw floor (0 GB/s by
    /// the formula with one rank).
    #[test]
    fn busbw_floors_need_two_ranks() {
        let rules = PerfRules {
            floors: vec![Floor {
                gpu: "test gpu".into(),
                metric: "busbw".into(),
                key: "all_reduce 1073741824 float".into(),
                fail: 280.0,
                warn: None,
                single_node: false,
                source: "test".into(),
            }],
            ..PerfRules::default()
        };
        let job = |busbw: f64| JobFigures {
            class: Some("Test GPU · torch 2.11".into()),
            model: Some("Test GPU".into()),
            single_node: Some("n".into()),
            figures: vec![Figure {
                metric: Metric::Busbw,
                key: "all_reduce 1073741824 float".into(),
                value: busbw,
            }],
        };
        let want = expected(&[(Metric::Busbw, "all_reduce 1073741824 float")]);
        let one = judge(&[rank(0, "n", 0.0)], &job(0.0), &want, &rules, None);
        assert!(one.findings.is_empty(), "{:#?}", one.findings);
        assert!(one
            .notes
            .iter()
            .any(|n| n.contains("one rank moves nothing")));
        let two = [rank(0, "n", 0.0), rank(1, "n", 0.0)];
        let slow = judge(&two, &job(100.0), &want, &rules, None);
        assert_eq!(slow.findings.len(), 1, "{:#?}", slow.findings);
    }

    #[test]
    fn floors_fail_and_missing_figures_fail() {
        let rules = PerfRules {
            floors: vec![Floor {
                gpu: "test gpu".into(),
                metric: "stress_tflops".into(),
                key: "bf16 8192".into(),
                fail: 550.0,
                warn: Some(600.0),
                single_node: false,
                source: "test".into(),
            }],
            ..PerfRules::default()
        };
        let mut ranks = vec![
            rank(0, "a", 700.0),
            rank(1, "a", 580.0),
            rank(2, "b", 500.0),
        ];
        ranks.push(RankFigures {
            figures: vec![],
            ..rank(3, "b", 0.0)
        });
        let want = expected(&[(Metric::StressTflops, "bf16 8192")]);
        let j = judge(&ranks, &JobFigures::default(), &want, &rules, None);
        let by_rank: BTreeMap<u32, Verdict> = j
            .findings
            .iter()
            .filter(|f| f.reference_kind == "floor")
            .map(|f| (f.rank.unwrap(), f.level()))
            .collect();
        assert_eq!(by_rank.get(&0), None);
        assert_eq!(by_rank[&1], Verdict::Warn);
        assert_eq!(by_rank[&2], Verdict::Fail);
        assert_eq!(by_rank[&3], Verdict::Fail, "missing figure fails");
        let missing = j.findings.iter().find(|f| f.rank == Some(3)).unwrap();
        assert!(missing.missing && missing.detail.contains("no stress_tflops bf16 8192"));
        // Not asked for: the floor does not apply to a job of another size.
        let j = judge(
            &ranks[3..],
            &JobFigures::default(),
            &Expected::new(),
            &rules,
            None,
        );
        assert!(j.findings.is_empty());
    }

    #[test]
    fn baseline_per_class_and_job_figures() {
        let healthy: Vec<_> = (0..4).map(|i| rank(i, "a", 650.0)).collect();
        let job = JobFigures {
            class: Some("Test GPU · torch 2.11".into()),
            model: Some("Test GPU".into()),
            single_node: None,
            figures: vec![Figure {
                metric: Metric::Busbw,
                key: "all_reduce 1073741824 float".into(),
                value: 330.0,
            }],
        };
        let b = Baseline {
            name: "h200".into(),
            job_id: "job-1".into(),
            figures: baseline_figures(&healthy, &job),
            ..Default::default()
        };
        assert_eq!(b.figures.len(), 2);
        let mut slow = healthy.clone();
        slow[2].figures[0].value = 500.0;
        let slow_job = JobFigures {
            figures: vec![Figure {
                value: 200.0,
                ..job.figures[0].clone()
            }],
            ..job.clone()
        };
        let j = judge(
            &slow,
            &slow_job,
            &Expected::new(),
            &PerfRules::default(),
            Some(&b),
        );
        let base: Vec<_> = j
            .findings
            .iter()
            .filter(|f| f.reference_kind == "baseline")
            .collect();
        assert_eq!(base.len(), 2, "{base:#?}");
        assert!(base
            .iter()
            .any(|f| f.rank == Some(2) && f.level() == Verdict::Fail));
        let link = base.iter().find(|f| f.metric == "busbw").unwrap();
        assert_eq!(link.node, "", "a multi-node job figure blames no node");
        // Another device class: the baseline does not apply, and the report says so.
        let mut other = healthy.clone();
        for r in &mut other {
            r.class = "NVIDIA H100 · torch 2.11".into();
        }
        let j = judge(
            &other,
            &JobFigures::default(),
            &Expected::new(),
            &PerfRules::default(),
            Some(&b),
        );
        assert!(j.findings.is_empty());
        assert!(j.notes.iter().any(|n| n.contains("does not apply")));
    }

    #[test]
    fn step_time_is_better_low() {
        assert!(score(Metric::StepMsP99, 200.0, 100.0) < 0.9);
        assert!(score(Metric::StressTflops, 50.0, 100.0) < 0.9);
    }
}

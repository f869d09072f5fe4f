//! The findings and rule texts every reference writes: one sentence form for
//! a miss, whichever reference it missed, so that reports read alike.

use crate::judge::checks::{Check, Level, Phase};

use super::{JobFigures, Metric, RankFigures};

/// How good `value` is against `reference`, 1.0 = equal, lower = worse.
pub(super) fn score(metric: Metric, value: f64, reference: f64) -> f64 {
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
pub(super) struct Subject {
    node: String,
    rank: Option<u32>,
    gpu_index: Option<u32>,
    gpu_uuid: String,
}

impl Subject {
    pub(super) fn of(r: &RankFigures) -> Subject {
        Subject {
            node: r.node.to_string(),
            rank: Some(r.rank),
            gpu_index: r.gpu_index,
            gpu_uuid: r.gpu_uuid.clone(),
        }
    }

    pub(super) fn job(job: &JobFigures) -> Subject {
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
pub(super) struct Miss<'a> {
    pub(super) subject: &'a Subject,
    pub(super) metric: Metric,
    pub(super) key: &'a str,
    pub(super) value: Option<f64>,
    pub(super) reference: f64,
    pub(super) kind: &'static str,
    pub(super) level: Level,
    pub(super) rule: String,
}

pub(super) fn finding(m: Miss) -> Check {
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
    Check {
        phase: Phase::Measured,
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
        level: m.level,
        unit: m.metric.unit().to_string(),
        detail,
        ..Default::default()
    }
}

/// The level a score earns under `fail`/`warn` ratios, if any.
pub(super) fn level_of(score: f64, fail: f64, warn: f64) -> Option<Level> {
    if score < fail {
        Some(Level::Fail)
    } else if score < warn {
        Some(Level::Warn)
    } else {
        None
    }
}

pub(super) fn ratio_rule(kind: &str, metric: Metric, fail: f64, warn: f64, what: &str) -> String {
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

//! One reference value held against the figures it covers, shared by the
//! baseline and the floors: they differ in what they cover (a device class,
//! a GPU model) and in whether their limits are ratios or absolute figures,
//! not in how a miss or a missing figure is found.

use crate::judge::checks::{Check, Level};

use super::finding::{finding, level_of, score, Miss, Subject};
use super::{Expected, Figure, JobFigures, Judgement, Metric, RankFigures};

/// Which ranks a reference applies to.
pub(super) enum Scope<'a> {
    Class(&'a str),
    /// A GPU model name, compared without regard to case.
    Model(&'a str),
}

impl Scope<'_> {
    fn covers_rank(&self, r: &RankFigures) -> bool {
        match self {
            Scope::Class(c) => *r.class == **c,
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
pub(super) struct Reference<'a> {
    pub(super) metric: Metric,
    pub(super) key: &'a str,
    pub(super) class_or_model: Scope<'a>,
    pub(super) value: f64,
    pub(super) kind: &'static str,
    /// With `ratio`, fail/warn are ratios of `value`; otherwise absolute
    /// thresholds (floors).
    pub(super) fail: f64,
    pub(super) warn: Option<f64>,
    pub(super) ratio: bool,
    pub(super) rule: String,
}

impl Reference<'_> {
    fn level(&self, v: f64) -> Option<Level> {
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
            Some(Level::Fail)
        } else if self.warn.is_some_and(worse) {
            Some(Level::Warn)
        } else {
            None
        }
    }

    fn miss(&self, subject: &Subject, value: Option<f64>, level: Level) -> Check {
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
pub(super) fn compare(
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
            .find(|f| f.metric == metric && *f.key == *key)
            .map(|f| f.value)
    };
    // The subject is made only for a finding, and the figure marked judged
    // once: at 131,072 ranks one of each per rank was most of this check.
    let mut judged = false;
    let mut check = |subject: &dyn Fn() -> Subject, figures: &[Figure]| match find(figures) {
        Some(v) => {
            judged = true;
            if let Some(level) = reference.level(v) {
                out.findings
                    .push(reference.miss(&subject(), Some(v), level));
            }
        }
        None if asked => out
            .findings
            .push(reference.miss(&subject(), None, Level::Fail)),
        None => {}
    };
    if metric.per_rank() {
        for r in ranks
            .iter()
            .filter(|r| r.reported && reference.class_or_model.covers_rank(r))
        {
            check(&|| Subject::of(r), &r.figures);
        }
    } else if reference.class_or_model.covers_job(job) {
        check(&|| Subject::job(job), &job.figures);
    }
    if judged {
        out.judged.insert((metric, key.to_string()));
    }
}

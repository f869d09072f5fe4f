//! Re-judging: a figure's verdict and margin from its value, reference and
//! thresholds alone. The coordinator fills a certificate's figures through
//! [`judged`], and `verify` runs it again on what it read: one function,
//! so the two cannot disagree unless the certificate was changed.

use crate::model::{Certificate, FigureRecord};

/// The score of `value` against `reference`: 1.0 = equal, lower = worse.
fn score(value: f64, reference: f64, higher_is_better: bool) -> f64 {
    if higher_is_better {
        value / reference
    } else if value > 0.0 {
        reference / value
    } else {
        1.0
    }
}

/// A figure with its margin and verdict set from its other fields.
pub fn judged(mut f: FigureRecord) -> FigureRecord {
    let judgeable = f.reference_kind != "none"
        && f.reference.is_finite()
        && f.reference > 0.0
        && f.value.is_finite();
    if !judgeable {
        f.margin = 0.0;
        f.verdict = "unjudged".into();
        return f;
    }
    let s = score(f.value, f.reference, f.higher_is_better);
    f.margin = s - 1.0;
    f.verdict = if s < f.fail_below {
        "fail"
    } else if s < f.warn_below {
        "warn"
    } else {
        "pass"
    }
    .into();
    f
}

/// Each figure whose recorded verdict or margin is not what its fields give:
/// (index, what the certificate says, what re-judging gives).
pub fn disagreements(cert: &Certificate) -> Vec<String> {
    cert.figures
        .iter()
        .enumerate()
        .filter_map(|(i, f)| {
            let again = judged(f.clone());
            (again.verdict != f.verdict || again.margin.to_bits() != f.margin.to_bits()).then(|| {
                format!(
                    "figure {i} ({} {} rank {:?} in {}): recorded {} (margin {}), re-judged {} (margin {})",
                    f.metric, f.key, f.rank, f.stage, f.verdict, f.margin, again.verdict, again.margin
                )
            })
        })
        .collect()
}

//! `stress`: GEMM TFLOP/s per rank, the median and the slowest tenth of the
//! sampling intervals, and with `--with-comm` the GEMMs alone before the
//! all_reduce beside them.

use gpuctl_core::catalogue::StressParams;
use gpuctl_proto::pb::{rank_result::Detail, RankResult, StressResult};

use super::{Expected, Figure, Metric, Name};

/// `bf16 8192`, or `bf16 8192 with_comm` for GEMMs beside an all_reduce:
/// floors and baselines of plain stress do not judge those.
pub fn stress_key(precision: &str, size: u64, with_comm: bool) -> String {
    use std::fmt::Write;
    const COMM: &str = " with_comm";
    // Made for every rank of a job, twice: `format!` regrows its buffer.
    let mut key = String::with_capacity(precision.len() + 21 + COMM.len());
    key.push_str(precision);
    key.push(' ');
    let _ = write!(key, "{size}");
    if with_comm {
        key.push_str(COMM);
    }
    key
}

/// How many sampling intervals a stress rank's TFLOP/s figures come from.
pub fn intervals(r: &RankResult) -> u32 {
    match &r.detail {
        Some(Detail::Stress(s)) if s.with_comm && !s.solo_tflops_per_interval.is_empty() => {
            s.tflops_per_interval
                .len()
                .min(s.solo_tflops_per_interval.len()) as u32
        }
        Some(Detail::Stress(s)) => s.tflops_per_interval.len() as u32,
        _ => 0,
    }
}

/// A stress rank's "worst" figure: its slowest tenth of sampling intervals
/// (nearest rank), so a single interval's dip among ten or more is not the
/// figure judged; with ten intervals or fewer it is the slowest one.
pub fn slow_tenth(per_interval: &[f64]) -> f64 {
    let mut v: Vec<f64> = per_interval
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let at = (v.len() as f64 * 0.1).ceil() as usize;
    v[at.saturating_sub(1).min(v.len() - 1)]
}

/// A stress rank's figures; `s` has sampling intervals.
pub(super) fn rank_figures(s: &StressResult) -> Vec<Figure> {
    let fig = |metric, key: Name, value| Figure { metric, key, value };
    let key: Name = stress_key(&s.dtype, s.matrix_size as u64, s.with_comm).into();
    let mut v = vec![
        fig(Metric::stress(s.with_comm), key.clone(), s.tflops_median),
        fig(
            Metric::StressTflopsWorst,
            key,
            slow_tenth(&s.tflops_per_interval),
        ),
    ];
    // The GEMMs alone before the all_reduce: the figures that name
    // a slow GPU, judged as plain stress.
    if s.with_comm && !s.solo_tflops_per_interval.is_empty() {
        let plain: Name = stress_key(&s.dtype, s.matrix_size as u64, false).into();
        v.push(fig(
            Metric::StressTflops,
            plain.clone(),
            s.solo_tflops_median,
        ));
        v.push(fig(
            Metric::StressTflopsWorst,
            plain,
            slow_tenth(&s.solo_tflops_per_interval),
        ));
    }
    v
}

pub(super) fn expected(s: &StressParams, out: &mut Expected) {
    let key = stress_key(&s.precision, s.size, s.with_comm);
    out.insert((Metric::stress(s.with_comm), key.clone()));
    out.insert((Metric::StressTflopsWorst, key));
    if s.with_comm {
        // Its GEMMs alone first (StressResult.solo_tflops_*).
        let plain = stress_key(&s.precision, s.size, false);
        out.insert((Metric::StressTflops, plain.clone()));
        out.insert((Metric::StressTflopsWorst, plain));
    }
}

//! A rank's timelines thinned to what a big job can hold. A 15-minute stress
//! rank has 900 TFLOP/s intervals and as many phase marks (~47 KB): at
//! 32,768 ranks that is 1.5 GB sent at the job's end, decoded by the
//! coordinator on top of its other work, and held until the report is made.
//! Past [`POINTS_PER_JOB`] points a job, each rank keeps fewer (never under
//! [`MIN_POINTS`]): intervals merged into longer ones by their mean, phase
//! marks kept at every phase change and evenly within a phase, step times
//! evenly. The figures verdicts are made from (the worker's median, minimum,
//! percentiles) are untouched.
//!
//! Workers thin their result before they send it, knowing the world size;
//! the coordinator thins again whatever arrives (an older worker's).

use gpuctl_proto::pb::{rank_result::Detail, PhaseMark, RankResult};

/// Points of each series a whole job keeps.
pub const POINTS_PER_JOB: usize = 1 << 18;
/// Points every rank keeps, whatever the world size: a minute per point
/// over a 15-minute job, past every phase change. At 64 the timelines of
/// 32,768 ranks were ~130 MB more at the job's end (results, report and its
/// encodings); at 32, each result of a 131,072-rank job held ~1 KB more
/// decoded (16 more phase marks of 48 bytes and their text), ~130 MB of the
/// coordinator's peak.
/// Jobs of 8,192 ranks or fewer keep 32 or more, as before.
pub const MIN_POINTS: usize = 16;

/// The points each rank of a job of `world` ranks keeps per series.
pub fn points_per_rank(world: u32) -> usize {
    (POINTS_PER_JOB / world.max(1) as usize).max(MIN_POINTS)
}

/// Thins `r`'s series to `max` points each; returns whether anything changed.
pub fn thin(r: &mut RankResult, max: usize) -> bool {
    let mut changed = phases(&mut r.phases, max);
    match &mut r.detail {
        Some(Detail::Stress(s)) => {
            let n = s.tflops_per_interval.len();
            if n > max {
                let k = n.div_ceil(max);
                s.tflops_per_interval = s
                    .tflops_per_interval
                    .chunks(k)
                    .map(|c| c.iter().sum::<f64>() / c.len() as f64)
                    .collect();
                s.interval_s *= k as f64;
                changed = true;
            }
        }
        Some(Detail::Train(t)) => changed |= evenly(&mut t.step_ms, max),
        _ => {}
    }
    for t in &mut r.more_train {
        changed |= evenly(&mut t.step_ms, max);
    }
    changed
}

/// `v` thinned to `max` items ([`crate::stats::thin_evenly`]); whether it was.
fn evenly<T: Clone>(v: &mut Vec<T>, max: usize) -> bool {
    if v.len() <= max || max == 0 {
        return false;
    }
    *v = crate::stats::thin_evenly(v, max);
    true
}

/// Keeps the first and last mark and every change of phase or kind; the marks within
/// a phase share what is left, evenly.
fn phases(marks: &mut Vec<PhaseMark>, max: usize) -> bool {
    if marks.len() <= max {
        return false;
    }
    let last = marks.len() - 1;
    let must: Vec<bool> = (0..marks.len())
        .map(|i| {
            i == 0
                || i == last
                || marks[i].phase != marks[i - 1].phase
                || marks[i].kind != marks[i - 1].kind
        })
        .collect();
    let required = must.iter().filter(|m| **m).count();
    let room = max.saturating_sub(required);
    let optional = marks.len() - required;
    let every = if room == 0 {
        usize::MAX
    } else {
        optional.div_ceil(room)
    };
    let mut seen = 0usize;
    let kept: Vec<PhaseMark> = marks
        .iter()
        .zip(&must)
        .filter(|(_, must)| {
            if **must {
                return true;
            }
            seen += 1;
            every != usize::MAX && (seen - 1).is_multiple_of(every)
        })
        .map(|(m, _)| m.clone())
        .collect();
    *marks = kept;
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb::{StressResult, TrainResult};

    fn mark(phase: &str, t: u64) -> PhaseMark {
        PhaseMark {
            phase: phase.into(),
            unix_ms: t,
            iterations: t,
            ..Default::default()
        }
    }

    #[test]
    fn a_big_jobs_ranks_keep_fewer_points() {
        assert_eq!(points_per_rank(8), 32_768);
        assert_eq!(points_per_rank(32_768), MIN_POINTS);
        assert_eq!(points_per_rank(1_024), 256);
        assert_eq!(points_per_rank(8_192), 32);
        assert_eq!(points_per_rank(131_072), 16);
    }

    #[test]
    fn a_15_minute_stress_rank_is_thinned_and_keeps_its_figures() {
        let tflops: Vec<f64> = (0..900).map(|i| 700.0 + (i % 10) as f64).collect();
        let mut marks = vec![mark("starting", 0)];
        marks.extend((1..=900).map(|i| mark("gemm", i * 1000)));
        marks.push(mark("done", 901_000));
        let mut r = RankResult {
            phases: marks,
            detail: Some(Detail::Stress(StressResult {
                tflops_per_interval: tflops.clone(),
                tflops_min: 700.0,
                tflops_median: 704.5,
                interval_s: 1.0,
                ..Default::default()
            })),
            ..Default::default()
        };
        assert!(thin(&mut r, 64));
        assert!(r.phases.len() <= 64, "{}", r.phases.len());
        assert_eq!(r.phases[0].phase, "starting");
        assert_eq!(r.phases[1].phase, "gemm", "the phase change is kept");
        assert_eq!(r.phases.last().unwrap().phase, "done");
        assert!(r.phases.windows(2).all(|w| w[0].unix_ms < w[1].unix_ms));
        let Some(Detail::Stress(s)) = &r.detail else {
            panic!()
        };
        assert!(s.tflops_per_interval.len() <= 64);
        assert_eq!(s.interval_s, 15.0, "900 intervals of 1 s in 60 of 15 s");
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        assert!((mean(&s.tflops_per_interval) - mean(&tflops)).abs() < 1e-9);
        assert_eq!((s.tflops_min, s.tflops_median), (700.0, 704.5));
        assert!(!thin(&mut r, 64), "thinning twice changes nothing");
    }

    #[test]
    fn step_times_are_thinned_evenly_and_short_series_are_left_alone() {
        let mut r = RankResult {
            detail: Some(Detail::Train(TrainResult {
                step_ms: (0..4096).map(f64::from).collect(),
                ..Default::default()
            })),
            more_train: vec![TrainResult {
                step_ms: vec![1.0; 10],
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(thin(&mut r, 64));
        let Some(Detail::Train(t)) = &r.detail else {
            panic!()
        };
        assert!(t.step_ms.len() <= 64, "{}", t.step_ms.len());
        assert_eq!(t.step_ms[0], 0.0);
        assert_eq!(*t.step_ms.last().unwrap(), 4095.0);
        assert_eq!(r.more_train[0].step_ms.len(), 10);
    }
}

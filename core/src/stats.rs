//! The statistics every crate uses, each defined once:
//!
//! * [`median`]: the middle value, or the mean of the two middle ones
//!   ([`median_in`] in place, reordering a slice the caller keeps);
//! * [`quantile`] and [`quantile_sorted`]: nearest rank, the smallest value
//!   with at least a share `q` of the values at or below it (p99 of 30 step
//!   times is the 30th; the upper quartile of 8 figures the 6th);
//! * [`thin_evenly`]: at most `max` items of a list, evenly spread, the
//!   first and last kept.
//!
//! Empty input has no statistic (`None`); callers say what stands in.

/// The median, `None` for no values. Selected, not sorted: a job's 32,768
/// figures were a tenth of its judging.
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    median_in(&mut v)
}

/// [`median`] of `v`, whose order it changes.
pub fn median_in(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let n = v.len();
    let (lower, mid, _) = v.select_nth_unstable_by(n / 2, f64::total_cmp);
    let mid = *mid;
    Some(if n % 2 == 1 {
        mid
    } else {
        let below = lower.iter().copied().max_by(f64::total_cmp).unwrap_or(mid);
        (below + mid) / 2.0
    })
}

/// The nearest-rank quantile `q` (0..1) of `v`, `None` for no values.
pub fn quantile(mut v: Vec<f64>, q: f64) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    quantile_sorted(&v, q)
}

/// [`quantile`] of values already sorted (ascending).
pub fn quantile_sorted(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let at = ((sorted.len() as f64) * q.clamp(0.0, 1.0)).ceil() as usize;
    Some(sorted[at.saturating_sub(1).min(sorted.len() - 1)])
}

/// The upper quartile: the reference of searches and pair matrices, where a
/// quarter of the figures may be slow.
pub fn upper_quartile(v: Vec<f64>) -> Option<f64> {
    quantile(v, 0.75)
}

/// At most `max` items of `v`, evenly spread, the first and last kept (one
/// item: the last).
pub fn thin_evenly<T: Clone>(v: &[T], max: usize) -> Vec<T> {
    let n = v.len();
    if n <= max {
        return v.to_vec();
    }
    if max <= 1 {
        return v.last().cloned().into_iter().take(max).collect();
    }
    (0..max)
        .map(|i| v[i * (n - 1) / (max - 1)].clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_take_the_mean_of_the_middles() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![7.0]), Some(7.0));
        assert_eq!(median(vec![3.0, 3.0, 1.0, 3.0]), Some(3.0));
        let mut many: Vec<f64> = (0..1001).map(|i| ((i * 7919) % 1001) as f64).collect();
        assert_eq!(median(many.clone()), Some(500.0));
        many.push(1001.0);
        assert_eq!(median(many), Some(500.5));
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile_sorted(&v, 0.99), Some(99.0));
        assert_eq!(quantile_sorted(&v, 0.5), Some(50.0));
        assert_eq!(quantile_sorted(&v, 1.0), Some(100.0));
        assert_eq!(quantile_sorted(&v, 0.0), Some(1.0));
        assert_eq!(
            upper_quartile(vec![8.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]),
            Some(6.0)
        );
        assert_eq!(quantile(vec![], 0.5), None);
    }

    #[test]
    fn thinning_keeps_the_ends() {
        let v: Vec<u32> = (0..10).collect();
        assert_eq!(thin_evenly(&v, 20), v);
        assert_eq!(thin_evenly(&v, 4), [0, 3, 6, 9]);
        assert_eq!(thin_evenly(&v, 2), [0, 9]);
        assert_eq!(thin_evenly(&v, 1), [9]);
        assert!(thin_evenly(&v, 0).is_empty());
    }
}

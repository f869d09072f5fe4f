//! The per-job bucket budget, and how a full series takes a new bucket.

use super::*;
use prost::Message;

/// GPU 3 at full load at `t`: the fixture's gauges are not zero, so the
/// budget below measures buckets of real values, not proto3's empty
/// defaults (which encode to nothing).
fn busy(t: u64) -> GpuSample {
    GpuSample {
        unix_ms: t,
        ..gpuctl_testkit::gpu::healthy(3)
    }
}

#[test]
fn a_large_job_keeps_few_wide_buckets_and_exact_totals() {
    assert_eq!(buckets_per_gpu(8), MAX_BUCKETS);
    assert_eq!(buckets_per_gpu(4096 * 8), MIN_BUCKETS);
    let max = buckets_per_gpu(1024 * 8);
    assert_eq!(max, 24);
    let mut g = GpuSeries::new("n", 3, "GPU-x");
    // 15 minutes of one sample a second.
    for i in 0..900u64 {
        g.add_within(&busy(1_000_000 + i * 1_000), 1_000_000 + i * 1_000, max);
    }
    assert!(g.buckets.len() <= max, "{}", g.buckets.len());
    assert_eq!(g.totals().n, 900, "merging loses no sample");
    // What the budget assumes a bucket costs in the store.
    let per_bucket = g.encoded_len() / g.buckets.len();
    assert!(per_bucket < 400, "{per_bucket} bytes per bucket");
    let job_bytes = per_bucket * JOB_BUCKETS;
    assert!(job_bytes < 64 << 20, "{job_bytes} bytes per job");
}

/// The series as it was made before it merged a full series' buckets
/// with the new one: pushed first (room for one past the limit), then
/// merged pairwise while too many.
fn pushed_then_merged(g: &mut GpuSeries, s: &GpuSample, t: u64, max: usize) {
    let b = Bucket::of(s, t);
    let origin = g.origin(t);
    match g.buckets.last_mut() {
        Some(last)
            if t <= last.start_ms
                || slot(t, origin, g.bucket_ms) == slot(last.start_ms, origin, g.bucket_ms) =>
        {
            last.merge(&b)
        }
        _ => g.buckets.push(b),
    }
    while g.buckets.len() > max.max(2) {
        g.bucket_ms *= 2;
        let width = g.bucket_ms;
        let mut merged: Vec<Bucket> = Vec::new();
        for b in g.buckets.drain(..) {
            match merged.last_mut() {
                Some(m) if slot(m.start_ms, origin, width) == slot(b.start_ms, origin, width) => {
                    m.merge(&b)
                }
                _ => merged.push(b),
            }
        }
        g.buckets = merged;
    }
}

#[test]
fn a_full_series_takes_a_bucket_as_before_without_room_past_its_limit() {
    // Samples a second apart, with gaps, late ones, and a limit that
    // shrinks as a job's GPUs join, as a big job's come.
    let mut times = Vec::new();
    let mut t = 1_000_000u64;
    for i in 0..700u64 {
        t += match i % 13 {
            0 => 7_000,
            5 => 0,
            _ => 1_000,
        };
        let late = if i % 17 == 0 { t - 2_500 } else { t };
        times.push((late, if i < 300 { 24 } else { MIN_BUCKETS }));
    }
    let (mut now, mut before) = (
        GpuSeries::new("n", 3, "GPU-x"),
        GpuSeries::new("n", 3, "GPU-x"),
    );
    for (t, max) in times {
        now.add_within(&busy(t), t, max);
        pushed_then_merged(&mut before, &busy(t), t, max);
        assert_eq!(now.buckets, before.buckets, "at {t}");
        assert_eq!(now.bucket_ms, before.bucket_ms, "at {t}");
        assert!(
            now.buckets.capacity() <= max,
            "{} at {t}",
            now.buckets.capacity()
        );
    }
    assert_eq!(now.totals().n, 700);
}

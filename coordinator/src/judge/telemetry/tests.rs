//! Telemetry held, stored and summarised: downsampling keeps the summary,
//! changed series go round the GPUs, and health findings come out per GPU.

use super::*;
use crate::judge::checks::health::HealthRules;
use crate::judge::series::{LOW_UTIL, MAX_BUCKETS};
use gpuctl_proto::pb::{GpuSample, Verdict};
use gpuctl_testkit::gpu;
use prost::Message;

/// GPU 1 (`GPU-1`), healthy but for what the test sets, at 500 W.
fn sample(t: u64, util: f64, ecc_u: u64, xids: Vec<u32>) -> GpuSample {
    GpuSample {
        unix_ms: t,
        util_gpu: util,
        power_w: 500.0,
        ecc_uncorrected: ecc_u,
        xids,
        ..gpu::healthy(1)
    }
}

fn batch(samples: Vec<GpuSample>) -> TelemetryBatch {
    gpu::batch("n0", "j", samples)
}

/// The issue-34 misread: 15 of 18 links unread in one sample, then a
/// real link down for 12 seconds: the first says nothing, the second is
/// named with its stretch.
#[test]
fn unread_links_are_not_down_and_a_down_link_needs_a_stretch() {
    let mut t = Telemetry::default();
    for i in 0..30u64 {
        let mut s = sample(1_000 + i * 1_000, 100.0, 0, vec![]);
        if i == 3 {
            (s.nvlinks_active, s.nvlinks_unknown) = (3, 15);
        }
        if i == 20 {
            (s.nvlinks_active, s.nvlinks_down) = (17, 1);
        }
        t.add("n0", batch(vec![s]), 0);
    }
    let (s, f) = t.summarise(&HealthRules::default(), &Windows::new());
    assert!(f.is_empty(), "{f:?}");
    assert_eq!(s[0].nvlink_down_samples, 1);

    let mut t = Telemetry::default();
    for i in 0..30u64 {
        let mut s = sample(1_000 + i * 1_000, 100.0, 0, vec![]);
        if (10..22).contains(&i) {
            (s.nvlinks_active, s.nvlinks_down) = (16, 2);
        }
        // An unread sample inside the stretch neither breaks nor extends it.
        if i == 15 {
            (s.nvlinks_active, s.nvlinks_down, s.nvlinks_unknown) = (10, 0, 8);
        }
        t.add("n0", batch(vec![s]), 0);
    }
    let (_, f) = t.summarise(&HealthRules::default(), &Windows::new());
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(
        (f[0].rule.as_str(), f[0].level.verdict()),
        ("nvlink", Verdict::Warn)
    );
    assert!(
        f[0].detail.contains("2 of 18") && f[0].detail.contains("11 consecutive"),
        "{}",
        f[0].detail
    );
}

#[test]
fn a_gpu_erring_far_beyond_its_peers_is_named_alone() {
    let mut t = Telemetry::default();
    for i in 0..61u64 {
        let samples = (0..4u32)
            .map(|g| {
                let mut s = sample(1_000 + i * 1_000, 100.0, 0, vec![]);
                s.index = g;
                s.uuid = format!("GPU-{g}");
                // Under DCGM's 100 a second, but 12 times its peers.
                let per_s = if g == 2 { 60 } else { 5 };
                s.nvlink_crc_data = i * per_s;
                s
            })
            .collect();
        t.add("n0", batch(samples), 0);
    }
    let (s, f) = t.summarise(&HealthRules::default(), &Windows::new());
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(
        (f[0].gpu_index, f[0].rule.as_str()),
        (Some(2), "nvlink_crc")
    );
    assert!(f[0].detail.contains("12.0x the median"), "{}", f[0].detail);
    assert_eq!(s[0].nvlink_crc_data_delta, 300);
}

/// Windows for some GPUs of some nodes, and one for a GPU with no series:
/// each series gets its own GPU's window, read beside the series in order.
#[test]
fn each_gpu_is_summarised_over_its_own_window() {
    let mut t = Telemetry::default();
    for node in ["n0", "n1", "n10", "n2"] {
        for i in 0..30u64 {
            let samples = (0..3)
                .map(|g| GpuSample {
                    unix_ms: 1_000 + i * 1_000,
                    ..gpu::healthy(g)
                })
                .collect();
            t.add(node, gpu::batch(node, "j", samples), 0);
        }
    }
    let mut w = Windows::new();
    // Seconds 11-30 (20 samples) for n0's GPU 1, 21-30 for n10's GPU 0 and
    // n2's GPU 2; n1 has one only for a GPU it has no series of.
    w.insert(("n0", 1), (11_000, 30_000));
    w.insert(("n1", 7), (1_000, 30_000));
    w.insert(("n10", 0), (21_000, 30_000));
    w.insert(("n2", 2), (21_000, 30_000));
    let (s, _) = t.summarise(&HealthRules::default(), &w);
    let measured: Vec<(&str, u32, u32)> = s
        .iter()
        .filter(|s| s.measured_samples > 0)
        .map(|s| (s.node.as_str(), s.index, s.measured_samples))
        .collect();
    assert_eq!(measured, [("n0", 1, 20), ("n10", 0, 10), ("n2", 2, 10)]);
    assert_eq!(s.len(), 12);
}

#[test]
fn idle_is_judged_over_the_measured_phase_alone() {
    let mut t = Telemetry::default();
    // 40 s of set-up at no load, then 20 s of work.
    for i in 0..60u64 {
        let util = if i < 40 { 0.0 } else { 100.0 };
        t.add(
            "n0",
            batch(vec![sample(1_000 + i * 1_000, util, 0, vec![])]),
            0,
        );
    }
    let mut w = Windows::new();
    w.insert(("n0", 1), (41_000, 60_000));
    let (s, f) = t.summarise(&HealthRules::default(), &w);
    assert!(f.is_empty(), "{f:?}");
    assert_eq!(s[0].measured_samples, 20);
    assert!(s[0].util_low_share > 0.6);
    w.insert(("n0", 1), (1_000, 60_000));
    let (_, f) = t.summarise(&HealthRules::default(), &w);
    assert_eq!(f[0].rule, "idle", "{f:?}");
}

#[test]
fn healthy_gpu_passes_with_stats() {
    let mut t = Telemetry::default();
    t.add("n0", batch(vec![sample(1_000, 100.0, 0, vec![])]), 0);
    t.add("n0", batch(vec![sample(2_000, 50.0, 0, vec![])]), 0);
    let (s, f) = t.summarise(&HealthRules::default(), &Windows::new());
    assert!(f.is_empty(), "{f:?}");
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].samples, 2);
    assert_eq!(s[0].util_mean, 75.0);
    assert_eq!(s[0].util_max, 100.0);
    assert_eq!(s[0].util_std, 25.0);
    assert_eq!(s[0].power_mean_w, 500.0);
    assert_eq!(s[0].verdict(), Verdict::Pass);
    assert_eq!(t.latest().len(), 1);
}

#[test]
fn ecc_and_critical_xids_fail_program_xids_warn() {
    let mut t = Telemetry::default();
    t.add("n0", batch(vec![sample(1_000, 100.0, 2, vec![])]), 0);
    t.add("n0", batch(vec![sample(2_000, 100.0, 5, vec![79, 13])]), 0);
    let (s, f) = t.summarise(&HealthRules::default(), &Windows::new());
    assert_eq!(s[0].ecc_uncorrected_delta, 3);
    assert_eq!(s[0].xids, vec![13, 79]);
    assert_eq!(s[0].verdict(), Verdict::Fail);
    let rules: Vec<(&str, Verdict)> = f
        .iter()
        .map(|x| (x.rule.as_str(), x.level.verdict()))
        .collect();
    assert_eq!(
        rules,
        vec![
            ("xid", Verdict::Fail),
            ("xid", Verdict::Warn),
            ("ecc_uncorrected", Verdict::Fail),
            ("ecc_uncorrected", Verdict::Warn),
        ]
    );
    assert_eq!(f[0].gpu_uuid, "GPU-1");
}

/// 15 minutes of 1 s samples on 4 × 8 GPUs: at most 300 buckets per GPU,
/// exact mean/max/std, counters from the first and last sample, all XIDs.
#[test]
fn long_runs_downsample_without_losing_the_summary() {
    let mut t = Telemetry::default();
    let mut raw: Vec<f64> = Vec::new();
    for sec in 0..900u64 {
        let mut samples = Vec::new();
        for gpu in 0..8 {
            let util = ((sec * 7 + gpu) % 101) as f64;
            let mut s = sample(1_000_000 + sec * 1_000, util, sec / 100, vec![]);
            s.index = gpu as u32;
            s.uuid = format!("GPU-{gpu}");
            s.pcie_replays = 1_000 + sec;
            if sec == 450 && gpu == 3 {
                s.xids = vec![31];
            }
            if gpu == 0 {
                raw.push(util);
            }
            samples.push(s);
        }
        for node in ["n0", "n1", "n2", "n3"] {
            t.add(node, batch(samples.clone()), 0);
        }
    }
    let stored = t.take_dirty();
    assert_eq!(stored.len(), 32);
    assert!(!t.is_dirty());
    let mut bytes = 0;
    for g in &stored {
        let buckets = GpuSeries::decode(g.bytes.as_slice()).unwrap().buckets.len();
        assert!(buckets <= MAX_BUCKETS, "{buckets}");
        assert!(buckets >= 200, "{buckets}");
        bytes += g.bytes.len();
    }
    assert!(
        bytes < 2 << 20,
        "4 x 8 GPUs x 15 min stored in {bytes} bytes"
    );

    // Summaries from the stored series equal the raw statistics.
    let back = Telemetry::from_stored(
        stored
            .iter()
            .map(|g| GpuSeries::decode(g.bytes.as_slice()).unwrap())
            .collect(),
    );
    let (s, f) = back.summarise(&HealthRules::default(), &Windows::new());
    assert_eq!(s.len(), 32);
    let g0 = s.iter().find(|x| x.node == "n2" && x.index == 0).unwrap();
    let mean = raw.iter().sum::<f64>() / raw.len() as f64;
    let std = (raw.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / raw.len() as f64).sqrt();
    assert_eq!(g0.samples, 900);
    assert!((g0.util_mean - mean).abs() < 1e-9);
    assert!((g0.util_std - std).abs() < 1e-6, "{} vs {std}", g0.util_std);
    assert_eq!(g0.util_max, 100.0);
    let low = raw.iter().filter(|x| **x < LOW_UTIL).count() as f64 / 900.0;
    assert!((g0.util_low_share - low).abs() < 1e-12);
    assert_eq!(g0.pcie_replays_delta, 899);
    assert_eq!(g0.ecc_uncorrected_delta, 8);
    let g3 = s.iter().find(|x| x.node == "n1" && x.index == 3).unwrap();
    assert_eq!(g3.xids, vec![31]);
    // 899 replays in 15 minutes is ~60/min: over the default 8/min.
    assert!(f.iter().any(|x| x.rule == "pcie_replay" && x.node == "n3"));
}

/// A bucket holds its counters' last set only where one moved, and
/// counts throttle bits only up to the highest seen under load (issue 51:
/// memory at 131,072 GPUs); what a summary reads of them is as before.
#[test]
fn buckets_keep_what_moved_and_read_as_before() {
    let mut g = GpuSeries::new("n0", 1, "GPU-1");
    let (mut power_capped, mut thermal) = (0, 0);
    for sec in 0..40u64 {
        let mut s = sample(1_000_000 + sec * 1_000, 99.0, 0, vec![]);
        s.sw_thermal_slowdown_ns = Some(0);
        // Counters move in the last ten seconds only.
        if sec >= 30 {
            s.ecc_corrected = sec - 29;
            s.sw_thermal_slowdown_ns = Some((sec - 29) * 1_000_000);
        }
        s.throttle_reasons = match sec % 4 {
            0 => 0x4,
            1 => 0x4 | 0x20,
            _ => 0,
        };
        // Idle samples' reasons are not counted.
        if sec % 10 == 9 {
            s.util_gpu = 5.0;
            s.throttle_reasons = 0x100;
        } else {
            power_capped += (s.throttle_reasons & 0x4 != 0) as u32;
            thermal += (s.throttle_reasons & 0x20 != 0) as u32;
        }
        g.add_within(&s, 1_000_000 + sec * 1_000, 4);
    }
    assert_eq!(g.buckets.len(), 3, "{}", g.bucket_ms);
    for b in &g.buckets {
        let moved = b.last_counters() != b.first_counters();
        assert_eq!(b.last.is_some(), moved, "{b:?}");
        assert!(b.throttle_loaded.len() <= 6, "{:?}", b.throttle_loaded);
    }
    assert!(g.buckets[0].last.is_none() && g.buckets[2].last.is_some());
    assert_eq!(g.buckets[0].slowdown_ns(|c| c.sw_thermal_ns), Some(0));

    let t = g.totals();
    assert_eq!(t.throttle_loaded.get(2), Some(&power_capped));
    assert_eq!(t.throttle_loaded.get(5), Some(&thermal));
    assert_eq!(t.throttle_loaded.get(8), None, "an idle sample's reason");
    assert_eq!(t.last_counters().unwrap().ecc_corrected, 10);
    assert_eq!(t.slowdown_ns(|c| c.sw_thermal_ns), Some(10_000_000));

    // Stored and read back, the summary is the same.
    let back = GpuSeries::decode(g.encode_to_vec().as_slice()).unwrap();
    assert_eq!(back, g);
    let (s, _) =
        Telemetry::from_stored(vec![back]).summarise(&HealthRules::default(), &Windows::new());
    assert_eq!(s[0].ecc_corrected_delta, 10);
    assert_eq!(s[0].sw_thermal_slowdown_s, Some(0.01));
}

#[test]
fn changed_series_are_taken_round_the_gpus() {
    let mut t = Telemetry::default();
    let second = |t: &mut Telemetry, sec: u64| {
        for node in ["n0", "n1", "n2"] {
            let samples = (0..4)
                .map(|gpu| {
                    let mut s = sample(1_000_000 + sec * 1_000, 50.0, 0, vec![]);
                    s.index = gpu;
                    s
                })
                .collect();
            t.add(node, batch(samples), 0);
        }
    };
    second(&mut t, 0);
    let key = |g: &Encoded| (g.node.clone(), g.index);
    let first: Vec<_> = t.take_dirty_some(5).iter().map(key).collect();
    assert_eq!(first.len(), 5);
    // Every GPU changes again; the next call goes on after the last one
    // taken instead of starting over.
    second(&mut t, 1);
    let next: Vec<_> = t.take_dirty_some(5).iter().map(key).collect();
    assert_eq!(next[0], ("n1".to_string(), 1), "{next:?}");
    let rest: Vec<_> = t.take_dirty_some(100).iter().map(key).collect();
    assert_eq!(rest.len(), 12 - 5, "wrapped round to the start: {rest:?}");
    assert!(rest.contains(&("n0".to_string(), 0)));
    assert!(!t.is_dirty());
}

/// A joined batch (the inbox joins a node's batches while the scheduler
/// is busy) holds several seconds of each GPU, new ones included.
#[test]
fn a_joined_batch_feeds_one_series_per_gpu() {
    let mut t = Telemetry::default();
    let mut samples = Vec::new();
    for sec in 0..3u64 {
        for gpu in [0u32, 1] {
            let mut s = sample(1_000 + sec * 1_000, 10.0 * (sec + 1) as f64, 0, vec![]);
            s.index = gpu;
            samples.push(s);
        }
    }
    assert_eq!(t.add("n0", batch(samples.clone()), 0), 6);
    assert_eq!(t.gpus(), 2);
    t.add("n0", batch(samples[..2].to_vec()), 0);
    let (s, _) = t.summarise(&HealthRules::default(), &Windows::new());
    let seen: Vec<(u32, u32)> = s.iter().map(|g| (g.index, g.samples)).collect();
    assert_eq!(seen, [(0, 4), (1, 4)]);
    assert_eq!(t.take_dirty().len(), 2);
    assert!(!t.is_dirty());
    t.add("n0", batch(samples[..1].to_vec()), 0);
    let again: Vec<u32> = t.take_dirty().iter().map(|g| g.index).collect();
    assert_eq!(again, [0], "only the GPU that changed");
}

/// A paced agent's batch holds several seconds of each GPU, and its parts
/// come one after the other: what `gpuctl watch` shows is each GPU's newest
/// sample, whichever batch brought it, and only that is kept.
#[test]
fn the_latest_is_each_gpus_newest_sample_across_batches() {
    let at = |gpu: u32, t: u64| GpuSample {
        unix_ms: t,
        ..gpu::healthy(gpu)
    };
    let mut t = Telemetry::default();
    // 8 s of GPUs 0 and 1, oldest first, in one batch.
    let held: Vec<GpuSample> = (1..=8u64)
        .flat_map(|s| [at(0, s * 1_000), at(1, s * 1_000)])
        .collect();
    t.add("n0", gpu::batch("n0", "j", held), 0);
    // The next part: GPU 2's newest, and a late sample of GPU 0.
    t.add(
        "n0",
        gpu::batch("n0", "j", vec![at(2, 8_000), at(0, 3_000)]),
        0,
    );
    let latest = t.latest();
    assert_eq!(latest.len(), 1);
    let mut kept: Vec<(u32, u64)> = latest[0]
        .samples
        .iter()
        .map(|s| (s.index, s.unix_ms))
        .collect();
    kept.sort();
    assert_eq!(kept, [(0, 8_000), (1, 8_000), (2, 8_000)]);
    assert_eq!(t.series().map(|s| s.totals().n).sum::<u32>(), 8 + 8 + 2);
}

/// What a job's judging lets go of first: the newest samples go, the
/// series (what the report and the store take) stay as they were.
#[test]
fn forgetting_the_newest_samples_keeps_every_series() {
    let mut t = Telemetry::default();
    for i in 0..20u64 {
        t.add(
            "n0",
            batch(vec![sample(1_000 + i * 1_000, 90.0, 0, vec![])]),
            0,
        );
    }
    let (series, stored) = (t.series().collect::<Vec<_>>(), t.stored_bytes("j"));
    assert_eq!(t.latest().len(), 1);
    t.forget_latest();
    assert!(t.latest().is_empty());
    assert_eq!(t.series().collect::<Vec<_>>(), series);
    assert_eq!(t.stored_bytes("j"), stored);
    assert!(t.is_dirty());
}

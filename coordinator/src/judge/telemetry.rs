//! GPU telemetry of a job while the coordinator holds it: the latest batch
//! per node (for `gpuctl watch`) and, per GPU, a downsampled [`GpuSeries`]
//! that is stored with the job and summarised into the report with health
//! findings ([`super::health`]).

use std::collections::BTreeMap;
use std::ops::Bound::{Excluded, Included, Unbounded};

use prost::Message;

use gpuctl_core::pb::{GpuTelemetrySummary, HealthFinding, TelemetryBatch, Verdict};

use super::health::{HealthRules, Level};
use super::series::{Bucket, Counters, GpuSeries};
use crate::store::keys;

/// A job's telemetry while the coordinator holds it.
#[derive(Debug, Default, Clone)]
pub struct Telemetry {
    latest: BTreeMap<String, TelemetryBatch>,
    series: BTreeMap<(String, u32), Slot>,
    /// How many series changed since they were last stored.
    dirty: usize,
    /// The last series `take_dirty_some` took.
    cursor: Option<(String, u32)>,
}

/// One GPU's series, and whether it changed since it was last stored.
#[derive(Debug, Clone)]
struct Slot {
    series: GpuSeries,
    dirty: bool,
}

impl Telemetry {
    /// Series read back from the store (a finished job, or after a restart).
    pub fn from_stored(series: Vec<GpuSeries>) -> Telemetry {
        Telemetry {
            series: series
                .into_iter()
                .map(|s| {
                    (
                        (s.node.clone(), s.index),
                        Slot {
                            series: s,
                            dirty: false,
                        },
                    )
                })
                .collect(),
            ..Default::default()
        }
    }

    /// Adds a batch from `node`; returns how many samples it held.
    ///
    /// Runs on the scheduler's task for every node every second (32,768
    /// GPUs at 4,096 nodes): the node's series are found once per batch,
    /// where a lookup, a key and a mark per sample took an eighth of the
    /// coordinator's CPU.
    pub fn add(&mut self, node: &str, batch: TelemetryBatch, now_ms: u64) -> usize {
        // The job's GPUs so far share the per-job budget.
        let max = super::series::buckets_per_gpu(self.series.len().max(batch.samples.len()));
        let first = (node.to_string(), 0);
        let last = (first.0.clone(), u32::MAX);
        let mut fresh = Vec::new();
        {
            let mut mine: Vec<&mut Slot> = self
                .series
                .range_mut(first..=last)
                .map(|(_, slot)| slot)
                .collect();
            for s in &batch.samples {
                let at = if s.unix_ms > 0 { s.unix_ms } else { now_ms };
                match mine.iter_mut().find(|slot| slot.series.index == s.index) {
                    Some(slot) => {
                        let g = &mut slot.series;
                        if g.uuid.is_empty() {
                            g.uuid = s.uuid.clone();
                        }
                        g.add_within(s, at, max);
                        if !slot.dirty {
                            slot.dirty = true;
                            self.dirty += 1;
                        }
                    }
                    // A joined batch holds several seconds of a GPU.
                    None => match fresh
                        .iter_mut()
                        .find(|g: &&mut GpuSeries| g.index == s.index)
                    {
                        Some(g) => g.add_within(s, at, max),
                        None => {
                            let mut g = GpuSeries::new(node, s.index, &s.uuid);
                            g.add_within(s, at, max);
                            fresh.push(g);
                        }
                    },
                }
            }
        }
        self.dirty += fresh.len();
        for g in fresh {
            let slot = Slot {
                series: g,
                dirty: true,
            };
            self.series
                .insert((node.to_string(), slot.series.index), slot);
        }
        let n = batch.samples.len();
        match self.latest.get_mut(node) {
            Some(kept) => *kept = batch,
            None => {
                self.latest.insert(node.to_string(), batch);
            }
        }
        n
    }

    /// The latest batch of every node.
    pub fn latest(&self) -> Vec<TelemetryBatch> {
        self.latest.values().cloned().collect()
    }

    /// The series changed since they were last taken, by value: a job's
    /// last write frees each series once it is encoded (32,768 GPUs' are
    /// ~60 MB), not after all of them are.
    pub fn into_dirty(self) -> impl Iterator<Item = GpuSeries> {
        self.series
            .into_values()
            .filter(|slot| slot.dirty)
            .map(|slot| slot.series)
    }

    /// Series changed since the last call, to be stored; marks them clean.
    pub fn take_dirty(&mut self) -> Vec<GpuSeries> {
        self.take_dirty_some(usize::MAX)
    }

    /// At most `max` of the changed series, taken round the GPUs in key
    /// order from where the last call stopped, so that writing a job's
    /// telemetry can be spread over several calls without starving any GPU.
    pub fn take_dirty_some(&mut self, max: usize) -> Vec<GpuSeries> {
        let bounds = |c: &Option<(String, u32)>| match c {
            Some(c) => (
                (Excluded(c.clone()), Unbounded),
                (Unbounded, Included(c.clone())),
            ),
            None => ((Unbounded, Unbounded), (Unbounded, Unbounded)),
        };
        let (after, before) = bounds(&self.cursor);
        let wrap = self.cursor.is_some();
        let mut out = Vec::new();
        let mut last = None;
        let mut take = |range: std::collections::btree_map::RangeMut<'_, (String, u32), Slot>,
                        out: &mut Vec<GpuSeries>| {
            for (key, slot) in range {
                if out.len() >= max {
                    return;
                }
                if slot.dirty {
                    slot.dirty = false;
                    out.push(slot.series.clone());
                    last = Some(key.clone());
                }
            }
        };
        take(self.series.range_mut(after), &mut out);
        if out.len() < max && wrap {
            take(self.series.range_mut(before), &mut out);
        }
        self.dirty -= out.len();
        if last.is_some() {
            self.cursor = last;
        }
        out
    }

    /// How many GPUs have a series.
    pub fn gpus(&self) -> usize {
        self.series.len()
    }

    /// What the series take in the store, keys included.
    pub fn stored_bytes(&self, job: &str) -> u64 {
        self.series().map(|s| stored_len(job, s)).sum()
    }

    pub fn is_dirty(&self) -> bool {
        self.dirty > 0
    }

    pub fn series(&self) -> impl Iterator<Item = &GpuSeries> {
        self.series.values().map(|slot| &slot.series)
    }

    /// One summary per GPU and the health findings, GPU by GPU. `windows`:
    /// when each GPU's rank ran its measured phase, which `idle` judges.
    pub fn summarise(
        &self,
        rules: &HealthRules,
        windows: &Windows,
    ) -> (Vec<GpuTelemetrySummary>, Vec<HealthFinding>) {
        let mut summaries = Vec::new();
        let mut per_gpu = Vec::new();
        let mut rates = Vec::new();
        for g in self.series() {
            let t = g.totals();
            let measured = windows
                .get(&(g.node.clone(), g.index))
                .map(|&(from, to)| g.totals_within(from, to));
            let (s, mine) = summary(g, &t, measured.as_ref(), rules);
            rates.push((t.nvlinks_expected > 0).then(|| crc_per_min(&t)));
            summaries.push(s);
            per_gpu.push(mine);
        }
        peer_crc(rules, &summaries, &rates, &mut per_gpu);
        let mut findings = Vec::new();
        for (s, mine) in summaries.iter_mut().zip(per_gpu) {
            s.verdict = mine
                .iter()
                .map(HealthFinding::verdict)
                .max_by_key(|v| severity(*v))
                .unwrap_or(Verdict::Pass) as i32;
            findings.extend(mine);
        }
        (summaries, findings)
    }
}

/// When each GPU's rank ran its measured phase: (node, NVML index) → (from,
/// to) in unix ms.
pub type Windows = BTreeMap<(String, u32), (u64, u64)>;

/// NVLink CRC errors a minute over the run (at least a minute, as the rules).
fn crc_per_min(t: &Bucket) -> f64 {
    let first = t.first.clone().unwrap_or_default();
    let last = t.last.clone().unwrap_or_default();
    super::health::nvlink_crc(&first, &last) as f64 / super::health::rate_minutes(t)
}

/// `nvlink_crc` for a GPU far above its peers: its rate against the median
/// of the job's other NVLink GPUs. Needs three GPUs to have a median of
/// peers worth the name; a GPU the absolute rule already named is left alone.
fn peer_crc(
    rules: &HealthRules,
    summaries: &[GpuTelemetrySummary],
    rates: &[Option<f64>],
    per_gpu: &mut [Vec<HealthFinding>],
) {
    if rules.nvlink_crc == Level::Off || rates.iter().flatten().count() < 3 {
        return;
    }
    for (i, rate) in rates.iter().enumerate() {
        let Some(rate) = *rate else { continue };
        if rate <= rules.nvlink_crc_peer_min_per_min
            || per_gpu[i].iter().any(|f| f.rule == "nvlink_crc")
        {
            continue;
        }
        let others: Vec<f64> = rates
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .filter_map(|(_, r)| *r)
            .collect();
        let Some(median) = gpuctl_core::stats::median(others) else {
            continue;
        };
        if rate >= rules.nvlink_crc_peer_ratio * median {
            let s = &summaries[i];
            per_gpu[i].push(HealthFinding {
                node: s.node.clone(),
                gpu_index: s.index,
                uuid: s.uuid.clone(),
                verdict: match rules.nvlink_crc {
                    Level::Fail => Verdict::Fail,
                    _ => Verdict::Warn,
                } as i32,
                rule: "nvlink_crc".into(),
                detail: format!(
                    "{rate:.0} NVLink CRC errors a minute, {:.1}x the median of the job's other NVLink GPUs ({median:.0}/min; rule: {}x): one GPU's links erring far beyond its peers; check them with `nvidia-smi nvlink -e`",
                    rate / median.max(f64::MIN_POSITIVE),
                    rules.nvlink_crc_peer_ratio
                ),
            });
        }
    }
}

fn summary(
    g: &GpuSeries,
    t: &Bucket,
    measured: Option<&Bucket>,
    rules: &HealthRules,
) -> (GpuTelemetrySummary, Vec<HealthFinding>) {
    let n = t.n.max(1) as f64;
    let mean = |sum: f64| sum / n;
    let std = |sum: f64, sq: f64| (sq / n - (sum / n).powi(2)).max(0.0).sqrt();
    let first = t.first.clone().unwrap_or_default();
    let last = t.last.clone().unwrap_or_default();
    let delta = |f: fn(&Counters) -> u64| f(&last).saturating_sub(f(&first));
    let seconds = |f| t.slowdown_ns(f).map(|ns| ns as f64 / 1e9);
    let s = GpuTelemetrySummary {
        node: g.node.clone(),
        index: g.index,
        uuid: g.uuid.clone(),
        samples: t.n,
        util_mean: mean(t.util_sum),
        util_max: t.util_max,
        util_std: std(t.util_sum, t.util_sq),
        util_low_share: t.util_low as f64 / n,
        mem_used_max_bytes: t.mem_used_max,
        temp_mean: mean(t.temp_sum),
        temp_max: t.temp_max,
        temp_std: std(t.temp_sum, t.temp_sq),
        power_mean_w: mean(t.power_sum),
        power_max_w: t.power_max,
        power_std_w: std(t.power_sum, t.power_sq),
        sm_clock_mean_mhz: mean(t.sm_clock_sum),
        ecc_corrected_delta: delta(|c| c.ecc_corrected),
        ecc_uncorrected_delta: delta(|c| c.ecc_uncorrected),
        pcie_replays_delta: delta(|c| c.pcie_replays),
        nvlink_crc_delta: super::health::nvlink_crc(&first, &last),
        xids: t.xids.clone(),
        verdict: Verdict::Pass as i32,
        nvlink_crc_flit_delta: delta(|c| c.nvlink_crc_flit),
        nvlink_crc_data_delta: delta(|c| c.nvlink_crc_data),
        nvlink_replay_delta: delta(|c| c.nvlink_replay),
        nvlink_recovery_delta: delta(|c| c.nvlink_recovery),
        nvlink_down_samples: t.nvlink_down_n,
        sw_thermal_slowdown_s: seconds(|c| c.sw_thermal_ns),
        hw_thermal_slowdown_s: seconds(|c| c.hw_thermal_ns),
        power_brake_slowdown_s: seconds(|c| c.power_brake_ns),
        measured_samples: measured.map_or(0, |m| m.n),
        measured_util_low_share: measured
            .filter(|m| m.n > 0)
            .map_or(0.0, |m| m.util_low as f64 / m.n as f64),
    };
    let findings = rules
        .evaluate_in(t, measured)
        .into_iter()
        .map(|f| HealthFinding {
            node: g.node.clone(),
            gpu_index: g.index,
            uuid: g.uuid.clone(),
            verdict: match f.level {
                Level::Fail => Verdict::Fail,
                _ => Verdict::Warn,
            } as i32,
            rule: f.rule.into(),
            detail: f.detail,
        })
        .collect();
    (s, findings)
}

/// A series' key and value in the store.
fn stored_len(job: &str, s: &GpuSeries) -> u64 {
    (keys::telemetry(job, &s.node, s.index).len() + s.encoded_len()) as u64
}

fn severity(v: Verdict) -> u8 {
    match v {
        Verdict::Fail => 3,
        Verdict::Warn => 2,
        Verdict::Incomplete => 1,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::series::{LOW_UTIL, MAX_BUCKETS};
    use gpuctl_core::pb::GpuSample;
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
            (f[0].rule.as_str(), f[0].verdict()),
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
        assert_eq!((f[0].gpu_index, f[0].rule.as_str()), (2, "nvlink_crc"));
        assert!(f[0].detail.contains("12.0x the median"), "{}", f[0].detail);
        assert_eq!(s[0].nvlink_crc_data_delta, 300);
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
        w.insert(("n0".into(), 1), (41_000, 60_000));
        let (s, f) = t.summarise(&HealthRules::default(), &w);
        assert!(f.is_empty(), "{f:?}");
        assert_eq!(s[0].measured_samples, 20);
        assert!(s[0].util_low_share > 0.6);
        w.insert(("n0".into(), 1), (1_000, 60_000));
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
        let rules: Vec<(&str, Verdict)> =
            f.iter().map(|x| (x.rule.as_str(), x.verdict())).collect();
        assert_eq!(
            rules,
            vec![
                ("xid", Verdict::Fail),
                ("xid", Verdict::Warn),
                ("ecc_uncorrected", Verdict::Fail),
                ("ecc_uncorrected", Verdict::Warn),
            ]
        );
        assert_eq!(f[0].uuid, "GPU-1");
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
            assert!(g.buckets.len() <= MAX_BUCKETS, "{}", g.buckets.len());
            assert!(g.buckets.len() >= 200, "{}", g.buckets.len());
            bytes += g.encode_to_vec().len();
        }
        assert!(
            bytes < 2 << 20,
            "4 x 8 GPUs x 15 min stored in {bytes} bytes"
        );

        // Summaries from the stored series equal the raw statistics.
        let back = Telemetry::from_stored(
            stored
                .iter()
                .map(|g| GpuSeries::decode(g.encode_to_vec().as_slice()).unwrap())
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
        let key = |g: &GpuSeries| (g.node.clone(), g.index);
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
}

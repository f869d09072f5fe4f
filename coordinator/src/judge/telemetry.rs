//! GPU telemetry of a job: the latest batch per node (for `gpuctl watch`) and,
//! per GPU, a downsampled series that is stored with the job and summarised
//! into the report with health findings ([`super::health`]).
//!
//! Samples arrive about once a second per GPU. Each GPU's series is a list of
//! time buckets holding sums, squares, maxima, the first and last counters and
//! the union of XIDs, so merging two buckets loses nothing the summary needs:
//! mean, max and std of the gauges are exact whatever the bucket width. Buckets
//! start one second wide; when a series passes [`MAX_BUCKETS`] neighbours are
//! merged pairwise and the width doubles, so a 15-minute run stays at 225
//! buckets per GPU (~30 KB) and any run stays under 300.

use std::collections::{BTreeMap, BTreeSet};

use gpuctl_proto::pb::{GpuSample, GpuTelemetrySummary, HealthFinding, TelemetryBatch, Verdict};

use super::health::{HealthRules, Level};

/// Most buckets per GPU per job.
pub const MAX_BUCKETS: usize = 300;
/// Width of a fresh series' buckets: the agents' default sample interval.
const BASE_BUCKET_MS: u64 = 1_000;
/// Utilisation under this counts toward `util_low_share` (the proto's "under 10 %").
pub const LOW_UTIL: f64 = 10.0;
/// A sample at or above this utilisation is "loaded": PCIe links may train down
/// and clocks drop at idle by design, so link and slowdown rules look only at
/// loaded samples.
pub const LOADED_UTIL: f64 = 50.0;
/// Throttle-reason bits counted per bucket (NVML defines bits 0..=8).
const THROTTLE_BITS: usize = 16;

/// Counters whose growth over the run matters.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Counters {
    #[prost(uint64, tag = "1")]
    pub ecc_corrected: u64,
    #[prost(uint64, tag = "2")]
    pub ecc_uncorrected: u64,
    #[prost(uint64, tag = "3")]
    pub retired_pages: u64,
    #[prost(uint64, tag = "4")]
    pub pcie_replays: u64,
    #[prost(uint64, tag = "5")]
    pub nvlink_crc_errors: u64,
}

/// One time bucket of one GPU. Coordinator-private (stored under
/// `telemetry/...`, read by no other process), hence a prost derive here rather
/// than a message in the shared `.proto`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Bucket {
    #[prost(uint64, tag = "1")]
    pub start_ms: u64,
    #[prost(uint64, tag = "2")]
    pub end_ms: u64,
    #[prost(uint32, tag = "3")]
    pub n: u32,
    #[prost(double, tag = "4")]
    pub util_sum: f64,
    #[prost(double, tag = "5")]
    pub util_sq: f64,
    #[prost(double, tag = "6")]
    pub util_max: f64,
    #[prost(uint32, tag = "7")]
    pub util_low: u32,
    #[prost(double, tag = "8")]
    pub mem_util_sum: f64,
    #[prost(uint64, tag = "9")]
    pub mem_used_max: u64,
    #[prost(uint64, tag = "10")]
    pub mem_total: u64,
    #[prost(double, tag = "11")]
    pub temp_sum: f64,
    #[prost(double, tag = "12")]
    pub temp_sq: f64,
    #[prost(double, tag = "13")]
    pub temp_max: f64,
    #[prost(double, tag = "14")]
    pub power_sum: f64,
    #[prost(double, tag = "15")]
    pub power_sq: f64,
    #[prost(double, tag = "16")]
    pub power_max: f64,
    #[prost(double, tag = "17")]
    pub power_limit: f64,
    #[prost(double, tag = "18")]
    pub sm_clock_sum: f64,
    #[prost(double, tag = "19")]
    pub mem_clock_sum: f64,
    /// Every throttle reason seen (OR).
    #[prost(uint64, tag = "20")]
    pub throttle_any: u64,
    /// Loaded samples, and per throttle bit how many of them had it set.
    #[prost(uint32, tag = "21")]
    pub loaded: u32,
    #[prost(uint32, repeated, tag = "22")]
    pub throttle_loaded: Vec<u32>,
    /// Worst link seen under load (0 = none loaded) and the GPU's maximum.
    #[prost(uint32, tag = "23")]
    pub pcie_gen_loaded_min: u32,
    #[prost(uint32, tag = "24")]
    pub pcie_width_loaded_min: u32,
    #[prost(uint32, tag = "25")]
    pub pcie_gen_max: u32,
    #[prost(uint32, tag = "26")]
    pub pcie_width_max: u32,
    #[prost(uint32, tag = "27")]
    pub pcie_gen_low_loaded: u32,
    #[prost(uint32, tag = "28")]
    pub pcie_width_low_loaded: u32,
    #[prost(uint32, tag = "29")]
    pub nvlinks_min: u32,
    #[prost(uint32, tag = "30")]
    pub nvlinks_expected: u32,
    #[prost(bool, tag = "31")]
    pub remap_failed: bool,
    #[prost(message, optional, tag = "32")]
    pub first: Option<Counters>,
    #[prost(message, optional, tag = "33")]
    pub last: Option<Counters>,
    /// Sorted, without repeats.
    #[prost(uint32, repeated, tag = "34")]
    pub xids: Vec<u32>,
}

/// One GPU's series over one job, as stored under `telemetry/{job}/{node}/{gpu:03}`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GpuSeries {
    #[prost(string, tag = "1")]
    pub node: String,
    #[prost(uint32, tag = "2")]
    pub index: u32,
    #[prost(string, tag = "3")]
    pub uuid: String,
    #[prost(uint64, tag = "4")]
    pub bucket_ms: u64,
    #[prost(message, repeated, tag = "5")]
    pub buckets: Vec<Bucket>,
}

fn counters(s: &GpuSample) -> Counters {
    Counters {
        ecc_corrected: s.ecc_corrected,
        ecc_uncorrected: s.ecc_uncorrected,
        retired_pages: s.retired_pages,
        pcie_replays: s.pcie_replays,
        nvlink_crc_errors: s.nvlink_crc_errors,
    }
}

fn min_nonzero(a: u32, b: u32) -> u32 {
    match (a, b) {
        (0, x) | (x, 0) => x,
        (a, b) => a.min(b),
    }
}

impl Bucket {
    pub fn of(s: &GpuSample, t: u64) -> Bucket {
        let loaded = s.util_gpu >= LOADED_UTIL;
        let mut throttle_loaded = vec![0; THROTTLE_BITS];
        if loaded {
            for (bit, n) in throttle_loaded.iter_mut().enumerate() {
                *n = ((s.throttle_reasons >> bit) & 1) as u32;
            }
        }
        let c = counters(s);
        let mut xids = s.xids.clone();
        xids.sort_unstable();
        xids.dedup();
        Bucket {
            start_ms: t,
            end_ms: t,
            n: 1,
            util_sum: s.util_gpu,
            util_sq: s.util_gpu * s.util_gpu,
            util_max: s.util_gpu,
            util_low: (s.util_gpu < LOW_UTIL) as u32,
            mem_util_sum: s.util_mem,
            mem_used_max: s.mem_used_bytes,
            mem_total: s.mem_total_bytes,
            temp_sum: s.temperature_c,
            temp_sq: s.temperature_c * s.temperature_c,
            temp_max: s.temperature_c,
            power_sum: s.power_w,
            power_sq: s.power_w * s.power_w,
            power_max: s.power_w,
            power_limit: s.power_limit_w,
            sm_clock_sum: s.sm_clock_mhz as f64,
            mem_clock_sum: s.mem_clock_mhz as f64,
            throttle_any: s.throttle_reasons,
            loaded: loaded as u32,
            throttle_loaded,
            pcie_gen_loaded_min: if loaded { s.pcie_gen } else { 0 },
            pcie_width_loaded_min: if loaded { s.pcie_width } else { 0 },
            pcie_gen_max: s.pcie_gen_max,
            pcie_width_max: s.pcie_width_max,
            // 0 means NVML could not read the link: unknown, not degraded.
            pcie_gen_low_loaded: (loaded && s.pcie_gen > 0 && s.pcie_gen < s.pcie_gen_max) as u32,
            pcie_width_low_loaded: (loaded && s.pcie_width > 0 && s.pcie_width < s.pcie_width_max)
                as u32,
            nvlinks_min: s.nvlinks_active,
            nvlinks_expected: s.nvlinks_expected,
            remap_failed: s.remap_failed,
            first: Some(c.clone()),
            last: Some(c),
            xids,
        }
    }

    /// Folds a later bucket into this one.
    pub fn merge(&mut self, b: &Bucket) {
        if b.n == 0 {
            return;
        }
        if self.n == 0 {
            *self = b.clone();
            return;
        }
        self.start_ms = self.start_ms.min(b.start_ms);
        self.end_ms = self.end_ms.max(b.end_ms);
        self.n += b.n;
        self.util_sum += b.util_sum;
        self.util_sq += b.util_sq;
        self.util_max = self.util_max.max(b.util_max);
        self.util_low += b.util_low;
        self.mem_util_sum += b.mem_util_sum;
        self.mem_used_max = self.mem_used_max.max(b.mem_used_max);
        self.mem_total = self.mem_total.max(b.mem_total);
        self.temp_sum += b.temp_sum;
        self.temp_sq += b.temp_sq;
        self.temp_max = self.temp_max.max(b.temp_max);
        self.power_sum += b.power_sum;
        self.power_sq += b.power_sq;
        self.power_max = self.power_max.max(b.power_max);
        self.power_limit = b.power_limit;
        self.sm_clock_sum += b.sm_clock_sum;
        self.mem_clock_sum += b.mem_clock_sum;
        self.throttle_any |= b.throttle_any;
        self.loaded += b.loaded;
        self.throttle_loaded.resize(THROTTLE_BITS, 0);
        for (n, m) in self.throttle_loaded.iter_mut().zip(&b.throttle_loaded) {
            *n += m;
        }
        self.pcie_gen_loaded_min = min_nonzero(self.pcie_gen_loaded_min, b.pcie_gen_loaded_min);
        self.pcie_width_loaded_min =
            min_nonzero(self.pcie_width_loaded_min, b.pcie_width_loaded_min);
        self.pcie_gen_max = self.pcie_gen_max.max(b.pcie_gen_max);
        self.pcie_width_max = self.pcie_width_max.max(b.pcie_width_max);
        self.pcie_gen_low_loaded += b.pcie_gen_low_loaded;
        self.pcie_width_low_loaded += b.pcie_width_low_loaded;
        // An agent that cannot read NVLink sends 0 expected: keep what is known.
        if b.nvlinks_expected > 0 {
            self.nvlinks_min = if self.nvlinks_expected > 0 {
                self.nvlinks_min.min(b.nvlinks_min)
            } else {
                b.nvlinks_min
            };
            self.nvlinks_expected = self.nvlinks_expected.max(b.nvlinks_expected);
        }
        self.remap_failed |= b.remap_failed;
        if self.first.is_none() {
            self.first = b.first.clone();
        }
        if b.last.is_some() {
            self.last = b.last.clone();
        }
        let mut xids: BTreeSet<u32> = self.xids.iter().copied().collect();
        xids.extend(b.xids.iter().copied());
        self.xids = xids.into_iter().collect();
    }
}

impl GpuSeries {
    fn add(&mut self, s: &GpuSample, t: u64) {
        let b = Bucket::of(s, t);
        let origin = self.buckets.first().map_or(t, |f| f.start_ms);
        let slot = |ms: u64, width: u64| ms.saturating_sub(origin) / width.max(1);
        match self.buckets.last_mut() {
            // Late or same-slot samples join the newest bucket.
            Some(last)
                if t <= last.start_ms
                    || slot(t, self.bucket_ms) == slot(last.start_ms, self.bucket_ms) =>
            {
                last.merge(&b)
            }
            _ => self.buckets.push(b),
        }
        while self.buckets.len() > MAX_BUCKETS {
            self.bucket_ms *= 2;
            let width = self.bucket_ms;
            let mut merged: Vec<Bucket> = Vec::with_capacity(self.buckets.len() / 2 + 1);
            for b in self.buckets.drain(..) {
                match merged.last_mut() {
                    Some(m) if slot(m.start_ms, width) == slot(b.start_ms, width) => m.merge(&b),
                    _ => merged.push(b),
                }
            }
            self.buckets = merged;
        }
    }

    /// The whole run in one bucket.
    pub fn totals(&self) -> Bucket {
        let mut t = Bucket::default();
        for b in &self.buckets {
            t.merge(b);
        }
        t
    }
}

/// A job's telemetry while the coordinator holds it.
#[derive(Debug, Default, Clone)]
pub struct Telemetry {
    latest: BTreeMap<String, TelemetryBatch>,
    series: BTreeMap<(String, u32), GpuSeries>,
    /// Series changed since they were last stored.
    dirty: BTreeSet<(String, u32)>,
}

impl Telemetry {
    /// Series read back from the store (a finished job, or after a restart).
    pub fn from_stored(series: Vec<GpuSeries>) -> Telemetry {
        Telemetry {
            series: series
                .into_iter()
                .map(|s| ((s.node.clone(), s.index), s))
                .collect(),
            ..Default::default()
        }
    }

    /// Adds a batch from `node`; returns how many samples it held.
    pub fn add(&mut self, node: &str, batch: TelemetryBatch, now_ms: u64) -> usize {
        for s in &batch.samples {
            let key = (node.to_string(), s.index);
            let g = self.series.entry(key.clone()).or_insert_with(|| GpuSeries {
                node: node.to_string(),
                index: s.index,
                uuid: s.uuid.clone(),
                bucket_ms: BASE_BUCKET_MS,
                buckets: Vec::new(),
            });
            if g.uuid.is_empty() {
                g.uuid = s.uuid.clone();
            }
            g.add(s, if s.unix_ms > 0 { s.unix_ms } else { now_ms });
            self.dirty.insert(key);
        }
        let n = batch.samples.len();
        self.latest.insert(node.to_string(), batch);
        n
    }

    /// The latest batch of every node.
    pub fn latest(&self) -> Vec<TelemetryBatch> {
        self.latest.values().cloned().collect()
    }

    /// Series changed since the last call, to be stored; marks them clean.
    pub fn take_dirty(&mut self) -> Vec<GpuSeries> {
        let dirty = std::mem::take(&mut self.dirty);
        dirty
            .iter()
            .filter_map(|k| self.series.get(k).cloned())
            .collect()
    }

    pub fn is_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// Drops the series (they are stored); keeps the latest samples for `watch`.
    pub fn forget_series(&mut self) {
        self.series.clear();
        self.dirty.clear();
    }

    pub fn series(&self) -> impl Iterator<Item = &GpuSeries> {
        self.series.values()
    }

    /// One summary per GPU and the health findings, GPU by GPU.
    pub fn summarise(&self, rules: &HealthRules) -> (Vec<GpuTelemetrySummary>, Vec<HealthFinding>) {
        let mut summaries = Vec::new();
        let mut findings = Vec::new();
        for g in self.series.values() {
            let t = g.totals();
            let (mut s, mine) = summary(g, &t, rules);
            s.verdict = mine
                .iter()
                .map(HealthFinding::verdict)
                .max_by_key(|v| severity(*v))
                .unwrap_or(Verdict::Pass) as i32;
            summaries.push(s);
            findings.extend(mine);
        }
        (summaries, findings)
    }
}

fn summary(
    g: &GpuSeries,
    t: &Bucket,
    rules: &HealthRules,
) -> (GpuTelemetrySummary, Vec<HealthFinding>) {
    let n = t.n.max(1) as f64;
    let mean = |sum: f64| sum / n;
    let std = |sum: f64, sq: f64| (sq / n - (sum / n).powi(2)).max(0.0).sqrt();
    let first = t.first.clone().unwrap_or_default();
    let last = t.last.clone().unwrap_or_default();
    let delta = |f: fn(&Counters) -> u64| f(&last).saturating_sub(f(&first));
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
        nvlink_crc_delta: delta(|c| c.nvlink_crc_errors),
        xids: t.xids.clone(),
        verdict: Verdict::Pass as i32,
    };
    let findings = rules
        .evaluate(t)
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
    use prost::Message;

    fn sample(t: u64, util: f64, ecc_u: u64, xids: Vec<u32>) -> GpuSample {
        GpuSample {
            index: 1,
            uuid: "GPU-1".into(),
            unix_ms: t,
            util_gpu: util,
            temperature_c: 60.0,
            power_w: 500.0,
            ecc_uncorrected: ecc_u,
            pcie_gen: 5,
            pcie_width: 16,
            pcie_gen_max: 5,
            pcie_width_max: 16,
            nvlinks_active: 18,
            nvlinks_expected: 18,
            xids,
            ..Default::default()
        }
    }

    fn batch(samples: Vec<GpuSample>) -> TelemetryBatch {
        TelemetryBatch {
            node: "n0".into(),
            job_id: "j".into(),
            attempt: 1,
            samples,
        }
    }

    #[test]
    fn healthy_gpu_passes_with_stats() {
        let mut t = Telemetry::default();
        t.add("n0", batch(vec![sample(1_000, 100.0, 0, vec![])]), 0);
        t.add("n0", batch(vec![sample(2_000, 50.0, 0, vec![])]), 0);
        let (s, f) = t.summarise(&HealthRules::default());
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
        let (s, f) = t.summarise(&HealthRules::default());
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
        let (s, f) = back.summarise(&HealthRules::default());
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
}

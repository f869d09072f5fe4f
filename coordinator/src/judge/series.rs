//! One GPU's telemetry over one job as the coordinator keeps and stores it:
//! a list of time buckets holding sums, squares, maxima, the first and last
//! counters and the union of XIDs, so merging two buckets loses nothing a
//! summary needs: mean, max and std of the gauges are exact whatever the
//! bucket width. Samples arrive about once a second per GPU; buckets start one
//! second wide, and when a series passes [`MAX_BUCKETS`] neighbours are merged
//! pairwise and the width doubles, so a 15-minute run stays at 225 buckets per
//! GPU (~60 KB) and any run stays under 300. A job's GPUs share one budget of
//! [`JOB_BUCKETS`]: past 655 GPUs each series keeps fewer, wider buckets, so a
//! 15-minute job on 4,096 nodes × 8 GPUs stores ~55 MB of telemetry, not 2 GB.
//!
//! Plain data: the health rules ([`super::checks::health`]) read these types, and the
//! store writes them, without this module knowing either.

use std::collections::BTreeSet;

use gpuctl_proto::pb::{GpuSample, GpuTimeline, TelemetryPoint};

/// Most buckets per GPU per job.
pub const MAX_BUCKETS: usize = 300;
/// Buckets of one job, all its GPUs together: about 55 MB stored (a bucket
/// encodes to about 280 bytes), however many GPUs the job has.
pub const JOB_BUCKETS: usize = 196_608;
/// ...but never fewer than this per GPU (a 15-minute job: 2.5-minute buckets).
pub const MIN_BUCKETS: usize = 6;

/// The bucket limit of each GPU's series in a job of `gpus` GPUs: 300 up to
/// 655 GPUs, then shrinking so that the job stays within [`JOB_BUCKETS`].
pub fn buckets_per_gpu(gpus: usize) -> usize {
    (JOB_BUCKETS / gpus.max(1)).clamp(MIN_BUCKETS, MAX_BUCKETS)
}

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
/// A loaded GPU whose SM clock is under this share of its maximum is slow.
pub const CLOCK_LOW_RATIO: f64 = 0.9;
/// Throttle reasons that explain a low clock: application clocks (0x2), the
/// power cap a GPU at full load sits on by design (0x4), sync boost (0x10),
/// and the slowdowns other rules judge (0x8, 0x20, 0x40, 0x80). Only GPU
/// idle (0x1) and nothing at all leave a low clock unexplained.
const CLOCK_REASONS: u64 = 0x2 | 0x4 | 0x8 | 0x10 | 0x20 | 0x40 | 0x80;

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
    /// NVLink counters as the agent sums them, link by link (GpuSample).
    #[prost(uint64, tag = "6")]
    pub nvlink_crc_flit: u64,
    #[prost(uint64, tag = "7")]
    pub nvlink_crc_data: u64,
    #[prost(uint64, tag = "8")]
    pub nvlink_replay: u64,
    #[prost(uint64, tag = "9")]
    pub nvlink_recovery: u64,
    /// NVML's clock-event counters, ns (GpuSample); `None` where unread.
    #[prost(uint64, optional, tag = "10")]
    pub sw_thermal_ns: Option<u64>,
    #[prost(uint64, optional, tag = "11")]
    pub hw_thermal_ns: Option<u64>,
    #[prost(uint64, optional, tag = "12")]
    pub power_brake_ns: Option<u64>,
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
    /// Loaded samples, and per throttle bit how many of them had it set, up
    /// to the highest bit any of them had (a bit past the end: none). A
    /// job holds six buckets a GPU at the least (786,432 at 131,072 GPUs):
    /// sixteen counts allocated for each, set or not, were ~50 MB.
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
    /// The counters of the first and the last sample, boxed, and `last`
    /// `None` while it equals `first` (read them by
    /// [`Bucket::first_counters`], [`Bucket::last_counters`]): in most
    /// buckets no counter moves, and two sets held in place were 256 of a
    /// bucket's ~600 bytes in memory.
    #[prost(message, optional, boxed, tag = "32")]
    pub first: Option<Box<Counters>>,
    #[prost(message, optional, boxed, tag = "33")]
    pub last: Option<Box<Counters>>,
    /// Sorted, without repeats.
    #[prost(uint32, repeated, tag = "34")]
    pub xids: Vec<u32>,
    /// The GPU's maximum SM clock, and the loaded samples whose clock was under
    /// [`CLOCK_LOW_RATIO`] of it with no throttle reason to explain it.
    #[prost(uint32, tag = "35")]
    pub sm_clock_max: u32,
    #[prost(uint32, tag = "36")]
    pub clock_low_loaded: u32,
    /// NVLink samples whose state was decided (a link down, or every known
    /// link read: a sample with unread links and none down says nothing),
    /// how many had a link down, the longest unbroken stretch of those, and
    /// the stretches at the bucket's two edges, so that merging joins a
    /// stretch across buckets.
    #[prost(uint32, tag = "37")]
    pub nvlink_n: u32,
    #[prost(uint32, tag = "38")]
    pub nvlink_down_n: u32,
    #[prost(uint32, tag = "39")]
    pub nvlink_down_run: u32,
    #[prost(uint32, tag = "40")]
    pub nvlink_down_head: u32,
    #[prost(uint32, tag = "41")]
    pub nvlink_down_tail: u32,
    /// Most links down in one sample.
    #[prost(uint32, tag = "42")]
    pub nvlink_down_worst: u32,
    /// Samples in which some known link could not be read.
    #[prost(uint32, tag = "43")]
    pub nvlink_unknown_n: u32,
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
        nvlink_crc_flit: s.nvlink_crc_flit,
        nvlink_crc_data: s.nvlink_crc_data,
        nvlink_replay: s.nvlink_replay,
        nvlink_recovery: s.nvlink_recovery,
        sw_thermal_ns: s.sw_thermal_slowdown_ns,
        hw_thermal_ns: s.hw_thermal_slowdown_ns,
        power_brake_ns: s.power_brake_slowdown_ns,
    }
}

fn min_nonzero(a: u32, b: u32) -> u32 {
    match (a, b) {
        (0, x) | (x, 0) => x,
        (a, b) => a.min(b),
    }
}

impl Bucket {
    /// How far a clock-event counter (ns, `Counters::*_ns`) grew from the
    /// first sample to the last; `None` unless both read it.
    pub fn slowdown_ns(&self, counter: fn(&Counters) -> Option<u64>) -> Option<u64> {
        let (first, last) = (
            counter(self.first_counters()?)?,
            counter(self.last_counters()?)?,
        );
        Some(last.saturating_sub(first))
    }

    /// The counters of the bucket's first sample.
    pub fn first_counters(&self) -> Option<&Counters> {
        self.first.as_deref()
    }

    /// The counters of the bucket's last sample.
    pub fn last_counters(&self) -> Option<&Counters> {
        self.last.as_deref().or(self.first_counters())
    }

    /// The counters of the first and the last sample, owned, zero where
    /// none was read: what counter deltas are taken from.
    pub fn counter_ends(&self) -> (Counters, Counters) {
        let owned = |c: Option<&Counters>| c.cloned().unwrap_or_default();
        (owned(self.first_counters()), owned(self.last_counters()))
    }

    pub fn of(s: &GpuSample, t: u64) -> Bucket {
        let loaded = s.util_gpu >= LOADED_UTIL;
        let bits = match loaded {
            true => s.throttle_reasons & ((1 << THROTTLE_BITS) - 1),
            false => 0,
        };
        let throttle_loaded = (0..u64::BITS - bits.leading_zeros())
            .map(|bit| ((bits >> bit) & 1) as u32)
            .collect();
        let c = counters(s);
        let decided = s.nvlinks_expected > 0 && (s.nvlinks_down > 0 || s.nvlinks_unknown == 0);
        let down = (decided && s.nvlinks_down > 0) as u32;
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
            // Links not known to be down: an unread link is not a missing one.
            nvlinks_min: s.nvlinks_expected.saturating_sub(s.nvlinks_down),
            nvlinks_expected: s.nvlinks_expected,
            remap_failed: s.remap_failed,
            first: Some(Box::new(c)),
            last: None,
            xids,
            sm_clock_max: s.sm_clock_max_mhz,
            clock_low_loaded: (loaded
                && s.sm_clock_max_mhz > 0
                && (s.sm_clock_mhz as f64) < CLOCK_LOW_RATIO * s.sm_clock_max_mhz as f64
                && s.throttle_reasons & CLOCK_REASONS == 0) as u32,
            nvlink_n: decided as u32,
            nvlink_down_n: down,
            nvlink_down_run: down,
            nvlink_down_head: down,
            nvlink_down_tail: down,
            nvlink_down_worst: if down > 0 { s.nvlinks_down } else { 0 },
            nvlink_unknown_n: (s.nvlinks_unknown > 0) as u32,
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
        if self.throttle_loaded.len() < b.throttle_loaded.len() {
            self.throttle_loaded.resize(b.throttle_loaded.len(), 0);
        }
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
        self.merge_nvlink_stretches(b);
        self.remap_failed |= b.remap_failed;
        self.sm_clock_max = self.sm_clock_max.max(b.sm_clock_max);
        self.clock_low_loaded += b.clock_low_loaded;
        if self.first.is_none() {
            self.first = b.first.clone();
        }
        // A set is made only where it differs from both: this runs for
        // every sample, and most buckets' counters never move.
        if let Some(last) = b.last_counters() {
            if self.first_counters() == Some(last) {
                self.last = None;
            } else if self.last.as_deref() != Some(last) {
                self.last = Some(Box::new(last.clone()));
            }
        }
        // Most samples carry no Xid: no set is made for them (this runs for
        // every sample of every GPU, 131,072 GPUs at the largest fleets).
        if !b.xids.is_empty() {
            let mut xids: BTreeSet<u32> = self.xids.iter().copied().collect();
            xids.extend(b.xids.iter().copied());
            self.xids = xids.into_iter().collect();
        }
    }
}

impl Bucket {
    /// Joins the link-down stretches of `b`, which follows this bucket.
    fn merge_nvlink_stretches(&mut self, b: &Bucket) {
        let run = self
            .nvlink_down_run
            .max(b.nvlink_down_run)
            .max(self.nvlink_down_tail + b.nvlink_down_head);
        let head = if self.nvlink_down_head == self.nvlink_n {
            self.nvlink_n + b.nvlink_down_head
        } else {
            self.nvlink_down_head
        };
        let tail = if b.nvlink_down_tail == b.nvlink_n {
            b.nvlink_n + self.nvlink_down_tail
        } else {
            b.nvlink_down_tail
        };
        self.nvlink_down_run = run;
        self.nvlink_down_head = head;
        self.nvlink_down_tail = tail;
        self.nvlink_n += b.nvlink_n;
        self.nvlink_down_n += b.nvlink_down_n;
        self.nvlink_down_worst = self.nvlink_down_worst.max(b.nvlink_down_worst);
        self.nvlink_unknown_n += b.nvlink_unknown_n;
    }
}

/// The slot of a bucket starting at `ms` in a series whose slot 0 starts at
/// `origin`, `width` ms a slot.
fn slot(ms: u64, origin: u64, width: u64) -> u64 {
    ms.saturating_sub(origin) / width.max(1)
}

/// Whether a sample taken at `t` joins the newest bucket (starting at
/// `newest`) of a series whose slot 0 starts at `origin`, `width` ms a slot:
/// late or same-slot samples do.
pub fn joins_newest(newest: u64, t: u64, origin: u64, width: u64) -> bool {
    t <= newest || slot(t, origin, width) == slot(newest, origin, width)
}

impl GpuSeries {
    /// An empty series with fresh (one-second) buckets.
    pub fn new(node: &str, index: u32, uuid: &str) -> GpuSeries {
        GpuSeries {
            node: node.to_string(),
            index,
            uuid: uuid.to_string(),
            bucket_ms: BASE_BUCKET_MS,
            buckets: Vec::new(),
        }
    }

    /// Adds one sample taken at `t` (unix ms).
    pub fn add(&mut self, s: &GpuSample, t: u64) {
        self.add_within(s, t, MAX_BUCKETS)
    }

    /// Adds one sample, keeping at most `max_buckets` (a job's GPUs share one
    /// budget: [`buckets_per_gpu`]).
    pub fn add_within(&mut self, s: &GpuSample, t: u64, max_buckets: usize) {
        let b = Bucket::of(s, t);
        let most = max_buckets.max(2);
        let origin = self.origin(t);
        let width = self.bucket_ms;
        let joins = self
            .buckets
            .last()
            .is_some_and(|last| joins_newest(last.start_ms, t, origin, width));
        if joins {
            if let Some(last) = self.buckets.last_mut() {
                last.merge(&b);
            }
            self.fit(None, most);
        } else if self.buckets.len() >= most {
            self.fit(Some(b), most);
        } else {
            let len = self.buckets.len();
            if len == self.buckets.capacity() {
                // Doubling, but never past what the series may hold (a
                // bucket is ~600 bytes in memory, for every GPU of the job).
                self.buckets.reserve_exact(len.max(4).min(most - len));
            }
            self.buckets.push(b);
        }
    }

    /// Where slot 0 starts: the first bucket's start, else `t`.
    fn origin(&self, t: u64) -> u64 {
        self.buckets.first().map_or(t, |f| f.start_ms)
    }

    /// The buckets and `fresh` (a bucket past the newest) merged pairwise,
    /// the width doubled each time, until at most `most` are left. `fresh`
    /// joins as they are merged, so that a series never holds room for a
    /// bucket past its limit: at 131,072 GPUs one more each was ~80 MB.
    fn fit(&mut self, mut fresh: Option<Bucket>, most: usize) {
        let origin = self.origin(fresh.as_ref().map_or(0, |b| b.start_ms));
        while fresh.is_some() || self.buckets.len() > most {
            self.bucket_ms *= 2;
            let width = self.bucket_ms;
            let mut merged: Vec<Bucket> = Vec::with_capacity(most);
            for b in self.buckets.drain(..).chain(fresh.take()) {
                match merged.last_mut() {
                    Some(m)
                        if slot(m.start_ms, origin, width) == slot(b.start_ms, origin, width) =>
                    {
                        m.merge(&b)
                    }
                    _ => merged.push(b),
                }
            }
            self.buckets = merged;
        }
    }

    /// The whole run in one bucket.
    pub fn totals(&self) -> Bucket {
        let mut t = Totals::over(None);
        self.buckets.iter().for_each(|b| t.add(b));
        t.all
    }
}

/// A series' totals, whole and over a window (the buckets that lie wholly
/// within `from..=to`, unix ms), taken a bucket at a time: from a series in
/// memory or from stored buckets decoded one by one.
pub struct Totals {
    pub all: Bucket,
    /// Present when there is a window.
    pub within: Option<Bucket>,
    window: Option<(u64, u64)>,
}

impl Totals {
    pub fn over(window: Option<(u64, u64)>) -> Totals {
        Totals {
            all: Bucket::default(),
            within: window.map(|_| Bucket::default()),
            window,
        }
    }

    /// Adds the series' next bucket.
    pub fn add(&mut self, b: &Bucket) {
        self.all.merge(b);
        if let (Some(w), Some((from, to))) = (self.within.as_mut(), self.window) {
            if b.start_ms >= from && b.end_ms <= to {
                w.merge(b);
            }
        }
    }
}

impl GpuSeries {
    /// The series as the CLI draws it (`GetTimeline`): means per bucket.
    pub fn timeline(&self) -> GpuTimeline {
        let points = self
            .buckets
            .iter()
            .filter(|b| b.n > 0)
            .map(|b| {
                let n = b.n as f64;
                TelemetryPoint {
                    start_unix_ms: b.start_ms,
                    end_unix_ms: b.end_ms,
                    samples: b.n,
                    util_mean: b.util_sum / n,
                    util_max: b.util_max,
                    power_mean_w: b.power_sum / n,
                    power_limit_w: b.power_limit,
                    temp_mean_c: b.temp_sum / n,
                    temp_max_c: b.temp_max,
                    sm_clock_mean_mhz: b.sm_clock_sum / n,
                    mem_used_max_bytes: b.mem_used_max,
                    mem_total_bytes: b.mem_total,
                    throttle_reasons: b.throttle_any,
                }
            })
            .collect();
        GpuTimeline {
            node: self.node.clone(),
            index: self.index,
            uuid: self.uuid.clone(),
            points,
        }
    }
}

#[cfg(test)]
mod budget_tests;

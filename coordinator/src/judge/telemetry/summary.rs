//! A job's telemetry turned into what its report shows: one summary per GPU
//! (means, maxima, counter deltas) and the health findings, the per-GPU rules
//! of [`crate::judge::health`] and the one rule that needs the job's other
//! GPUs, NVLink CRC errors far beyond the peers'.

use std::collections::BTreeMap;

use gpuctl_proto::pb::{GpuTelemetrySummary, HealthFinding, Verdict};

use super::Telemetry;
use crate::judge::health::{self, HealthRules, Level};
use crate::judge::series::{Bucket, Counters, GpuSeries};

impl Telemetry {
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
    health::nvlink_crc(&first, &last) as f64 / health::rate_minutes(t)
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
        nvlink_crc_delta: health::nvlink_crc(&first, &last),
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

fn severity(v: Verdict) -> u8 {
    match v {
        Verdict::Fail => 3,
        Verdict::Warn => 2,
        Verdict::Incomplete => 1,
        _ => 0,
    }
}

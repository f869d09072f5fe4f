//! A job's telemetry turned into what its report shows: one summary per GPU
//! (means, maxima, counter deltas) and the health findings, the per-GPU rules
//! of [`crate::judge::checks::health`] and the one rule that needs the job's other
//! GPUs, NVLink CRC errors far beyond the peers'.

use gpuctl_proto::pb::{GpuTelemetrySummary, Verdict};

use super::Telemetry;
use crate::judge::checks::health::{name_gpu, HealthRules};
use crate::judge::checks::idle::Windows;
use crate::judge::checks::nvlink::{crc_per_min, nvlink_crc, peer_crc};
use crate::judge::checks::{Check, Level};
use crate::judge::series::{Bucket, Counters, GpuSeries, Totals};

impl Telemetry {
    /// One summary per GPU and the health findings, GPU by GPU. `windows`:
    /// when each GPU's rank ran its measured phase, which `idle` judges.
    pub fn summarise(
        &self,
        rules: &HealthRules,
        windows: &Windows<'_>,
    ) -> (Vec<GpuTelemetrySummary>, Vec<Check>) {
        let mut summaries = Vec::with_capacity(self.series.len());
        let mut per_gpu = Vec::with_capacity(self.series.len());
        let mut rates = Vec::with_capacity(self.series.len());
        // Both are in (node, GPU) order: read side by side, not looked up.
        let mut windows = windows.iter().peekable();
        for slot in self.series.values() {
            let g = slot.head();
            let key = (g.node.as_str(), g.index);
            while windows.next_if(|(k, _)| **k < key).is_some() {}
            let window = windows.next_if(|(k, _)| **k == key).map(|(_, w)| *w);
            let mut totals = Totals::over(window);
            slot.for_each_bucket(|b| totals.add(b));
            let (t, measured) = (totals.all, totals.within);
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
                .map(|c| c.level)
                .filter(|l| matches!(l, Level::Warn | Level::Fail))
                .max()
                .map_or(Verdict::Pass, Level::verdict) as i32;
            findings.extend(mine);
        }
        (summaries, findings)
    }
}

fn summary(
    g: &GpuSeries,
    t: &Bucket,
    measured: Option<&Bucket>,
    rules: &HealthRules,
) -> (GpuTelemetrySummary, Vec<Check>) {
    let n = t.n.max(1) as f64;
    let mean = |sum: f64| sum / n;
    let std = |sum: f64, sq: f64| (sq / n - (sum / n).powi(2)).max(0.0).sqrt();
    let (first, last) = t.counter_ends();
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
        nvlink_crc_delta: nvlink_crc(&first, &last),
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
        .map(|f| name_gpu(f, &g.node, g.index, &g.uuid))
        .collect();
    (s, findings)
}

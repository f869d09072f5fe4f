//! GPU telemetry of a running job: the latest batch per node (for `gpuctl watch`)
//! and running per-GPU aggregates, summarised into the report with health
//! findings (XIDs, ECC, PCIe and NVLink degradation, heat, idling). Kept in
//! memory only: the stored report carries the summary.

use std::collections::{BTreeMap, BTreeSet};

use gpuctl_proto::pb::{GpuSample, GpuTelemetrySummary, HealthFinding, TelemetryBatch, Verdict};

/// XIDs that mean broken hardware rather than a faulting program
/// (double-bit ECC, row-remap failure, NVLink, fallen off the bus, GSP).
const HARDWARE_XIDS: &[u32] = &[48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120];
const HOT_C: f64 = 90.0;
const LOW_UTIL: f64 = 10.0;

#[derive(Debug, Default, Clone)]
struct Moments {
    n: f64,
    sum: f64,
    sq: f64,
    max: f64,
}

impl Moments {
    fn add(&mut self, x: f64) {
        self.n += 1.0;
        self.sum += x;
        self.sq += x * x;
        self.max = if self.n == 1.0 { x } else { self.max.max(x) };
    }
    fn mean(&self) -> f64 {
        if self.n > 0.0 {
            self.sum / self.n
        } else {
            0.0
        }
    }
    fn std(&self) -> f64 {
        if self.n > 0.0 {
            (self.sq / self.n - self.mean().powi(2)).max(0.0).sqrt()
        } else {
            0.0
        }
    }
}

#[derive(Debug, Default, Clone)]
struct Gpu {
    node: String,
    index: u32,
    uuid: String,
    util: Moments,
    low: u32,
    temp: Moments,
    power: Moments,
    clock: Moments,
    mem_used_max: u64,
    first: Option<GpuSample>,
    last: GpuSample,
    xids: BTreeSet<u32>,
    pcie_gen_best: u32,
    pcie_width_best: u32,
    nvlinks_min: Option<u32>,
    remap_failed: bool,
}

#[derive(Debug, Default, Clone)]
pub struct Telemetry {
    latest: BTreeMap<String, TelemetryBatch>,
    gpus: BTreeMap<(String, String), Gpu>,
}

impl Telemetry {
    pub fn add(&mut self, node: &str, batch: TelemetryBatch) {
        for s in &batch.samples {
            let key = (
                node.to_string(),
                if s.uuid.is_empty() {
                    s.index.to_string()
                } else {
                    s.uuid.clone()
                },
            );
            let g = self.gpus.entry(key).or_insert_with(|| Gpu {
                node: node.to_string(),
                index: s.index,
                uuid: s.uuid.clone(),
                ..Default::default()
            });
            g.util.add(s.util_gpu);
            if s.util_gpu < LOW_UTIL {
                g.low += 1;
            }
            g.temp.add(s.temperature_c);
            g.power.add(s.power_w);
            g.clock.add(s.sm_clock_mhz as f64);
            g.mem_used_max = g.mem_used_max.max(s.mem_used_bytes);
            g.xids.extend(s.xids.iter().copied());
            g.pcie_gen_best = g.pcie_gen_best.max(s.pcie_gen);
            g.pcie_width_best = g.pcie_width_best.max(s.pcie_width);
            if s.nvlinks_expected > 0 {
                g.nvlinks_min = Some(
                    g.nvlinks_min
                        .map_or(s.nvlinks_active, |m| m.min(s.nvlinks_active)),
                );
            }
            g.remap_failed |= s.remap_failed;
            if g.first.is_none() {
                g.first = Some(s.clone());
            }
            g.last = s.clone();
        }
        self.latest.insert(node.to_string(), batch);
    }

    /// The latest batch of every node.
    pub fn latest(&self) -> Vec<TelemetryBatch> {
        self.latest.values().cloned().collect()
    }

    /// One summary per GPU and the health findings, GPU by GPU.
    pub fn summarise(&self) -> (Vec<GpuTelemetrySummary>, Vec<HealthFinding>) {
        let mut summaries = Vec::new();
        let mut findings = Vec::new();
        for g in self.gpus.values() {
            let first = g.first.clone().unwrap_or_default();
            let delta = |f: fn(&GpuSample) -> u64| f(&g.last).saturating_sub(f(&first));
            let mut s = GpuTelemetrySummary {
                node: g.node.clone(),
                index: g.index,
                uuid: g.uuid.clone(),
                samples: g.util.n as u32,
                util_mean: g.util.mean(),
                util_max: g.util.max,
                util_std: g.util.std(),
                util_low_share: if g.util.n > 0.0 {
                    g.low as f64 / g.util.n
                } else {
                    0.0
                },
                mem_used_max_bytes: g.mem_used_max,
                temp_mean: g.temp.mean(),
                temp_max: g.temp.max,
                temp_std: g.temp.std(),
                power_mean_w: g.power.mean(),
                power_max_w: g.power.max,
                power_std_w: g.power.std(),
                sm_clock_mean_mhz: g.clock.mean(),
                ecc_corrected_delta: delta(|x| x.ecc_corrected),
                ecc_uncorrected_delta: delta(|x| x.ecc_uncorrected),
                pcie_replays_delta: delta(|x| x.pcie_replays),
                nvlink_crc_delta: delta(|x| x.nvlink_crc_errors),
                xids: g.xids.iter().copied().collect(),
                verdict: Verdict::Pass as i32,
            };
            let mut mine = Vec::new();
            let mut find = |verdict: Verdict, rule: &str, detail: String| {
                mine.push(HealthFinding {
                    node: g.node.clone(),
                    gpu_index: g.index,
                    uuid: g.uuid.clone(),
                    verdict: verdict as i32,
                    rule: rule.into(),
                    detail,
                });
            };
            if !g.xids.is_empty() {
                let hw: Vec<String> = g
                    .xids
                    .iter()
                    .filter(|x| HARDWARE_XIDS.contains(x))
                    .map(u32::to_string)
                    .collect();
                let all: Vec<String> = g.xids.iter().map(u32::to_string).collect();
                if hw.is_empty() {
                    find(
                        Verdict::Warn,
                        "xid",
                        format!(
                            "XID {} during the run (usually a program fault)",
                            all.join(", ")
                        ),
                    );
                } else {
                    find(
                        Verdict::Fail,
                        "xid",
                        format!(
                            "hardware XID {} during the run; drain the GPU and check it",
                            hw.join(", ")
                        ),
                    );
                }
            }
            if s.ecc_uncorrected_delta > 0 {
                find(
                    Verdict::Fail,
                    "ecc_uncorrected",
                    format!(
                        "{} uncorrectable ECC errors during the run",
                        s.ecc_uncorrected_delta
                    ),
                );
            }
            if g.remap_failed {
                find(
                    Verdict::Fail,
                    "row_remap",
                    "row remapping failed: the GPU needs service".into(),
                );
            }
            if let Some(active) = g.nvlinks_min {
                let expected = g.last.nvlinks_expected;
                if active < expected {
                    find(
                        Verdict::Fail,
                        "nvlink",
                        format!("{active} of {expected} NVLinks active"),
                    );
                }
            }
            let retired = delta(|x| x.retired_pages);
            if retired > 0 {
                find(
                    Verdict::Warn,
                    "retired_pages",
                    format!("{retired} pages retired during the run"),
                );
            }
            if s.ecc_corrected_delta > 0 {
                find(
                    Verdict::Warn,
                    "ecc_corrected",
                    format!(
                        "{} corrected ECC errors during the run",
                        s.ecc_corrected_delta
                    ),
                );
            }
            if s.nvlink_crc_delta > 0 {
                find(
                    Verdict::Warn,
                    "nvlink_crc",
                    format!("{} NVLink CRC errors during the run", s.nvlink_crc_delta),
                );
            }
            if s.pcie_replays_delta > 0 {
                find(
                    Verdict::Warn,
                    "pcie_replay",
                    format!("{} PCIe replays during the run", s.pcie_replays_delta),
                );
            }
            let (gen_max, width_max) = (g.last.pcie_gen_max, g.last.pcie_width_max);
            if (gen_max > 0 && g.pcie_gen_best < gen_max)
                || (width_max > 0 && g.pcie_width_best < width_max)
            {
                find(
                    Verdict::Warn,
                    "pcie_link",
                    format!(
                        "PCIe link reached Gen{} x{} at best; the GPU supports Gen{gen_max} x{width_max}: reseat or check the riser",
                        g.pcie_gen_best, g.pcie_width_best
                    ),
                );
            }
            if s.temp_max >= HOT_C {
                find(
                    Verdict::Warn,
                    "temperature",
                    format!("reached {:.0} °C", s.temp_max),
                );
            }
            if s.samples >= 5 && s.util_low_share > 0.5 {
                find(
                    Verdict::Warn,
                    "idle",
                    format!(
                        "under {LOW_UTIL:.0} % utilisation in {:.0} % of samples",
                        s.util_low_share * 100.0
                    ),
                );
            }
            let worst = mine
                .iter()
                .map(|f| f.verdict())
                .max_by_key(|v| severity(*v))
                .unwrap_or(Verdict::Pass);
            s.verdict = worst as i32;
            summaries.push(s);
            findings.extend(mine);
        }
        (summaries, findings)
    }
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

    fn sample(util: f64, ecc_u: u64, xids: Vec<u32>) -> GpuSample {
        GpuSample {
            index: 1,
            uuid: "GPU-1".into(),
            util_gpu: util,
            temperature_c: 60.0,
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
        t.add("n0", batch(vec![sample(100.0, 0, vec![])]));
        t.add("n0", batch(vec![sample(50.0, 0, vec![])]));
        let (s, f) = t.summarise();
        assert!(f.is_empty(), "{f:?}");
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].samples, 2);
        assert_eq!(s[0].util_mean, 75.0);
        assert_eq!(s[0].util_max, 100.0);
        assert_eq!(s[0].util_std, 25.0);
        assert_eq!(s[0].verdict(), Verdict::Pass);
        assert_eq!(t.latest().len(), 1);
    }

    #[test]
    fn ecc_and_hardware_xids_fail_program_xids_warn() {
        let mut t = Telemetry::default();
        t.add("n0", batch(vec![sample(100.0, 2, vec![])]));
        t.add("n0", batch(vec![sample(100.0, 5, vec![79, 13])]));
        let (s, f) = t.summarise();
        assert_eq!(s[0].ecc_uncorrected_delta, 3);
        assert_eq!(s[0].verdict(), Verdict::Fail);
        let rules: Vec<(&str, Verdict)> =
            f.iter().map(|x| (x.rule.as_str(), x.verdict())).collect();
        assert_eq!(
            rules,
            vec![("xid", Verdict::Fail), ("ecc_uncorrected", Verdict::Fail)]
        );
        assert!(f[0].detail.contains("79") && !f[0].detail.contains("13"));

        let mut t = Telemetry::default();
        let mut slow = sample(100.0, 0, vec![13]);
        slow.pcie_width = 8;
        t.add("n0", batch(vec![slow]));
        let (s, f) = t.summarise();
        assert_eq!(s[0].verdict(), Verdict::Warn);
        assert!(
            f.iter()
                .any(|x| x.rule == "pcie_link" && x.detail.contains("x8")),
            "{f:?}"
        );
    }
}

//! GPU health rules: what in a job's telemetry fails or warns a GPU, and why.
//! The defaults follow what DCGM's health watches and the cloud providers'
//! node checks flag (critical XIDs, uncorrectable ECC, retired pages and row
//! remapping, degraded PCIe and NVLink, hardware slowdown, heat); an operator
//! overrides any of them with `gpuctl-coordinator --health-rules FILE` (TOML or
//! JSON, format in docs/reports.md). Rules read the per-GPU totals that
//! [`super::series`] keeps, so they work the same on live and stored data.

use std::path::Path;

use anyhow::{bail, Context};
use serde::Deserialize;

use super::series::{Bucket, Counters};

/// What a rule does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Fail,
    Warn,
    Off,
}

/// NVML clock-event (throttle) reason bits that mean the GPU slowed itself
/// down; the software power cap (0x4) is left out because a GPU at full load
/// sits on it by design.
pub const HW_SLOWDOWN: u32 = 3; // 0x08
pub const SW_THERMAL: u32 = 5; // 0x20
pub const HW_THERMAL: u32 = 6; // 0x40
pub const HW_POWER_BRAKE: u32 = 7; // 0x80

/// XIDs that mean broken or degraded hardware rather than a faulting program
/// (issue 4's list: ECC page retirement and row remap failures, NVLink, GPU
/// fallen off the bus, GSP and uncontained errors).
pub const CRITICAL_XIDS: &[u32] = &[
    48, 56, 57, 58, 62, 63, 64, 65, 68, 69, 73, 74, 79, 80, 81, 92, 119, 120,
];

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthRules {
    /// XIDs that fire `critical_xid`; every other XID fires `other_xid`.
    pub critical_xids: Vec<u32>,
    pub critical_xid: Level,
    pub other_xid: Level,
    /// Uncorrectable ECC errors counted during the run.
    pub ecc_uncorrected: Level,
    /// Uncorrectable ECC errors already counted when the run started.
    pub ecc_uncorrected_before: Level,
    /// Corrected ECC errors during the run above this many fire `ecc_corrected`.
    pub ecc_corrected_limit: u64,
    pub ecc_corrected: Level,
    /// Retired pages at or above this fire `retired_pages`.
    pub retired_pages_limit: u64,
    pub retired_pages: Level,
    /// Pages retired during the run (any).
    pub retired_pages_growth: Level,
    pub row_remap_failed: Level,
    /// Share of loaded samples (utilisation at or above 50 %) whose PCIe link
    /// ran under the GPU's maximum before the link rules fire.
    pub pcie_link_min_share: f64,
    pub pcie_gen_below_max: Level,
    pub pcie_width_below_max: Level,
    /// PCIe replays per minute (over the run, at least one minute) above this fire `pcie_replays`.
    pub pcie_replays_per_min: f64,
    pub pcie_replays: Level,
    /// A link seen active that answers inactive in at least this many
    /// consecutive samples (a second apart by default) fires `nvlink`; fewer
    /// is one misread, not a link down. A read that fails is never down.
    pub nvlink_down_min_samples: u32,
    /// `nvlink` when the job's own bandwidth agrees (a bandwidth finding at
    /// fail on the node) ...
    pub nvlink_down: Level,
    /// ... and when nothing measured confirms it.
    pub nvlink_down_unconfirmed: Level,
    /// NVLink flit CRC errors (what `nvidia-smi nvlink -e` calls "CRC
    /// Errors"), summed link by link, per minute above this fire
    /// `nvlink_crc`. DCGM's limit: 100 a second. The data CRC counter is
    /// left to the peer rule: on healthy H100s it counted ~250 a second
    /// under full NVLink load while nvidia-smi showed 0 CRC errors
    /// (docs/benchmarks.md, 2026-11-26).
    pub nvlink_crc_per_min: f64,
    pub nvlink_crc: Level,
    /// A GPU whose CRC rate is at least this many times the median of the
    /// job's other NVLink GPUs (and over `nvlink_crc_peer_min_per_min`)
    /// fires `nvlink_crc` too: one link going bad among healthy peers.
    pub nvlink_crc_peer_ratio: f64,
    pub nvlink_crc_peer_min_per_min: f64,
    /// Replays (a link retransmitting) and recoveries (a link retrained)
    /// during the run, above these counts.
    pub nvlink_replay_limit: u64,
    pub nvlink_replay: Level,
    pub nvlink_recovery_limit: u64,
    pub nvlink_recovery: Level,
    /// Share of the loaded time a slowdown held the clocks down before it
    /// fires: timed by NVML's clock-event counters where the driver keeps
    /// them, else counted in loaded samples with the reason set.
    pub throttle_min_share: f64,
    /// Where counted in samples, at least this many: one sample is one look
    /// a second apart, not a slowdown's length.
    pub throttle_min_samples: u32,
    pub hw_slowdown: Level,
    pub hw_thermal_slowdown: Level,
    pub sw_thermal_slowdown: Level,
    pub hw_power_brake: Level,
    /// Share of loaded samples whose SM clock sat under 90 % of its maximum
    /// with no throttle reason to explain it, before `clock_low` fires.
    pub clock_low_min_share: f64,
    pub clock_low: Level,
    pub temperature_warn_c: f64,
    pub temperature_fail_c: f64,
    /// Share of samples under 10 % utilisation above which `idle` fires.
    pub idle_share: f64,
    /// Measured-phase samples `idle` needs before it judges: a 5-second
    /// nccl sweep on healthy H100s had 3 of its 5 samples under 10 % (sizes,
    /// checks and allocations between the collectives; docs/benchmarks.md,
    /// 2026-11-26), which says nothing about a GPU left idle.
    pub idle_min_samples: u32,
    pub idle: Level,
}

impl Default for HealthRules {
    fn default() -> Self {
        HealthRules {
            critical_xids: CRITICAL_XIDS.to_vec(),
            critical_xid: Level::Fail,
            other_xid: Level::Warn,
            ecc_uncorrected: Level::Fail,
            ecc_uncorrected_before: Level::Warn,
            ecc_corrected_limit: 0,
            ecc_corrected: Level::Warn,
            retired_pages_limit: 63,
            retired_pages: Level::Fail,
            retired_pages_growth: Level::Warn,
            row_remap_failed: Level::Fail,
            pcie_link_min_share: 0.25,
            pcie_gen_below_max: Level::Warn,
            pcie_width_below_max: Level::Fail,
            // DCGM's PCIe health watch warns above 8 replays a minute.
            pcie_replays_per_min: 8.0,
            pcie_replays: Level::Warn,
            nvlink_down_min_samples: 10,
            nvlink_down: Level::Fail,
            nvlink_down_unconfirmed: Level::Warn,
            // dcgm_gpu_hardware_limits.h, DCGM_LIMIT_MAX_NVLINK_CRC_ERROR:
            // "CRC errors only matter at rates of 100+ per second".
            nvlink_crc_per_min: 6000.0,
            nvlink_crc: Level::Warn,
            nvlink_crc_peer_ratio: 10.0,
            nvlink_crc_peer_min_per_min: 600.0,
            // DCGM_LIMIT_MAX_NVLINK_ERROR (1): any replay or recovery.
            nvlink_replay_limit: 0,
            nvlink_replay: Level::Warn,
            nvlink_recovery_limit: 0,
            nvlink_recovery: Level::Fail,
            throttle_min_share: 0.05,
            throttle_min_samples: 2,
            hw_slowdown: Level::Fail,
            hw_thermal_slowdown: Level::Fail,
            sw_thermal_slowdown: Level::Warn,
            hw_power_brake: Level::Fail,
            clock_low_min_share: 0.2,
            clock_low: Level::Warn,
            temperature_warn_c: 90.0,
            temperature_fail_c: 95.0,
            idle_share: 0.5,
            idle_min_samples: 20,
            idle: Level::Warn,
        }
    }
}

/// One rule that fired.
#[derive(Debug, Clone, PartialEq)]
pub struct Fired {
    pub level: Level,
    pub rule: &'static str,
    pub detail: String,
}

impl HealthRules {
    /// Reads a rules file: `.json` as JSON, anything else as TOML. Keys left
    /// out keep their defaults; unknown keys are an error, so a typo cannot
    /// silently switch a rule back to its default.
    pub fn load(path: &Path) -> anyhow::Result<HealthRules> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read --health-rules {}", path.display()))?;
        let json = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"));
        let rules = if json {
            Self::from_json(&text)
        } else {
            Self::from_toml(&text)
        };
        rules.with_context(|| format!("--health-rules {}", path.display()))
    }

    pub fn from_toml(text: &str) -> anyhow::Result<HealthRules> {
        let rules: HealthRules = toml::from_str(text).context("not valid health rules TOML")?;
        rules.validated()
    }

    pub fn from_json(text: &str) -> anyhow::Result<HealthRules> {
        let rules: HealthRules =
            serde_json::from_str(text).context("not valid health rules JSON")?;
        rules.validated()
    }

    fn validated(self) -> anyhow::Result<HealthRules> {
        for (name, share) in [
            ("pcie_link_min_share", self.pcie_link_min_share),
            ("throttle_min_share", self.throttle_min_share),
            ("clock_low_min_share", self.clock_low_min_share),
            ("idle_share", self.idle_share),
        ] {
            if !(0.0..=1.0).contains(&share) {
                bail!("{name} = {share}: a share between 0 and 1");
            }
        }
        for (name, rate) in [
            ("pcie_replays_per_min", self.pcie_replays_per_min),
            ("nvlink_crc_per_min", self.nvlink_crc_per_min),
            (
                "nvlink_crc_peer_min_per_min",
                self.nvlink_crc_peer_min_per_min,
            ),
        ] {
            if rate.is_nan() || rate < 0.0 {
                bail!("{name} = {rate}: a rate of 0 or more");
            }
        }
        if self.nvlink_crc_peer_ratio.is_nan() || self.nvlink_crc_peer_ratio < 1.0 {
            bail!(
                "nvlink_crc_peer_ratio = {}: a ratio of 1 or more (10: ten times the median)",
                self.nvlink_crc_peer_ratio
            );
        }
        if self.nvlink_down_min_samples == 0 {
            bail!("nvlink_down_min_samples = 0: at least 1 sample (10: ten seconds at the default interval)");
        }
        if self.temperature_fail_c < self.temperature_warn_c {
            bail!(
                "temperature_fail_c = {} is under temperature_warn_c = {}",
                self.temperature_fail_c,
                self.temperature_warn_c
            );
        }
        Ok(self)
    }

    /// The rules that fire on one GPU's totals over the run, `idle` judged
    /// over the same totals.
    pub fn evaluate(&self, t: &Bucket) -> Vec<Fired> {
        self.evaluate_in(t, Some(t))
    }

    /// As [`Self::evaluate`], with `idle` judged only over `measured`: the
    /// samples taken while the GPU's rank ran its measured phase (`None`:
    /// not known, and `idle` is not judged).
    pub fn evaluate_in(&self, t: &Bucket, measured: Option<&Bucket>) -> Vec<Fired> {
        let mut out = Vec::new();
        let mut fire = |level: Level, rule: &'static str, detail: String| {
            if level != Level::Off {
                out.push(Fired {
                    level,
                    rule,
                    detail,
                });
            }
        };
        let first = t.first.clone().unwrap_or_default();
        let last = t.last.clone().unwrap_or_default();
        let delta = |f: fn(&Counters) -> u64| f(&last).saturating_sub(f(&first));
        let minutes = rate_minutes(t);

        let (critical, other): (Vec<u32>, Vec<u32>) =
            t.xids.iter().partition(|x| self.critical_xids.contains(x));
        if !critical.is_empty() {
            fire(
                self.critical_xid,
                "xid",
                format!(
                    "critical XID {} during the run: drain the GPU and check it (nvidia-smi -q, dmesg)",
                    join(&critical)
                ),
            );
        }
        if !other.is_empty() {
            fire(
                self.other_xid,
                "xid",
                format!(
                    "XID {} during the run (usually a program fault, not the GPU)",
                    join(&other)
                ),
            );
        }
        let ecc_u = delta(|c| c.ecc_uncorrected);
        if ecc_u > 0 {
            fire(
                self.ecc_uncorrected,
                "ecc_uncorrected",
                format!("{ecc_u} uncorrectable ECC errors during the run"),
            );
        }
        if first.ecc_uncorrected > 0 {
            fire(
                self.ecc_uncorrected_before,
                "ecc_uncorrected",
                format!(
                    "{} uncorrectable ECC errors counted before the run started",
                    first.ecc_uncorrected
                ),
            );
        }
        let ecc_c = delta(|c| c.ecc_corrected);
        if ecc_c > self.ecc_corrected_limit {
            fire(
                self.ecc_corrected,
                "ecc_corrected",
                format!("{ecc_c} corrected ECC errors during the run"),
            );
        }
        if last.retired_pages >= self.retired_pages_limit && self.retired_pages_limit > 0 {
            fire(
                self.retired_pages,
                "retired_pages",
                format!(
                    "{} retired pages (limit {}): the GPU needs service",
                    last.retired_pages, self.retired_pages_limit
                ),
            );
        }
        let retired = delta(|c| c.retired_pages);
        if retired > 0 {
            fire(
                self.retired_pages_growth,
                "retired_pages",
                format!("{retired} pages retired during the run"),
            );
        }
        if t.remap_failed {
            fire(
                self.row_remap_failed,
                "row_remap",
                "row remapping failed: the GPU needs service".into(),
            );
        }
        self.pcie(t, &mut fire);
        let replays = delta(|c| c.pcie_replays);
        if replays as f64 / minutes > self.pcie_replays_per_min {
            fire(
                self.pcie_replays,
                "pcie_replay",
                format!(
                    "{replays} PCIe replays during the run ({:.1}/min, rule: {}/min): check the riser and slot",
                    replays as f64 / minutes,
                    self.pcie_replays_per_min
                ),
            );
        }
        if t.nvlink_down_run >= self.nvlink_down_min_samples {
            fire(
                self.nvlink_down_unconfirmed,
                "nvlink",
                nvlink_down_detail(t),
            );
        }
        let crc = nvlink_crc_flit(&first, &last);
        if crc as f64 / minutes > self.nvlink_crc_per_min {
            fire(
                self.nvlink_crc,
                "nvlink_crc",
                format!(
                    "{crc} NVLink flit CRC errors during the run ({:.0}/min, rule: {:.0}/min, DCGM's 100/s): check the links with `nvidia-smi nvlink -e`",
                    crc as f64 / minutes,
                    self.nvlink_crc_per_min
                ),
            );
        }
        for (n, limit, level, rule, what) in [
            (
                delta(|c| c.nvlink_replay),
                self.nvlink_replay_limit,
                self.nvlink_replay,
                "nvlink_replay",
                "replays (a link resent data)",
            ),
            (
                delta(|c| c.nvlink_recovery),
                self.nvlink_recovery_limit,
                self.nvlink_recovery,
                "nvlink_recovery",
                "recoveries (a link retrained)",
            ),
        ] {
            if n > limit {
                fire(
                    level,
                    rule,
                    format!("{n} NVLink {what} during the run (limit {limit}): check the links with `nvidia-smi nvlink -e`; a GPU that keeps counting them needs service"),
                );
            }
        }
        let timed = |c| t.slowdown_ns(c);
        let loaded_ms = loaded_ms(t);
        for (bit, level, name, ns) in [
            (HW_SLOWDOWN, self.hw_slowdown, "hardware slowdown", None),
            (
                HW_THERMAL,
                self.hw_thermal_slowdown,
                "hardware thermal slowdown",
                timed(|c| c.hw_thermal_ns),
            ),
            (
                SW_THERMAL,
                self.sw_thermal_slowdown,
                "software thermal slowdown",
                timed(|c| c.sw_thermal_ns),
            ),
            (
                HW_POWER_BRAKE,
                self.hw_power_brake,
                "power brake slowdown",
                timed(|c| c.power_brake_ns),
            ),
        ] {
            if let Some(ns) = ns {
                let share = ns as f64 / 1e6 / loaded_ms;
                if ns > 0 && loaded_ms > 0.0 && share >= self.throttle_min_share {
                    fire(
                        level,
                        "throttle",
                        format!(
                            "{name} for {:.1} s, {:.0} % of the loaded time (NVML's clock-event counter): check cooling and power delivery",
                            ns as f64 / 1e9,
                            share.min(1.0) * 100.0
                        ),
                    );
                }
                continue;
            }
            let hits = t.throttle_loaded.get(bit as usize).copied().unwrap_or(0);
            if t.loaded > 0 && hits >= self.throttle_min_samples.max(1) {
                let share = hits as f64 / t.loaded as f64;
                if share >= self.throttle_min_share {
                    fire(
                        level,
                        "throttle",
                        format!(
                            "{name} in {hits} of {} loaded samples ({:.0} %): check cooling and power delivery",
                            t.loaded,
                            share * 100.0
                        ),
                    );
                }
            }
        }
        if t.loaded > 0 && t.clock_low_loaded > 0 {
            let share = t.clock_low_loaded as f64 / t.loaded as f64;
            if share >= self.clock_low_min_share {
                fire(
                    self.clock_low,
                    "clock_low",
                    format!(
                        "SM clock under {:.0} % of its {} MHz maximum in {:.0} % of loaded samples, with no throttle reason reported: the GPU ran slow for a cause NVML does not name (clock limits set with nvidia-smi -lgc, firmware)",
                        super::series::CLOCK_LOW_RATIO * 100.0,
                        t.sm_clock_max,
                        share * 100.0
                    ),
                );
            }
        }
        if t.n > 0 && t.temp_max >= self.temperature_fail_c {
            fire(
                Level::Fail,
                "temperature",
                format!(
                    "reached {:.0} °C (limit {:.0} °C)",
                    t.temp_max, self.temperature_fail_c
                ),
            );
        } else if t.n > 0 && t.temp_max >= self.temperature_warn_c {
            fire(
                Level::Warn,
                "temperature",
                format!(
                    "reached {:.0} °C (warn at {:.0} °C)",
                    t.temp_max, self.temperature_warn_c
                ),
            );
        }
        if let Some(m) = measured {
            if m.n >= self.idle_min_samples.max(1)
                && m.util_low as f64 / m.n as f64 > self.idle_share
            {
                fire(
                    self.idle,
                    "idle",
                    format!(
                        "under 10 % utilisation in {:.0} % of the {} samples taken while the workload ran its measured phase (set-up, warm-up, verification and sweeps not counted)",
                        m.util_low as f64 * 100.0 / m.n as f64,
                        m.n
                    ),
                );
            }
        }
        out
    }

    fn pcie(&self, t: &Bucket, fire: &mut impl FnMut(Level, &'static str, String)) {
        if t.loaded == 0 {
            return;
        }
        let share = |n: u32| n as f64 / t.loaded as f64;
        let gen_low =
            t.pcie_gen_low_loaded > 0 && share(t.pcie_gen_low_loaded) >= self.pcie_link_min_share;
        let width_low = t.pcie_width_low_loaded > 0
            && share(t.pcie_width_low_loaded) >= self.pcie_link_min_share;
        if !width_low && !gen_low {
            // Formatted only when it fires: every GPU of a job comes here.
            return;
        }
        let seen = format!(
            "PCIe link at Gen{} x{} under load at worst; the GPU supports Gen{} x{}",
            t.pcie_gen_loaded_min, t.pcie_width_loaded_min, t.pcie_gen_max, t.pcie_width_max
        );
        if width_low {
            fire(
                self.pcie_width_below_max,
                "pcie_link",
                format!(
                    "{seen} ({:.0} % of loaded samples under x{}): reseat the GPU or check the riser",
                    share(t.pcie_width_low_loaded) * 100.0,
                    t.pcie_width_max
                ),
            );
        }
        if gen_low {
            fire(
                self.pcie_gen_below_max,
                "pcie_link",
                format!(
                    "{seen} ({:.0} % of loaded samples under Gen{}): check BIOS PCIe settings and the slot",
                    share(t.pcie_gen_low_loaded) * 100.0,
                    t.pcie_gen_max
                ),
            );
        }
    }
}

/// The minutes a bucket's rates are taken over: at least one, so a short
/// run's one replay is not a storm.
/// The time the GPU was loaded, from its loaded samples and the series'
/// mean spacing between samples.
fn loaded_ms(t: &Bucket) -> f64 {
    if t.n < 2 {
        return 0.0;
    }
    let spacing = t.end_ms.saturating_sub(t.start_ms) as f64 / (t.n - 1) as f64;
    t.loaded as f64 * spacing
}

pub fn rate_minutes(t: &Bucket) -> f64 {
    (t.end_ms.saturating_sub(t.start_ms) as f64 / 60_000.0).max(1.0)
}

/// NVLink flit CRC errors between two counter readings, link by link; an
/// older agent's summed total where it sent no split.
pub fn nvlink_crc_flit(first: &Counters, last: &Counters) -> u64 {
    if has_split(first) || has_split(last) {
        last.nvlink_crc_flit.saturating_sub(first.nvlink_crc_flit)
    } else {
        last.nvlink_crc_errors
            .saturating_sub(first.nvlink_crc_errors)
    }
}

fn has_split(c: &Counters) -> bool {
    c.nvlink_crc_flit + c.nvlink_crc_data > 0
}

/// NVLink CRC errors (flit and data) between two counter readings: the
/// link-by-link sums where the agent sent them, else (an older agent) its
/// summed total.
pub fn nvlink_crc(first: &Counters, last: &Counters) -> u64 {
    let split = last.nvlink_crc_flit + last.nvlink_crc_data;
    if split > 0 || first.nvlink_crc_flit + first.nvlink_crc_data > 0 {
        last.nvlink_crc_flit.saturating_sub(first.nvlink_crc_flit)
            + last.nvlink_crc_data.saturating_sub(first.nvlink_crc_data)
    } else {
        last.nvlink_crc_errors
            .saturating_sub(first.nvlink_crc_errors)
    }
}

/// What a persistent link-down finding says: how many links, for how many
/// consecutive samples and about how long, and how many samples in all.
fn nvlink_down_detail(t: &Bucket) -> String {
    let spacing_s = if t.n > 1 {
        t.end_ms.saturating_sub(t.start_ms) as f64 / 1000.0 / (t.n - 1) as f64
    } else {
        1.0
    };
    let unread = if t.nvlink_unknown_n > 0 {
        format!(
            "; {} sample(s) with links NVML did not answer were not counted",
            t.nvlink_unknown_n
        )
    } else {
        String::new()
    };
    format!(
        "up to {} of {} NVLinks down (seen active, then answering inactive) for {} consecutive samples (~{:.0} s), {} of {} samples in all{unread}",
        t.nvlink_down_worst,
        t.nvlinks_expected,
        t.nvlink_down_run,
        t.nvlink_down_run as f64 * spacing_s,
        t.nvlink_down_n,
        t.nvlink_n,
    )
}

fn join(xs: &[u32]) -> String {
    xs.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_override_defaults_and_typos_are_refused() {
        let r = HealthRules::from_toml(
            "critical_xids = [79]\nother_xid = \"off\"\npcie_width_below_max = \"warn\"\ntemperature_warn_c = 80\n",
        )
        .unwrap();
        assert_eq!(r.critical_xids, vec![79]);
        assert_eq!(r.other_xid, Level::Off);
        assert_eq!(r.pcie_width_below_max, Level::Warn);
        assert_eq!(r.temperature_warn_c, 80.0);
        assert_eq!(
            r.ecc_uncorrected,
            Level::Fail,
            "untouched keys keep defaults"
        );

        let j = HealthRules::from_json(r#"{"retired_pages_limit": 10, "idle": "fail"}"#).unwrap();
        assert_eq!((j.retired_pages_limit, j.idle), (10, Level::Fail));

        let err = format!(
            "{:#}",
            HealthRules::from_toml("ecc_uncorected = \"off\"").unwrap_err()
        );
        assert!(err.contains("ecc_uncorected"), "{err}");
        let err = format!(
            "{:#}",
            HealthRules::from_toml("idle = \"maybe\"").unwrap_err()
        );
        assert!(err.contains("maybe"), "{err}");
        let err = format!(
            "{:#}",
            HealthRules::from_toml("temperature_fail_c = 70").unwrap_err()
        );
        assert!(err.contains("temperature_warn_c"), "{err}");
        assert!(HealthRules::from_json(r#"{"idle_share": 2}"#).is_err());

        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("rules.json");
        std::fs::write(&p, r#"{"hw_slowdown": "warn"}"#).unwrap();
        assert_eq!(HealthRules::load(&p).unwrap().hw_slowdown, Level::Warn);
        let err = format!(
            "{:#}",
            HealthRules::load(&dir.path().join("no.toml")).unwrap_err()
        );
        assert!(err.contains("no.toml"), "{err}");
    }

    fn loaded(n: u32) -> Bucket {
        Bucket {
            n,
            loaded: n,
            start_ms: 0,
            end_ms: 60_000,
            temp_max: 60.0,
            pcie_gen_max: 5,
            pcie_width_max: 16,
            pcie_gen_loaded_min: 5,
            pcie_width_loaded_min: 16,
            throttle_loaded: vec![0; 16],
            first: Some(Counters::default()),
            last: Some(Counters::default()),
            ..Default::default()
        }
    }

    /// A 15-second stress on a healthy H100 (2026-11-27): one loaded sample
    /// of 14 showed the hardware thermal bit. One look is not a slowdown's
    /// length: it fails only from two samples on, or from NVML's counter.
    #[test]
    fn a_slowdown_is_timed_by_the_counters_or_needs_two_samples() {
        let r = HealthRules::default();
        let mut t = loaded(14);
        t.end_ms = 13_000;
        t.throttle_loaded[HW_SLOWDOWN as usize] = 1;
        t.throttle_loaded[HW_THERMAL as usize] = 1;
        assert!(rules_of(&r, &t).is_empty(), "{:?}", r.evaluate(&t));
        t.throttle_loaded[HW_THERMAL as usize] = 2;
        let f = r.evaluate(&t);
        assert_eq!(rules_of(&r, &t), vec![(Level::Fail, "throttle")]);
        assert!(
            f[0].detail.contains("in 2 of 14 loaded samples"),
            "{}",
            f[0].detail
        );

        // The counters, where read, decide for their causes: 0.3 s of 14 s
        // held down is 2 %, under the 5 % share, whatever the bits say.
        t.first.as_mut().unwrap().hw_thermal_ns = Some(5_000_000_000);
        t.last.as_mut().unwrap().hw_thermal_ns = Some(5_300_000_000);
        assert!(rules_of(&r, &t).is_empty(), "{:?}", r.evaluate(&t));
        // 2 s of 14 s is 14 %: fails, timed.
        t.last.as_mut().unwrap().hw_thermal_ns = Some(7_000_000_000);
        let f = r.evaluate(&t);
        assert_eq!(rules_of(&r, &t), vec![(Level::Fail, "throttle")]);
        assert!(
            f[0].detail
                .contains("for 2.0 s, 14 % of the loaded time (NVML's clock-event counter)"),
            "{}",
            f[0].detail
        );
        // Software thermal timed by its own counter warns; no bit needed.
        t.last.as_mut().unwrap().hw_thermal_ns = Some(5_000_000_000);
        t.first.as_mut().unwrap().sw_thermal_ns = Some(0);
        t.last.as_mut().unwrap().sw_thermal_ns = Some(3_000_000_000);
        assert_eq!(rules_of(&r, &t), vec![(Level::Warn, "throttle")]);
        // A counter read at one end only is not a time: the bits decide.
        t.first.as_mut().unwrap().sw_thermal_ns = None;
        assert!(rules_of(&r, &t).is_empty(), "{:?}", r.evaluate(&t));
    }

    fn rules_of(r: &HealthRules, t: &Bucket) -> Vec<(Level, &'static str)> {
        r.evaluate(t).iter().map(|f| (f.level, f.rule)).collect()
    }

    #[test]
    fn nvlink_rules_need_persistence_and_real_error_counters() {
        let r = HealthRules::default();
        let mut t = loaded(300);
        t.nvlinks_expected = 18;
        t.nvlink_n = 300;
        // Down in 9 samples, scattered or in one stretch under the rule's 10:
        // a misread, not a link down.
        (t.nvlink_down_n, t.nvlink_down_run, t.nvlink_down_worst) = (9, 9, 15);
        assert!(rules_of(&r, &t).is_empty(), "{:?}", r.evaluate(&t));
        t.nvlink_down_run = 10;
        let f = r.evaluate(&t);
        assert_eq!(f[0].rule, "nvlink");
        assert!(
            f[0].detail.contains("15 of 18") && f[0].detail.contains("10 consecutive samples"),
            "{}",
            f[0].detail
        );
        // The data CRC counter as healthy H100s under NVLink load moved it
        // (~250 a second, nvidia-smi: 0 CRC errors) is not judged alone.
        let mut t = loaded(300);
        t.end_ms = 300_000;
        t.last.as_mut().unwrap().nvlink_crc_data = 300 * 250;
        assert!(rules_of(&r, &t).is_empty());
        t.last.as_mut().unwrap().nvlink_crc_flit = 300 * 150;
        assert_eq!(rules_of(&r, &t), vec![(Level::Warn, "nvlink_crc")]);
        t.last.as_mut().unwrap().nvlink_crc_flit = 0;
        // An older agent's sum is still read.
        t.last.as_mut().unwrap().nvlink_crc_data = 0;
        t.last.as_mut().unwrap().nvlink_crc_errors = 5 * 7_000;
        assert_eq!(rules_of(&r, &t), vec![(Level::Warn, "nvlink_crc")]);
        let mut t = loaded(60);
        t.last.as_mut().unwrap().nvlink_replay = 2;
        t.last.as_mut().unwrap().nvlink_recovery = 1;
        assert_eq!(
            rules_of(&r, &t),
            vec![
                (Level::Warn, "nvlink_replay"),
                (Level::Fail, "nvlink_recovery")
            ]
        );
    }

    #[test]
    fn idle_counts_only_the_measured_phase() {
        let r = HealthRules::default();
        // 60 samples, 40 of them set-up at no load.
        let mut whole = loaded(60);
        whole.util_low = 40;
        let measured = loaded(20);
        assert!(r.evaluate_in(&whole, Some(&measured)).is_empty());
        assert!(
            r.evaluate_in(&whole, None).is_empty(),
            "unknown: not judged"
        );
        // A 5-sample sweep with 3 low samples says nothing yet.
        let mut short = loaded(5);
        short.util_low = 3;
        assert!(r.evaluate_in(&whole, Some(&short)).is_empty());
        let mut idle = loaded(20);
        idle.util_low = 15;
        let f = r.evaluate_in(&whole, Some(&idle));
        assert_eq!(f.len(), 1);
        assert!(
            f[0].detail.contains("75 % of the 20 samples"),
            "{}",
            f[0].detail
        );
    }

    #[test]
    fn a_low_clock_with_no_reason_warns_and_a_power_capped_one_does_not() {
        use gpuctl_core::pb::GpuSample;
        let r = HealthRules::default();
        let sample = |clock: u32, reasons: u64| GpuSample {
            sm_clock_mhz: clock,
            sm_clock_max_mhz: 1980,
            throttle_reasons: reasons,
            ..gpuctl_testkit::gpu::healthy(0)
        };
        let run = |s: &GpuSample| {
            let mut t = Bucket::of(s, 0);
            for i in 1..10 {
                t.merge(&Bucket::of(s, i * 1000));
            }
            t
        };
        // 1200 MHz, nothing reported: something NVML does not name holds it back.
        let fired = rules_of(&r, &run(&sample(1200, 0)));
        assert_eq!(fired, vec![(Level::Warn, "clock_low")]);
        let detail = &r.evaluate(&run(&sample(1200, 0)))[0].detail;
        assert!(
            detail.contains("1980 MHz") && detail.contains("100 %"),
            "{detail}"
        );
        // The same clock on the software power cap is a GPU at full power.
        assert!(rules_of(&r, &run(&sample(1200, 0x4))).is_empty());
        // At 1900 MHz nothing is low.
        assert!(rules_of(&r, &run(&sample(1900, 0))).is_empty());
        // Unknown maximum: no judgement.
        let mut unknown = sample(1200, 0);
        unknown.sm_clock_max_mhz = 0;
        assert!(rules_of(&r, &run(&unknown)).is_empty());
    }

    #[test]
    fn defaults_fire_as_issue_4_lists() {
        let r = HealthRules::default();
        assert!(r.evaluate(&loaded(100)).is_empty());

        let mut t = loaded(100);
        t.xids = vec![13, 79];
        let f = r.evaluate(&t);
        assert_eq!(
            f.iter().map(|x| (x.level, x.rule)).collect::<Vec<_>>(),
            vec![(Level::Fail, "xid"), (Level::Warn, "xid")]
        );
        assert!(f[0].detail.contains("79") && !f[0].detail.contains("13"));

        let mut t = loaded(100);
        t.last.as_mut().unwrap().ecc_uncorrected = 1;
        t.last.as_mut().unwrap().retired_pages = 63;
        assert_eq!(
            rules_of(&r, &t),
            vec![
                (Level::Fail, "ecc_uncorrected"),
                (Level::Fail, "retired_pages"),
                (Level::Warn, "retired_pages")
            ]
        );

        // 8 replays a minute is allowed, 9 is not.
        let mut t = loaded(100);
        t.last.as_mut().unwrap().pcie_replays = 8;
        assert!(r.evaluate(&t).is_empty());
        t.last.as_mut().unwrap().pcie_replays = 9;
        assert_eq!(rules_of(&r, &t), vec![(Level::Warn, "pcie_replay")]);

        // Link width under max while loaded fails; gen under max warns.
        let mut t = loaded(100);
        t.pcie_width_low_loaded = 100;
        t.pcie_width_loaded_min = 8;
        t.pcie_gen_low_loaded = 30;
        t.pcie_gen_loaded_min = 4;
        let f = r.evaluate(&t);
        assert_eq!(
            f.iter().map(|x| (x.level, x.rule)).collect::<Vec<_>>(),
            vec![(Level::Fail, "pcie_link"), (Level::Warn, "pcie_link")]
        );
        assert!(f[0].detail.contains("Gen4 x8"), "{}", f[0].detail);
        // A brief dip under the share does not fire.
        t.pcie_width_low_loaded = 10;
        t.pcie_gen_low_loaded = 10;
        assert!(r.evaluate(&t).is_empty());

        let mut t = loaded(100);
        t.throttle_loaded[HW_THERMAL as usize] = 20;
        t.throttle_loaded[SW_THERMAL as usize] = 20;
        t.throttle_loaded[2] = 100; // software power cap: normal at full load
        t.nvlinks_expected = 18;
        t.nvlink_n = 100;
        (t.nvlink_down_n, t.nvlink_down_run, t.nvlink_down_worst) = (12, 12, 1);
        // Over DCGM's 100 a second, in one minute.
        t.last.as_mut().unwrap().nvlink_crc_flit = 7_000;
        t.temp_max = 91.0;
        assert_eq!(
            rules_of(&r, &t),
            vec![
                (Level::Warn, "nvlink"),
                (Level::Warn, "nvlink_crc"),
                (Level::Fail, "throttle"),
                (Level::Warn, "throttle"),
                (Level::Warn, "temperature"),
            ]
        );
        t.temp_max = 96.0;
        assert!(rules_of(&r, &t).contains(&(Level::Fail, "temperature")));

        let mut t = loaded(20);
        t.loaded = 0;
        t.util_low = 19;
        t.remap_failed = true;
        assert_eq!(
            rules_of(&r, &t),
            vec![(Level::Fail, "row_remap"), (Level::Warn, "idle")]
        );

        // Off silences a rule.
        let quiet = HealthRules::from_toml("row_remap_failed = \"off\"\nidle = \"off\"").unwrap();
        assert!(quiet.evaluate(&t).is_empty());
    }
}

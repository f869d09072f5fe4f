//! The health rules as an operator sets them: every threshold and level,
//! their defaults and how a rules file is read and checked. Apart from the
//! checks so that the whole of what can be set reads in one place, as
//! docs/reports.md lists it.

use std::path::Path;

use anyhow::{bail, Context};
use serde::Deserialize;

use crate::judge::checks::clocks::defaults as clocks;
use crate::judge::checks::ecc::defaults as ecc;
use crate::judge::checks::idle::defaults as idle;
use crate::judge::checks::nvlink::defaults as nvlink;
use crate::judge::checks::pcie::defaults as pcie;
use crate::judge::checks::temperature::defaults as temperature;
use crate::judge::checks::xid::defaults as xid;
use crate::judge::checks::Severity;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthRules {
    /// XIDs that fire `critical_xid`; every other XID fires `other_xid`.
    pub critical_xids: Vec<u32>,
    pub critical_xid: Severity,
    pub other_xid: Severity,
    /// Uncorrectable ECC errors counted during the run.
    pub ecc_uncorrected: Severity,
    /// Uncorrectable ECC errors already counted when the run started.
    pub ecc_uncorrected_before: Severity,
    /// Corrected ECC errors during the run above this many fire `ecc_corrected`.
    pub ecc_corrected_limit: u64,
    pub ecc_corrected: Severity,
    /// Retired pages at or above this fire `retired_pages`.
    pub retired_pages_limit: u64,
    pub retired_pages: Severity,
    /// Pages retired during the run (any).
    pub retired_pages_growth: Severity,
    pub row_remap_failed: Severity,
    /// Share of loaded samples (utilisation at or above 50 %) whose PCIe link
    /// ran under the GPU's maximum before the link rules fire.
    pub pcie_link_min_share: f64,
    pub pcie_gen_below_max: Severity,
    pub pcie_width_below_max: Severity,
    /// PCIe replays per minute (over the run, at least one minute) above this fire `pcie_replays`.
    pub pcie_replays_per_min: f64,
    pub pcie_replays: Severity,
    /// A link seen active that answers inactive in at least this many
    /// consecutive samples (a second apart by default) fires `nvlink`; fewer
    /// is one misread, not a link down. A read that fails is never down.
    pub nvlink_down_min_samples: u32,
    /// `nvlink` when the job's own bandwidth agrees (a bandwidth finding at
    /// fail on the node) ...
    pub nvlink_down: Severity,
    /// ... and when nothing measured confirms it.
    pub nvlink_down_unconfirmed: Severity,
    /// NVLink flit CRC errors (what `nvidia-smi nvlink -e` calls "CRC
    /// Errors"), summed link by link, per minute above this fire
    /// `nvlink_crc`. DCGM's limit: 100 a second. The data CRC counter is
    /// left to the peer rule: on healthy H100s it counted ~250 a second
    /// under full NVLink load while nvidia-smi showed 0 CRC errors
    /// (docs/benchmarks.md, 2026-11-26).
    pub nvlink_crc_per_min: f64,
    pub nvlink_crc: Severity,
    /// A GPU whose CRC rate is at least this many times the median of the
    /// job's other NVLink GPUs (and over `nvlink_crc_peer_min_per_min`)
    /// fires `nvlink_crc` too: one link going bad among healthy peers.
    pub nvlink_crc_peer_ratio: f64,
    pub nvlink_crc_peer_min_per_min: f64,
    /// Replays (a link retransmitting) and recoveries (a link retrained)
    /// during the run, above these counts.
    pub nvlink_replay_limit: u64,
    pub nvlink_replay: Severity,
    pub nvlink_recovery_limit: u64,
    pub nvlink_recovery: Severity,
    /// Share of the loaded time a slowdown held the clocks down before it
    /// fires: timed by NVML's clock-event counters where the driver keeps
    /// them, else counted in loaded samples with the reason set.
    pub throttle_min_share: f64,
    /// Where counted in samples, at least this many: one sample is one look
    /// a second apart, not a slowdown's length.
    pub throttle_min_samples: u32,
    pub hw_slowdown: Severity,
    pub hw_thermal_slowdown: Severity,
    pub sw_thermal_slowdown: Severity,
    pub hw_power_brake: Severity,
    /// Share of loaded samples whose SM clock sat under 90 % of its maximum
    /// with no throttle reason to explain it, before `clock_low` fires.
    pub clock_low_min_share: f64,
    pub clock_low: Severity,
    pub temperature_warn_c: f64,
    pub temperature_fail_c: f64,
    /// Share of samples under 10 % utilisation above which `idle` fires.
    pub idle_share: f64,
    /// Measured-phase samples `idle` needs before it judges: a 5-second
    /// nccl sweep on healthy H100s had 3 of its 5 samples under 10 % (sizes,
    /// checks and allocations between the collectives; docs/benchmarks.md,
    /// 2026-11-26), which says nothing about a GPU left idle.
    pub idle_min_samples: u32,
    pub idle: Severity,
}

/// The defaults, each beside its rule in the rule's folder.
impl Default for HealthRules {
    fn default() -> Self {
        HealthRules {
            critical_xids: xid::CRITICAL_XIDS.to_vec(),
            critical_xid: xid::CRITICAL_XID,
            other_xid: xid::OTHER_XID,
            ecc_uncorrected: ecc::ECC_UNCORRECTED,
            ecc_uncorrected_before: ecc::ECC_UNCORRECTED_BEFORE,
            ecc_corrected_limit: ecc::ECC_CORRECTED_LIMIT,
            ecc_corrected: ecc::ECC_CORRECTED,
            retired_pages_limit: ecc::RETIRED_PAGES_LIMIT,
            retired_pages: ecc::RETIRED_PAGES,
            retired_pages_growth: ecc::RETIRED_PAGES_GROWTH,
            row_remap_failed: ecc::ROW_REMAP_FAILED,
            pcie_link_min_share: pcie::PCIE_LINK_MIN_SHARE,
            pcie_gen_below_max: pcie::PCIE_GEN_BELOW_MAX,
            pcie_width_below_max: pcie::PCIE_WIDTH_BELOW_MAX,
            pcie_replays_per_min: pcie::PCIE_REPLAYS_PER_MIN,
            pcie_replays: pcie::PCIE_REPLAYS,
            nvlink_down_min_samples: nvlink::NVLINK_DOWN_MIN_SAMPLES,
            nvlink_down: nvlink::NVLINK_DOWN,
            nvlink_down_unconfirmed: nvlink::NVLINK_DOWN_UNCONFIRMED,
            nvlink_crc_per_min: nvlink::NVLINK_CRC_PER_MIN,
            nvlink_crc: nvlink::NVLINK_CRC,
            nvlink_crc_peer_ratio: nvlink::NVLINK_CRC_PEER_RATIO,
            nvlink_crc_peer_min_per_min: nvlink::NVLINK_CRC_PEER_MIN_PER_MIN,
            nvlink_replay_limit: nvlink::NVLINK_REPLAY_LIMIT,
            nvlink_replay: nvlink::NVLINK_REPLAY,
            nvlink_recovery_limit: nvlink::NVLINK_RECOVERY_LIMIT,
            nvlink_recovery: nvlink::NVLINK_RECOVERY,
            throttle_min_share: clocks::THROTTLE_MIN_SHARE,
            throttle_min_samples: clocks::THROTTLE_MIN_SAMPLES,
            hw_slowdown: clocks::HW_SLOWDOWN,
            hw_thermal_slowdown: clocks::HW_THERMAL_SLOWDOWN,
            sw_thermal_slowdown: clocks::SW_THERMAL_SLOWDOWN,
            hw_power_brake: clocks::HW_POWER_BRAKE,
            clock_low_min_share: clocks::CLOCK_LOW_MIN_SHARE,
            clock_low: clocks::CLOCK_LOW,
            temperature_warn_c: temperature::TEMPERATURE_WARN_C,
            temperature_fail_c: temperature::TEMPERATURE_FAIL_C,
            idle_share: idle::IDLE_SHARE,
            idle_min_samples: idle::IDLE_MIN_SAMPLES,
            idle: idle::IDLE,
        }
    }
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
}

//! NVLink: links that went down and stayed down, CRC errors at a rate that
//! matters, and replays and recoveries. The counters here are also what the
//! report's summaries and the peer rule (`peers.rs`) read,
//! so they are counted one way for both.

mod confirm;
mod peers;

pub use confirm::confirm_nvlink;
pub use peers::{crc_per_min, peer_crc};

use super::health::{HealthRules, Run, Sink};
use crate::judge::series::{Bucket, Counters};

/// The defaults of this family's settings (`--health-rules`, docs/reports.md);
/// `HealthRules::default` reads them.
pub(super) mod defaults {
    use super::super::health::Severity;

    pub const NVLINK_DOWN_MIN_SAMPLES: u32 = 10;
    pub const NVLINK_DOWN: Severity = Severity::Fail;
    pub const NVLINK_DOWN_UNCONFIRMED: Severity = Severity::Warn;
    // dcgm_gpu_hardware_limits.h, DCGM_LIMIT_MAX_NVLINK_CRC_ERROR:
    // "CRC errors only matter at rates of 100+ per second".
    pub const NVLINK_CRC_PER_MIN: f64 = 6000.0;
    pub const NVLINK_CRC: Severity = Severity::Warn;
    pub const NVLINK_CRC_PEER_RATIO: f64 = 10.0;
    pub const NVLINK_CRC_PEER_MIN_PER_MIN: f64 = 600.0;
    // DCGM_LIMIT_MAX_NVLINK_ERROR (1): any replay or recovery.
    pub const NVLINK_REPLAY_LIMIT: u64 = 0;
    pub const NVLINK_REPLAY: Severity = Severity::Warn;
    pub const NVLINK_RECOVERY_LIMIT: u64 = 0;
    pub const NVLINK_RECOVERY: Severity = Severity::Fail;
}

pub(super) fn check(r: &HealthRules, run: &Run, out: &mut Sink) {
    let t = run.t;
    if t.nvlink_down_run >= r.nvlink_down_min_samples {
        // Unconfirmed until the job's own bandwidth agrees: the report
        // raises it (`nvlink_down`) where a bandwidth finding does.
        out.fire(r.nvlink_down_unconfirmed, "nvlink", down_detail(t));
    }
    let crc = nvlink_crc_flit(&run.first, &run.last);
    if crc as f64 / run.minutes > r.nvlink_crc_per_min {
        out.fire(
            r.nvlink_crc,
            "nvlink_crc",
            format!(
                "{crc} NVLink flit CRC errors during the run ({:.0}/min, rule: {:.0}/min, DCGM's 100/s): check the links with `nvidia-smi nvlink -e`",
                crc as f64 / run.minutes,
                r.nvlink_crc_per_min
            ),
        );
    }
    for (n, limit, level, rule, what) in [
        (
            run.delta(|c| c.nvlink_replay),
            r.nvlink_replay_limit,
            r.nvlink_replay,
            "nvlink_replay",
            "replays (a link resent data)",
        ),
        (
            run.delta(|c| c.nvlink_recovery),
            r.nvlink_recovery_limit,
            r.nvlink_recovery,
            "nvlink_recovery",
            "recoveries (a link retrained)",
        ),
    ] {
        if n > limit {
            out.fire(
                level,
                rule,
                format!("{n} NVLink {what} during the run (limit {limit}): check the links with `nvidia-smi nvlink -e`; a GPU that keeps counting them needs service"),
            );
        }
    }
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
fn down_detail(t: &Bucket) -> String {
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

#[cfg(test)]
mod tests;

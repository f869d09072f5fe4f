//! NVLink: links that went down and stayed down, CRC errors at a rate that
//! matters, and replays and recoveries. The counters here are also what the
//! report's summaries and the peer rule (`peers.rs`) read,
//! so they are counted one way for both.

mod confirm;
mod counters;
mod peers;

pub use confirm::confirm_nvlink;
pub use counters::{nvlink_crc, nvlink_crc_flit};
pub use peers::{crc_per_min, peer_crc};

pub mod defaults;

use super::health::rules::HealthRules;
use super::health::run::{Run, Sink};
use crate::judge::series::Bucket;

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

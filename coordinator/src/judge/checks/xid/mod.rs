//! XIDs: the driver's error events. A critical one means broken or degraded
//! hardware; any other is most often the program's own fault, so it only
//! warns by default.

pub mod defaults;

pub use defaults::CRITICAL_XIDS;

use super::health::rules::HealthRules;
use super::health::run::{Run, Sink};

pub(super) fn check(r: &HealthRules, run: &Run, out: &mut Sink) {
    let (critical, other): (Vec<u32>, Vec<u32>) =
        run.t.xids.iter().partition(|x| r.critical_xids.contains(x));
    if !critical.is_empty() {
        out.fire(
            r.critical_xid,
            "xid",
            format!(
                "critical XID {} during the run: drain the GPU and check it (nvidia-smi -q, dmesg)",
                join(&critical)
            ),
        );
    }
    if !other.is_empty() {
        out.fire(
            r.other_xid,
            "xid",
            format!(
                "XID {} during the run (usually a program fault, not the GPU)",
                join(&other)
            ),
        );
    }
}

fn join(xs: &[u32]) -> String {
    xs.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests;

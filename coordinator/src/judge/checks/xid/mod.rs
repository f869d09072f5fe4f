//! XIDs: the driver's error events. A critical one means broken or degraded
//! hardware; any other is most often the program's own fault, so it only
//! warns by default.

use super::health::{HealthRules, Run, Sink};

/// The defaults of this family's settings (`--health-rules`, docs/reports.md);
/// `HealthRules::default` reads them.
pub(super) mod defaults {
    use super::super::health::Severity;

    pub const CRITICAL_XID: Severity = Severity::Fail;
    pub const OTHER_XID: Severity = Severity::Warn;
}

/// XIDs that mean broken or degraded hardware rather than a faulting program
/// (issue 4's list: ECC page retirement and row remap failures, NVLink, GPU
/// fallen off the bus, GSP and uncontained errors).
pub const CRITICAL_XIDS: &[u32] = &[
    48, 56, 57, 58, 62, 63, 64, 65, 68, 69, 73, 74, 79, 80, 81, 92, 119, 120,
];

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

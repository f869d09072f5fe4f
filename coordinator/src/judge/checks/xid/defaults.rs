//! The defaults of this family's settings (`--health-rules`, docs/reports.md);
//! `HealthRules::default` reads them.

use crate::judge::checks::Severity;

pub const CRITICAL_XID: Severity = Severity::Fail;
pub const OTHER_XID: Severity = Severity::Warn;

/// XIDs that mean broken or degraded hardware rather than a faulting program
/// (issue 4's list: ECC page retirement and row remap failures, NVLink, GPU
/// fallen off the bus, GSP and uncontained errors).
pub const CRITICAL_XIDS: &[u32] = &[
    48, 56, 57, 58, 62, 63, 64, 65, 68, 69, 73, 74, 79, 80, 81, 92, 119, 120,
];

//! The defaults of this family's settings (`--health-rules`, docs/reports.md);
//! `HealthRules::default` reads them.

use crate::judge::checks::Severity;

pub const PCIE_LINK_MIN_SHARE: f64 = 0.25;
pub const PCIE_GEN_BELOW_MAX: Severity = Severity::Warn;
pub const PCIE_WIDTH_BELOW_MAX: Severity = Severity::Fail;
// DCGM's PCIe health watch warns above 8 replays a minute.
pub const PCIE_REPLAYS_PER_MIN: f64 = 8.0;
pub const PCIE_REPLAYS: Severity = Severity::Warn;

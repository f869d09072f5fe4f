//! The defaults of this family's settings (`--health-rules`, docs/reports.md);
//! `HealthRules::default` reads them.

use crate::judge::checks::Severity;

pub const ECC_UNCORRECTED: Severity = Severity::Fail;
pub const ECC_UNCORRECTED_BEFORE: Severity = Severity::Warn;
pub const ECC_CORRECTED_LIMIT: u64 = 0;
pub const ECC_CORRECTED: Severity = Severity::Warn;
pub const RETIRED_PAGES_LIMIT: u64 = 63;
pub const RETIRED_PAGES: Severity = Severity::Fail;
pub const RETIRED_PAGES_GROWTH: Severity = Severity::Warn;
pub const ROW_REMAP_FAILED: Severity = Severity::Fail;

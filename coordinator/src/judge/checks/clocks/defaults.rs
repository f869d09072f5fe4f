//! The defaults of this family's settings (`--health-rules`, docs/reports.md);
//! `HealthRules::default` reads them.

use crate::judge::checks::Severity;

pub const THROTTLE_MIN_SHARE: f64 = 0.05;
pub const THROTTLE_MIN_SAMPLES: u32 = 2;
pub const HW_SLOWDOWN: Severity = Severity::Fail;
pub const HW_THERMAL_SLOWDOWN: Severity = Severity::Fail;
pub const SW_THERMAL_SLOWDOWN: Severity = Severity::Warn;
pub const HW_POWER_BRAKE: Severity = Severity::Fail;
pub const CLOCK_LOW_MIN_SHARE: f64 = 0.2;
pub const CLOCK_LOW: Severity = Severity::Warn;

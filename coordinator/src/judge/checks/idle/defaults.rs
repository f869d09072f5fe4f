//! The defaults of this family's settings (`--health-rules`, docs/reports.md);
//! `HealthRules::default` reads them.

use crate::judge::checks::Severity;

pub const IDLE_SHARE: f64 = 0.5;
pub const IDLE_MIN_SAMPLES: u32 = 20;
pub const IDLE: Severity = Severity::Warn;

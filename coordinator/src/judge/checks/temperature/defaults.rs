//! The defaults of this family's settings (`--health-rules`, docs/reports.md);
//! `HealthRules::default` reads them.

pub const TEMPERATURE_WARN_C: f64 = 90.0;
pub const TEMPERATURE_FAIL_C: f64 = 95.0;

//! Heat: the hottest the GPU got. Unlike the other families, its two
//! thresholds carry their levels themselves (the lower warns, the higher
//! fails), so a rules file moves the temperatures, not the levels.

pub mod defaults;

use super::health::rules::HealthRules;
use super::health::run::{Run, Sink};
use super::Severity;

pub(super) fn check(r: &HealthRules, run: &Run, out: &mut Sink) {
    let t = run.t;
    if t.n > 0 && t.temp_max >= r.temperature_fail_c {
        out.fire(
            Severity::Fail,
            "temperature",
            format!(
                "reached {:.0} °C (limit {:.0} °C)",
                t.temp_max, r.temperature_fail_c
            ),
        );
    } else if t.n > 0 && t.temp_max >= r.temperature_warn_c {
        out.fire(
            Severity::Warn,
            "temperature",
            format!(
                "reached {:.0} °C (warn at {:.0} °C)",
                t.temp_max, r.temperature_warn_c
            ),
        );
    }
}

#[cfg(test)]
mod tests;

//! Clocks held down: the slowdowns NVML names (hardware, thermal, power
//! brake), timed by its clock-event counters where the driver keeps them and
//! counted in loaded samples where not, and a low SM clock that no reason
//! explains.

pub mod defaults;

use super::health::rules::HealthRules;
use super::health::run::{Run, Sink};
use crate::judge::series::{Bucket, CLOCK_LOW_RATIO};

/// NVML clock-event (throttle) reason bits that mean the GPU slowed itself
/// down; the software power cap (0x4) is left out because a GPU at full load
/// sits on it by design.
pub const HW_SLOWDOWN: u32 = 3; // 0x08
pub const SW_THERMAL: u32 = 5; // 0x20
pub const HW_THERMAL: u32 = 6; // 0x40
pub const HW_POWER_BRAKE: u32 = 7; // 0x80

pub(super) fn check(r: &HealthRules, run: &Run, out: &mut Sink) {
    slowdowns(r, run.t, out);
    clock_low(r, run.t, out);
}

fn slowdowns(r: &HealthRules, t: &Bucket, out: &mut Sink) {
    let timed = |c| t.slowdown_ns(c);
    let loaded_ms = loaded_ms(t);
    for (bit, level, name, ns) in [
        (HW_SLOWDOWN, r.hw_slowdown, "hardware slowdown", None),
        (
            HW_THERMAL,
            r.hw_thermal_slowdown,
            "hardware thermal slowdown",
            timed(|c| c.hw_thermal_ns),
        ),
        (
            SW_THERMAL,
            r.sw_thermal_slowdown,
            "software thermal slowdown",
            timed(|c| c.sw_thermal_ns),
        ),
        (
            HW_POWER_BRAKE,
            r.hw_power_brake,
            "power brake slowdown",
            timed(|c| c.power_brake_ns),
        ),
    ] {
        if let Some(ns) = ns {
            let share = ns as f64 / 1e6 / loaded_ms;
            if ns > 0 && loaded_ms > 0.0 && share >= r.throttle_min_share {
                out.fire(
                    level,
                    "throttle",
                    format!(
                        "{name} for {:.1} s, {:.0} % of the loaded time (NVML's clock-event counter): check cooling and power delivery",
                        ns as f64 / 1e9,
                        share.min(1.0) * 100.0
                    ),
                );
            }
            continue;
        }
        let hits = t.throttle_loaded.get(bit as usize).copied().unwrap_or(0);
        if t.loaded > 0 && hits >= r.throttle_min_samples.max(1) {
            let share = hits as f64 / t.loaded as f64;
            if share >= r.throttle_min_share {
                out.fire(
                    level,
                    "throttle",
                    format!(
                        "{name} in {hits} of {} loaded samples ({:.0} %): check cooling and power delivery",
                        t.loaded,
                        share * 100.0
                    ),
                );
            }
        }
    }
}

fn clock_low(r: &HealthRules, t: &Bucket, out: &mut Sink) {
    if t.loaded > 0 && t.clock_low_loaded > 0 {
        let share = t.clock_low_loaded as f64 / t.loaded as f64;
        if share >= r.clock_low_min_share {
            out.fire(
                r.clock_low,
                "clock_low",
                format!(
                    "SM clock under {:.0} % of its {} MHz maximum in {:.0} % of loaded samples, with no throttle reason reported: the GPU ran slow for a cause NVML does not name (clock limits set with nvidia-smi -lgc, firmware)",
                    CLOCK_LOW_RATIO * 100.0,
                    t.sm_clock_max,
                    share * 100.0
                ),
            );
        }
    }
}

/// The time the GPU was loaded, from its loaded samples and the series'
/// mean spacing between samples.
fn loaded_ms(t: &Bucket) -> f64 {
    if t.n < 2 {
        return 0.0;
    }
    let spacing = t.end_ms.saturating_sub(t.start_ms) as f64 / (t.n - 1) as f64;
    t.loaded as f64 * spacing
}

#[cfg(test)]
mod tests;

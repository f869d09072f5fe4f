//! A GPU left idle: judged only over the samples of its rank's measured
//! phase, since set-up, warm-up and checks leave any GPU idle for a while.

mod phase;

pub use phase::{measured_windows, Windows};

pub mod defaults;

use super::health::rules::HealthRules;
use super::health::run::Sink;
use super::Phase;
use crate::judge::series::Bucket;

pub(super) fn check(r: &HealthRules, measured: &Bucket, out: &mut Sink) {
    let m = measured;
    if m.n >= r.idle_min_samples.max(1) && m.util_low as f64 / m.n as f64 > r.idle_share {
        out.fire_in(
            r.idle,
            "idle",
            format!(
                "under 10 % utilisation in {:.0} % of the {} samples taken while the workload ran its measured phase (set-up, warm-up, verification and sweeps not counted)",
                m.util_low as f64 * 100.0 / m.n as f64,
                m.n
            ),
            Phase::Measured,
        );
    }
}

#[cfg(test)]
mod tests;

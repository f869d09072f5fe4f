//! What the telemetry checks' tests share: a GPU's totals at full load
//! with nothing wrong, and the rules that fired on them by level and name.

use crate::judge::checks::health::HealthRules;
use crate::judge::checks::Level;
use crate::judge::series::Bucket;

pub fn loaded(n: u32) -> Bucket {
    Bucket {
        n,
        loaded: n,
        start_ms: 0,
        end_ms: 60_000,
        temp_max: 60.0,
        pcie_gen_max: 5,
        pcie_width_max: 16,
        pcie_gen_loaded_min: 5,
        pcie_width_loaded_min: 16,
        throttle_loaded: vec![0; 16],
        first: Some(Box::default()),
        last: Some(Box::default()),
        ..Default::default()
    }
}

/// The rules that fired on `t`, by level and name.
pub fn rules_of(r: &HealthRules, t: &Bucket) -> Vec<(Level, String)> {
    r.evaluate(t)
        .into_iter()
        .map(|f| (f.level, f.rule))
        .collect()
}

/// What a test expects [`rules_of`] to give.
pub fn want(fired: &[(Level, &str)]) -> Vec<(Level, String)> {
    fired.iter().map(|(l, r)| (*l, r.to_string())).collect()
}

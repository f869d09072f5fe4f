//! Heat under the default rules: warn from 90 °C, fail from 95 °C.

use crate::judge::checks::health::fixtures::{loaded, rules_of, want};
use crate::judge::checks::health::HealthRules;
use crate::judge::checks::Level;

#[test]
fn the_hottest_sample_warns_then_fails() {
    let r = HealthRules::default();
    let mut t = loaded(100);
    t.temp_max = 89.0;
    assert!(rules_of(&r, &t).is_empty());
    t.temp_max = 91.0;
    assert_eq!(rules_of(&r, &t), want(&[(Level::Warn, "temperature")]));
    t.temp_max = 96.0;
    assert_eq!(rules_of(&r, &t), want(&[(Level::Fail, "temperature")]));
    // A rules file moves the temperatures, not the levels.
    let r = HealthRules::from_toml("temperature_warn_c = 97\ntemperature_fail_c = 99").unwrap();
    assert!(rules_of(&r, &t).is_empty());
}

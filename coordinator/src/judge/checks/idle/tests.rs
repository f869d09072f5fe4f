//! `idle` judged over the measured phase alone.

use crate::judge::checks::health::fixtures::loaded;
use crate::judge::checks::health::HealthRules;

#[test]
fn idle_counts_only_the_measured_phase() {
    let r = HealthRules::default();
    // 60 samples, 40 of them set-up at no load.
    let mut whole = loaded(60);
    whole.util_low = 40;
    let measured = loaded(20);
    assert!(r.evaluate_in(&whole, Some(&measured)).is_empty());
    assert!(
        r.evaluate_in(&whole, None).is_empty(),
        "unknown: not judged"
    );
    // A 5-sample sweep with 3 low samples says nothing yet.
    let mut short = loaded(5);
    short.util_low = 3;
    assert!(r.evaluate_in(&whole, Some(&short)).is_empty());
    let mut idle = loaded(20);
    idle.util_low = 15;
    let f = r.evaluate_in(&whole, Some(&idle));
    assert_eq!(f.len(), 1);
    assert!(
        f[0].detail.contains("75 % of the 20 samples"),
        "{}",
        f[0].detail
    );
}

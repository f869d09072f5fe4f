//! PCIe replays and links under the default rules.

use crate::judge::checks::health::fixtures::{loaded, rules_of, want};
use crate::judge::checks::health::HealthRules;
use crate::judge::checks::Level;

#[test]
fn replays_over_the_rate_warn_and_a_narrow_link_fails() {
    let r = HealthRules::default();
    // 8 replays a minute is allowed, 9 is not.
    let mut t = loaded(100);
    t.last.as_mut().unwrap().pcie_replays = 8;
    assert!(r.evaluate(&t).is_empty());
    t.last.as_mut().unwrap().pcie_replays = 9;
    assert_eq!(rules_of(&r, &t), want(&[(Level::Warn, "pcie_replay")]));

    // Link width under max while loaded fails; gen under max warns.
    let mut t = loaded(100);
    t.pcie_width_low_loaded = 100;
    t.pcie_width_loaded_min = 8;
    t.pcie_gen_low_loaded = 30;
    t.pcie_gen_loaded_min = 4;
    let f = r.evaluate(&t);
    assert_eq!(
        f.iter()
            .map(|x| (x.level, x.rule.as_str()))
            .collect::<Vec<_>>(),
        vec![(Level::Fail, "pcie_link"), (Level::Warn, "pcie_link")]
    );
    assert!(f[0].detail.contains("Gen4 x8"), "{}", f[0].detail);
    // A brief dip under the share does not fire.
    t.pcie_width_low_loaded = 10;
    t.pcie_gen_low_loaded = 10;
    assert!(r.evaluate(&t).is_empty());
}

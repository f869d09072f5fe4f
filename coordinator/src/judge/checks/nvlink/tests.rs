//! NVLink's rules under the defaults.

use crate::judge::checks::health::fixtures::{loaded, rules_of, want};
use crate::judge::checks::health::HealthRules;
use crate::judge::checks::Level;

#[test]
fn nvlink_rules_need_persistence_and_real_error_counters() {
    let r = HealthRules::default();
    let mut t = loaded(300);
    t.nvlinks_expected = 18;
    t.nvlink_n = 300;
    // Down in 9 samples, scattered or in one stretch under the rule's 10:
    // a misread, not a link down.
    (t.nvlink_down_n, t.nvlink_down_run, t.nvlink_down_worst) = (9, 9, 15);
    assert!(rules_of(&r, &t).is_empty(), "{:?}", r.evaluate(&t));
    t.nvlink_down_run = 10;
    let f = r.evaluate(&t);
    assert_eq!(f[0].rule, "nvlink");
    assert!(
        f[0].detail.contains("15 of 18") && f[0].detail.contains("10 consecutive samples"),
        "{}",
        f[0].detail
    );
    // The data CRC counter as healthy H100s under NVLink load moved it
    // (~250 a second, nvidia-smi: 0 CRC errors) is not judged alone.
    let mut t = loaded(300);
    t.end_ms = 300_000;
    t.last.as_mut().unwrap().nvlink_crc_data = 300 * 250;
    assert!(rules_of(&r, &t).is_empty());
    t.last.as_mut().unwrap().nvlink_crc_flit = 300 * 150;
    assert_eq!(rules_of(&r, &t), want(&[(Level::Warn, "nvlink_crc")]));
    t.last.as_mut().unwrap().nvlink_crc_flit = 0;
    // An older agent's sum is still read.
    t.last.as_mut().unwrap().nvlink_crc_data = 0;
    t.last.as_mut().unwrap().nvlink_crc_errors = 5 * 7_000;
    assert_eq!(rules_of(&r, &t), want(&[(Level::Warn, "nvlink_crc")]));
    let mut t = loaded(60);
    t.last.as_mut().unwrap().nvlink_replay = 2;
    t.last.as_mut().unwrap().nvlink_recovery = 1;
    assert_eq!(
        rules_of(&r, &t),
        want(&[
            (Level::Warn, "nvlink_replay"),
            (Level::Fail, "nvlink_recovery")
        ])
    );
}

//! ECC and retired pages under the default rules.

use crate::judge::checks::health::fixtures::{loaded, rules_of, want};
use crate::judge::checks::health::HealthRules;
use crate::judge::checks::Level;

#[test]
fn uncorrectable_errors_and_too_many_retired_pages_fail() {
    let r = HealthRules::default();
    let mut t = loaded(100);
    t.last.as_mut().unwrap().ecc_uncorrected = 1;
    t.last.as_mut().unwrap().retired_pages = 63;
    assert_eq!(
        rules_of(&r, &t),
        want(&[
            (Level::Fail, "ecc_uncorrected"),
            (Level::Fail, "retired_pages"),
            (Level::Warn, "retired_pages")
        ])
    );
}

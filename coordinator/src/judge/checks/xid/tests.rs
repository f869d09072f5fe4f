//! XIDs under the default rules: a critical one fails, any other warns.

use crate::judge::checks::health::fixtures::loaded;
use crate::judge::checks::health::HealthRules;
use crate::judge::checks::Level;

#[test]
fn a_critical_xid_fails_and_another_warns() {
    let r = HealthRules::default();
    let mut t = loaded(100);
    t.xids = vec![13, 79];
    let f = r.evaluate(&t);
    assert_eq!(
        f.iter()
            .map(|x| (x.level, x.rule.as_str()))
            .collect::<Vec<_>>(),
        vec![(Level::Fail, "xid"), (Level::Warn, "xid")]
    );
    assert!(f[0].detail.contains("79") && !f[0].detail.contains("13"));
}

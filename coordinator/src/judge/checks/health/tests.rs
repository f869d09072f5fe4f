//! The settings file, and every family under the defaults at once: each
//! fires on what it should, in the order reports list it, and stays quiet
//! under its limits.

use super::fixtures::{loaded, rules_of, want};
use super::*;
use crate::judge::checks::clocks::{HW_THERMAL, SW_THERMAL};
use crate::judge::checks::{Level, Severity};

#[test]
fn files_override_defaults_and_typos_are_refused() {
    let r = HealthRules::from_toml(
        "critical_xids = [79]\nother_xid = \"off\"\npcie_width_below_max = \"warn\"\ntemperature_warn_c = 80\n",
    )
    .unwrap();
    assert_eq!(r.critical_xids, vec![79]);
    assert_eq!(r.other_xid, Severity::Off);
    assert_eq!(r.pcie_width_below_max, Severity::Warn);
    assert_eq!(r.temperature_warn_c, 80.0);
    assert_eq!(
        r.ecc_uncorrected,
        Severity::Fail,
        "untouched keys keep defaults"
    );

    let j = HealthRules::from_json(r#"{"retired_pages_limit": 10, "idle": "fail"}"#).unwrap();
    assert_eq!((j.retired_pages_limit, j.idle), (10, Severity::Fail));

    let err = format!(
        "{:#}",
        HealthRules::from_toml("ecc_uncorected = \"off\"").unwrap_err()
    );
    assert!(err.contains("ecc_uncorected"), "{err}");
    let err = format!(
        "{:#}",
        HealthRules::from_toml("idle = \"maybe\"").unwrap_err()
    );
    assert!(err.contains("maybe"), "{err}");
    let err = format!(
        "{:#}",
        HealthRules::from_toml("temperature_fail_c = 70").unwrap_err()
    );
    assert!(err.contains("temperature_warn_c"), "{err}");
    assert!(HealthRules::from_json(r#"{"idle_share": 2}"#).is_err());

    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("rules.json");
    std::fs::write(&p, r#"{"hw_slowdown": "warn"}"#).unwrap();
    assert_eq!(HealthRules::load(&p).unwrap().hw_slowdown, Severity::Warn);
    let err = format!(
        "{:#}",
        HealthRules::load(&dir.path().join("no.toml")).unwrap_err()
    );
    assert!(err.contains("no.toml"), "{err}");
}

#[test]
fn defaults_fire_as_issue_4_lists() {
    let r = HealthRules::default();
    assert!(r.evaluate(&loaded(100)).is_empty());

    let mut t = loaded(100);
    t.throttle_loaded[HW_THERMAL as usize] = 20;
    t.throttle_loaded[SW_THERMAL as usize] = 20;
    t.throttle_loaded[2] = 100; // software power cap: normal at full load
    t.nvlinks_expected = 18;
    t.nvlink_n = 100;
    (t.nvlink_down_n, t.nvlink_down_run, t.nvlink_down_worst) = (12, 12, 1);
    // Over DCGM's 100 a second, in one minute.
    t.last.as_mut().unwrap().nvlink_crc_flit = 7_000;
    t.temp_max = 91.0;
    assert_eq!(
        rules_of(&r, &t),
        want(&[
            (Level::Warn, "nvlink"),
            (Level::Warn, "nvlink_crc"),
            (Level::Fail, "throttle"),
            (Level::Warn, "throttle"),
            (Level::Warn, "temperature"),
        ])
    );
    t.temp_max = 96.0;
    assert!(rules_of(&r, &t).contains(&(Level::Fail, "temperature".to_string())));

    let mut t = loaded(20);
    t.loaded = 0;
    t.util_low = 19;
    t.remap_failed = true;
    assert_eq!(
        rules_of(&r, &t),
        want(&[(Level::Fail, "row_remap"), (Level::Warn, "idle")])
    );

    // Off silences a rule.
    let quiet = HealthRules::from_toml("row_remap_failed = \"off\"\nidle = \"off\"").unwrap();
    assert!(quiet.evaluate(&t).is_empty());
}

//! The health rules against made-up GPU totals: each family fires on what
//! it should, in the order reports list it, and stays quiet under its limits.

use super::*;

#[test]
fn files_override_defaults_and_typos_are_refused() {
    let r = HealthRules::from_toml(
        "critical_xids = [79]\nother_xid = \"off\"\npcie_width_below_max = \"warn\"\ntemperature_warn_c = 80\n",
    )
    .unwrap();
    assert_eq!(r.critical_xids, vec![79]);
    assert_eq!(r.other_xid, Level::Off);
    assert_eq!(r.pcie_width_below_max, Level::Warn);
    assert_eq!(r.temperature_warn_c, 80.0);
    assert_eq!(
        r.ecc_uncorrected,
        Level::Fail,
        "untouched keys keep defaults"
    );

    let j = HealthRules::from_json(r#"{"retired_pages_limit": 10, "idle": "fail"}"#).unwrap();
    assert_eq!((j.retired_pages_limit, j.idle), (10, Level::Fail));

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
    assert_eq!(HealthRules::load(&p).unwrap().hw_slowdown, Level::Warn);
    let err = format!(
        "{:#}",
        HealthRules::load(&dir.path().join("no.toml")).unwrap_err()
    );
    assert!(err.contains("no.toml"), "{err}");
}

fn loaded(n: u32) -> Bucket {
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
        first: Some(Counters::default()),
        last: Some(Counters::default()),
        ..Default::default()
    }
}

/// A 15-second stress on a healthy H100 (2026-11-27): one loaded sample
/// of 14 showed the hardware thermal bit. One look is not a slowdown's
/// length: it fails only from two samples on, or from NVML's counter.
#[test]
fn a_slowdown_is_timed_by_the_counters_or_needs_two_samples() {
    let r = HealthRules::default();
    let mut t = loaded(14);
    t.end_ms = 13_000;
    t.throttle_loaded[HW_SLOWDOWN as usize] = 1;
    t.throttle_loaded[HW_THERMAL as usize] = 1;
    assert!(rules_of(&r, &t).is_empty(), "{:?}", r.evaluate(&t));
    t.throttle_loaded[HW_THERMAL as usize] = 2;
    let f = r.evaluate(&t);
    assert_eq!(rules_of(&r, &t), vec![(Level::Fail, "throttle")]);
    assert!(
        f[0].detail.contains("in 2 of 14 loaded samples"),
        "{}",
        f[0].detail
    );

    // The counters, where read, decide for their causes: 0.3 s of 14 s
    // held down is 2 %, under the 5 % share, whatever the bits say.
    t.first.as_mut().unwrap().hw_thermal_ns = Some(5_000_000_000);
    t.last.as_mut().unwrap().hw_thermal_ns = Some(5_300_000_000);
    assert!(rules_of(&r, &t).is_empty(), "{:?}", r.evaluate(&t));
    // 2 s of 14 s is 14 %: fails, timed.
    t.last.as_mut().unwrap().hw_thermal_ns = Some(7_000_000_000);
    let f = r.evaluate(&t);
    assert_eq!(rules_of(&r, &t), vec![(Level::Fail, "throttle")]);
    assert!(
        f[0].detail
            .contains("for 2.0 s, 14 % of the loaded time (NVML's clock-event counter)"),
        "{}",
        f[0].detail
    );
    // Software thermal timed by its own counter warns; no bit needed.
    t.last.as_mut().unwrap().hw_thermal_ns = Some(5_000_000_000);
    t.first.as_mut().unwrap().sw_thermal_ns = Some(0);
    t.last.as_mut().unwrap().sw_thermal_ns = Some(3_000_000_000);
    assert_eq!(rules_of(&r, &t), vec![(Level::Warn, "throttle")]);
    // A counter read at one end only is not a time: the bits decide.
    t.first.as_mut().unwrap().sw_thermal_ns = None;
    assert!(rules_of(&r, &t).is_empty(), "{:?}", r.evaluate(&t));
}

fn rules_of(r: &HealthRules, t: &Bucket) -> Vec<(Level, &'static str)> {
    r.evaluate(t).iter().map(|f| (f.level, f.rule)).collect()
}

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
    assert_eq!(rules_of(&r, &t), vec![(Level::Warn, "nvlink_crc")]);
    t.last.as_mut().unwrap().nvlink_crc_flit = 0;
    // An older agent's sum is still read.
    t.last.as_mut().unwrap().nvlink_crc_data = 0;
    t.last.as_mut().unwrap().nvlink_crc_errors = 5 * 7_000;
    assert_eq!(rules_of(&r, &t), vec![(Level::Warn, "nvlink_crc")]);
    let mut t = loaded(60);
    t.last.as_mut().unwrap().nvlink_replay = 2;
    t.last.as_mut().unwrap().nvlink_recovery = 1;
    assert_eq!(
        rules_of(&r, &t),
        vec![
            (Level::Warn, "nvlink_replay"),
            (Level::Fail, "nvlink_recovery")
        ]
    );
}

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

#[test]
fn a_low_clock_with_no_reason_warns_and_a_power_capped_one_does_not() {
    use gpuctl_proto::pb::GpuSample;
    let r = HealthRules::default();
    let sample = |clock: u32, reasons: u64| GpuSample {
        sm_clock_mhz: clock,
        sm_clock_max_mhz: 1980,
        throttle_reasons: reasons,
        ..gpuctl_testkit::gpu::healthy(0)
    };
    let run = |s: &GpuSample| {
        let mut t = Bucket::of(s, 0);
        for i in 1..10 {
            t.merge(&Bucket::of(s, i * 1000));
        }
        t
    };
    // 1200 MHz, nothing reported: something NVML does not name holds it back.
    let fired = rules_of(&r, &run(&sample(1200, 0)));
    assert_eq!(fired, vec![(Level::Warn, "clock_low")]);
    let detail = &r.evaluate(&run(&sample(1200, 0)))[0].detail;
    assert!(
        detail.contains("1980 MHz") && detail.contains("100 %"),
        "{detail}"
    );
    // The same clock on the software power cap is a GPU at full power.
    assert!(rules_of(&r, &run(&sample(1200, 0x4))).is_empty());
    // At 1900 MHz nothing is low.
    assert!(rules_of(&r, &run(&sample(1900, 0))).is_empty());
    // Unknown maximum: no judgement.
    let mut unknown = sample(1200, 0);
    unknown.sm_clock_max_mhz = 0;
    assert!(rules_of(&r, &run(&unknown)).is_empty());
}

#[test]
fn defaults_fire_as_issue_4_lists() {
    let r = HealthRules::default();
    assert!(r.evaluate(&loaded(100)).is_empty());

    let mut t = loaded(100);
    t.xids = vec![13, 79];
    let f = r.evaluate(&t);
    assert_eq!(
        f.iter().map(|x| (x.level, x.rule)).collect::<Vec<_>>(),
        vec![(Level::Fail, "xid"), (Level::Warn, "xid")]
    );
    assert!(f[0].detail.contains("79") && !f[0].detail.contains("13"));

    let mut t = loaded(100);
    t.last.as_mut().unwrap().ecc_uncorrected = 1;
    t.last.as_mut().unwrap().retired_pages = 63;
    assert_eq!(
        rules_of(&r, &t),
        vec![
            (Level::Fail, "ecc_uncorrected"),
            (Level::Fail, "retired_pages"),
            (Level::Warn, "retired_pages")
        ]
    );

    // 8 replays a minute is allowed, 9 is not.
    let mut t = loaded(100);
    t.last.as_mut().unwrap().pcie_replays = 8;
    assert!(r.evaluate(&t).is_empty());
    t.last.as_mut().unwrap().pcie_replays = 9;
    assert_eq!(rules_of(&r, &t), vec![(Level::Warn, "pcie_replay")]);

    // Link width under max while loaded fails; gen under max warns.
    let mut t = loaded(100);
    t.pcie_width_low_loaded = 100;
    t.pcie_width_loaded_min = 8;
    t.pcie_gen_low_loaded = 30;
    t.pcie_gen_loaded_min = 4;
    let f = r.evaluate(&t);
    assert_eq!(
        f.iter().map(|x| (x.level, x.rule)).collect::<Vec<_>>(),
        vec![(Level::Fail, "pcie_link"), (Level::Warn, "pcie_link")]
    );
    assert!(f[0].detail.contains("Gen4 x8"), "{}", f[0].detail);
    // A brief dip under the share does not fire.
    t.pcie_width_low_loaded = 10;
    t.pcie_gen_low_loaded = 10;
    assert!(r.evaluate(&t).is_empty());

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
        vec![
            (Level::Warn, "nvlink"),
            (Level::Warn, "nvlink_crc"),
            (Level::Fail, "throttle"),
            (Level::Warn, "throttle"),
            (Level::Warn, "temperature"),
        ]
    );
    t.temp_max = 96.0;
    assert!(rules_of(&r, &t).contains(&(Level::Fail, "temperature")));

    let mut t = loaded(20);
    t.loaded = 0;
    t.util_low = 19;
    t.remap_failed = true;
    assert_eq!(
        rules_of(&r, &t),
        vec![(Level::Fail, "row_remap"), (Level::Warn, "idle")]
    );

    // Off silences a rule.
    let quiet = HealthRules::from_toml("row_remap_failed = \"off\"\nidle = \"off\"").unwrap();
    assert!(quiet.evaluate(&t).is_empty());
}

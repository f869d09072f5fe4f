//! Slowdowns and low clocks under the default rules.

use super::{HW_SLOWDOWN, HW_THERMAL};
use crate::judge::checks::health::fixtures::{loaded, rules_of, want};
use crate::judge::checks::health::HealthRules;
use crate::judge::checks::Level;
use crate::judge::series::Bucket;

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
    assert_eq!(rules_of(&r, &t), want(&[(Level::Fail, "throttle")]));
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
    assert_eq!(rules_of(&r, &t), want(&[(Level::Fail, "throttle")]));
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
    assert_eq!(rules_of(&r, &t), want(&[(Level::Warn, "throttle")]));
    // A counter read at one end only is not a time: the bits decide.
    t.first.as_mut().unwrap().sw_thermal_ns = None;
    assert!(rules_of(&r, &t).is_empty(), "{:?}", r.evaluate(&t));
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
    assert_eq!(fired, want(&[(Level::Warn, "clock_low")]));
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

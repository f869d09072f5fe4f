//! The job's GPU telemetry over time (`GetTimeline`): four small plots —
//! utilisation, power, temperature, SM clock — with one line per GPU and the
//! periods in which a GPU reported a throttle reason shaded, the reasons
//! named in the legend. CPU ranks have no telemetry: a note says so.

use std::collections::BTreeSet;

use anyhow::Result;
use gpuctl_proto::pb;

use super::chart::{self, Key, Swatch};
use super::lines::{Lines, Series};
use super::plots::Figure;

/// NVML's clock-event (throttle) reason bits and their names.
const REASONS: [(u64, &str); 9] = [
    (0x1, "GPU idle"),
    (0x2, "application clocks setting"),
    (0x4, "software power cap"),
    (0x8, "hardware slowdown"),
    (0x10, "sync boost"),
    (0x20, "software thermal slowdown"),
    (0x40, "hardware thermal slowdown"),
    (0x80, "power brake slowdown"),
    (0x100, "display clock setting"),
];

/// Idle is not a slowdown: a GPU waiting for work reports it.
const IDLE: u64 = 0x1;

/// The names of the reason bits set in `bits`, idle left out.
pub fn reason_names(bits: u64) -> Vec<&'static str> {
    let mut names: Vec<&str> = REASONS
        .iter()
        .filter(|(b, _)| *b != IDLE && bits & b != 0)
        .map(|(_, n)| *n)
        .collect();
    let known = REASONS.iter().fold(0, |acc, (b, _)| acc | b);
    if bits & !known != 0 {
        names.push("other");
    }
    names
}

/// One telemetry figure: its id, title, y axis and how to read a point.
struct Metric {
    id: &'static str,
    title: &'static str,
    y_desc: &'static str,
    y_min_top: f64,
    value: fn(&pb::TelemetryPoint) -> f64,
}

const METRICS: [Metric; 4] = [
    Metric {
        id: "plot-util",
        title: "GPU utilisation",
        y_desc: "utilisation (%)",
        y_min_top: 100.0,
        value: |p| p.util_mean,
    },
    Metric {
        id: "plot-power",
        title: "Power draw",
        y_desc: "power (W)",
        y_min_top: 0.0,
        value: |p| p.power_mean_w,
    },
    Metric {
        id: "plot-temp",
        title: "Temperature",
        y_desc: "temperature (°C)",
        y_min_top: 0.0,
        value: |p| p.temp_mean_c,
    },
    Metric {
        id: "plot-clock",
        title: "SM clock",
        y_desc: "SM clock (MHz)",
        y_min_top: 0.0,
        value: |p| p.sm_clock_mean_mhz,
    },
];

/// The four telemetry plots, or a note when no GPU reported telemetry.
/// `t0_ms` is the job's start (time 0 of the x axes).
pub fn figures(timeline: &pb::Timeline, t0_ms: u64) -> Result<Vec<Figure>> {
    let gpus: Vec<&pb::GpuTimeline> = timeline
        .gpus
        .iter()
        .filter(|g| !g.points.is_empty())
        .collect();
    if gpus.is_empty() {
        return Ok(vec![Figure::note(
            "GPU telemetry",
            "No GPU telemetry: the job's ranks ran on CPUs, or no agent read a GPU during it.",
        )]);
    }
    let t0 = if t0_ms > 0 {
        t0_ms
    } else {
        gpus.iter()
            .flat_map(|g| g.points.iter().map(|p| p.start_unix_ms))
            .min()
            .unwrap_or(0)
    };
    let secs = |ms: u64| (ms as f64 - t0 as f64) / 1000.0;
    let mut bands = Vec::new();
    let mut bits = 0u64;
    for p in gpus.iter().flat_map(|g| &g.points) {
        if p.throttle_reasons & !IDLE != 0 {
            bits |= p.throttle_reasons;
            bands.push((
                secs(p.start_unix_ms),
                secs(p.end_unix_ms.max(p.start_unix_ms)),
            ));
        }
    }
    let reasons = reason_names(bits);
    let mut out = Vec::new();
    for m in &METRICS {
        let mut l = Lines::new(m.id, m.title, "time since the job started (s)", m.y_desc);
        l.height = 300;
        l.y_min_top = m.y_min_top;
        for (i, g) in gpus.iter().enumerate() {
            let pts = g
                .points
                .iter()
                .map(|p| {
                    (
                        secs((p.start_unix_ms + p.end_unix_ms.max(p.start_unix_ms)) / 2),
                        (m.value)(p),
                    )
                })
                .collect();
            let label = format!("{} GPU {}", g.node, g.index);
            l.series.push(Series::line(label, chart::colour(i), pts));
        }
        l.bands = bands.clone();
        if !reasons.is_empty() {
            l.legend_extra.push(Key::new(
                format!("throttled ({})", reasons.join(", ")),
                chart::SHADE,
                Swatch::Area,
            ));
        }
        out.push(Figure::Plot(l.plot()?));
    }
    if let Some(Figure::Plot(p)) = out.first_mut() {
        p.note = if reasons.is_empty() {
            "No GPU reported a throttle reason during the job.".into()
        } else {
            format!(
                "Shaded: a GPU reported a throttle reason ({}) in that period.",
                reasons.join(", ")
            )
        };
    }
    Ok(out)
}

/// The GPUs of the timeline, for the page's counts.
pub fn gpu_count(timeline: &pb::Timeline) -> usize {
    let set: BTreeSet<(&str, u32)> = timeline
        .gpus
        .iter()
        .filter(|g| !g.points.is_empty())
        .map(|g| (g.node.as_str(), g.index))
        .collect();
    set.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(s: u64, util: f64, throttle: u64) -> pb::TelemetryPoint {
        pb::TelemetryPoint {
            start_unix_ms: 1_000_000 + s * 1000,
            end_unix_ms: 1_000_000 + (s + 1) * 1000,
            samples: 4,
            util_mean: util,
            power_mean_w: 300.0 + util,
            temp_mean_c: 60.0,
            sm_clock_mean_mhz: 1800.0,
            throttle_reasons: throttle,
            ..Default::default()
        }
    }

    #[test]
    fn throttled_periods_are_shaded_and_named_but_idle_is_not() {
        let gpu = |node: &str, index: u32, throttle: u64| pb::GpuTimeline {
            node: node.into(),
            index,
            uuid: format!("GPU-{index}"),
            points: (0..10)
                .map(|s| point(s, 90.0, if s == 4 { throttle } else { IDLE }))
                .collect(),
        };
        let t = pb::Timeline {
            job_id: "j".into(),
            gpus: vec![gpu("n0", 0, 0x8 | 0x4), gpu("n0", 1, IDLE)],
        };
        let figs = figures(&t, 1_000_000).unwrap();
        assert_eq!(figs.len(), 4);
        for f in &figs {
            let Figure::Plot(p) = f else { panic!() };
            // Two GPUs: two lines, no dots past 40 points... 10 points: dots.
            assert_eq!(p.svg.matches("data-mark").count(), 2 * (1 + 10), "{}", p.id);
            let key = p.legend.last().unwrap();
            assert_eq!(
                key.label,
                "throttled (software power cap, hardware slowdown)"
            );
            // One shaded band, behind the lines, not a data mark.
            assert_eq!(p.svg.matches("fill=\"#999999\"").count(), 1, "{}", p.svg);
        }
        let Figure::Plot(util) = &figs[0] else {
            panic!()
        };
        assert!(util.note.starts_with("Shaded"), "{}", util.note);
        assert_eq!(gpu_count(&t), 2);
    }

    #[test]
    fn cpu_jobs_get_a_note() {
        let figs = figures(&pb::Timeline::default(), 0).unwrap();
        assert!(matches!(&figs[..], [Figure::Note { .. }]));
        assert_eq!(reason_names(0x1), Vec::<&str>::new());
        assert_eq!(reason_names(0x1000), vec!["other"]);
    }
}

//! `gpuctl watch JOB`: redraws the job's status table in place until the job
//! ends, then points at the report. Without a terminal it prints a line per
//! change instead (logs and CI want history, not redraws).

use std::io::{IsTerminal, Write};
use std::time::Duration;

use anyhow::Result;
use gpuctl_proto::pb;

use super::status::{self, ExtraColumns};
use crate::args::OutputFormat;
use crate::client::Coordinator;
use crate::exit::Exit;
use crate::output;

/// Per-rank GPU telemetry from the coordinator's latest samples: utilisation,
/// memory, temperature, power and slowdown flags beside each rank's progress
/// (whose METRICS column carries the workload's own figure: TFLOP/s, busbw,
/// samples/s). A rank is matched to its GPU by UUID, else by NVML index.
pub fn telemetry_columns(job: &pb::Job, latest: &[pb::TelemetryBatch]) -> ExtraColumns {
    let mut cols = ExtraColumns::default();
    let Some(plan) = &job.plan else {
        return cols;
    };
    if latest.iter().all(|b| b.samples.is_empty()) {
        return cols;
    }
    cols.headers = ["UTIL", "MEM", "TEMP", "POWER", "FLAGS"]
        .iter()
        .map(|h| h.to_string())
        .collect();
    for r in &plan.ranks {
        let sample = latest
            .iter()
            .filter(|b| b.node == r.node)
            .flat_map(|b| &b.samples)
            .find(|s| {
                if !r.gpu_uuid.is_empty() && !s.uuid.is_empty() {
                    s.uuid == r.gpu_uuid
                } else {
                    r.gpu_index == Some(s.index)
                }
            });
        if let Some(s) = sample {
            cols.cells.insert(r.rank, gpu_cells(s));
        }
    }
    cols
}

/// NVML throttle-reason bits worth a flag: the GPU slowed itself down.
const SLOWDOWNS: &[(u64, &str)] = &[
    (0x08, "hw-slowdown"),
    (0x20, "sw-thermal"),
    (0x40, "hw-thermal"),
    (0x80, "power-brake"),
];

fn gpu_cells(s: &pb::GpuSample) -> Vec<String> {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let mut flags: Vec<String> = SLOWDOWNS
        .iter()
        .filter(|(bit, _)| s.throttle_reasons & bit != 0)
        .map(|(_, name)| name.to_string())
        .collect();
    if !s.xids.is_empty() {
        let x: Vec<String> = s.xids.iter().map(u32::to_string).collect();
        flags.push(format!("XID {}", x.join(",")));
    }
    if s.nvlinks_expected > 0 && s.nvlinks_active < s.nvlinks_expected {
        flags.push(format!(
            "nvlink {}/{}",
            s.nvlinks_active, s.nvlinks_expected
        ));
    }
    vec![
        format!("{:.0}%", s.util_gpu),
        if s.mem_total_bytes > 0 {
            format!(
                "{:.1}/{:.0} GiB",
                gib(s.mem_used_bytes),
                gib(s.mem_total_bytes)
            )
        } else {
            format!("{:.1} GiB", gib(s.mem_used_bytes))
        },
        format!("{:.0}°C", s.temperature_c),
        if s.power_limit_w > 0.0 {
            format!("{:.0}/{:.0} W", s.power_w, s.power_limit_w)
        } else {
            format!("{:.0} W", s.power_w)
        },
        output::dash(&flags.join(" ")),
    ]
}

/// What changes between two polls; a non-terminal prints a line only then.
fn fingerprint(job: &pb::Job) -> String {
    let mut parts = vec![format!("{}:{}", job.state, job.results_in)];
    let mut progress: Vec<&pb::RankProgress> = job.progress.iter().collect();
    progress.sort_by_key(|p| p.rank);
    for p in progress {
        parts.push(format!("{}:{}:{:.0}", p.rank, p.phase, p.fraction * 20.0));
    }
    parts.join(",")
}

/// One line for logs: state, results, and each rank's phase and fraction.
pub fn summary_line(job: &pb::Job, now: u64) -> String {
    let mut s = format!(
        "{} {} {}",
        job.id,
        output::job_state(job),
        output::fmt_duration_opt(output::job_duration_ms(job, now))
    );
    let mut progress: Vec<&pb::RankProgress> = job.progress.iter().collect();
    progress.sort_by_key(|p| p.rank);
    for p in progress {
        s.push_str(&format!(
            " | rank {} {} {:.0}%",
            p.rank,
            output::dash(&p.phase),
            p.fraction * 100.0
        ));
        if !p.metrics.is_empty() {
            s.push_str(&format!(" {}", output::fmt_metrics(&p.metrics)));
        }
    }
    s
}

pub async fn run(
    c: &mut Coordinator,
    id: &str,
    interval: Duration,
    out: OutputFormat,
) -> Result<Exit> {
    let tty = std::io::stdout().is_terminal();
    let mut last = String::new();
    loop {
        let job = c.job(id).await?;
        let now = gpuctl_proto::now_ms();
        let done = job.state().is_terminal();
        let fp = fingerprint(&job);
        match out {
            // One compact job object per change: easy to consume line by line.
            OutputFormat::Json => {
                if fp != last || done {
                    println!("{}", output::json::job(&job));
                }
            }
            OutputFormat::Table if tty => {
                // Telemetry is a nicety: an older coordinator or a CPU job has none.
                let latest = if done {
                    Vec::new()
                } else {
                    c.telemetry(id).await.unwrap_or_default()
                };
                let body = status::render(&job, now, &telemetry_columns(&job, &latest));
                let mut o = std::io::stdout().lock();
                // Home + clear screen: redraw in place like `watch(1)`.
                let _ = write!(o, "\x1b[H\x1b[2J{body}");
                if !done {
                    let _ = writeln!(
                        o,
                        "\nrefreshing every {}; Ctrl-C to stop watching (the job goes on)",
                        humanize(interval)
                    );
                }
                let _ = o.flush();
            }
            _ => {
                if fp != last || done {
                    println!("{}", summary_line(&job, now));
                }
            }
        }
        last = fp;
        if done {
            if out == OutputFormat::Table {
                eprintln!(
                    "job {} {}; see `gpuctl report {}`",
                    job.id,
                    output::job_state(&job),
                    job.id
                );
            }
            return Ok(Exit::of_job(&job));
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = tokio::signal::ctrl_c() => {
                eprintln!("stopped watching; {id} goes on");
                return Ok(Exit::Interrupted);
            }
        }
    }
}

fn humanize(d: Duration) -> String {
    gpuctl_proto::units::format_duration_ms(d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn telemetry_lands_on_the_rank_of_its_gpu() {
        let job = pb::Job {
            plan: Some(pb::Plan {
                ranks: vec![
                    pb::RankPlacement {
                        rank: 0,
                        node: "a".into(),
                        gpu_index: Some(0),
                        gpu_uuid: "GPU-a0".into(),
                        ..Default::default()
                    },
                    pb::RankPlacement {
                        rank: 1,
                        node: "b".into(),
                        gpu_index: Some(1),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(telemetry_columns(&job, &[]).headers.is_empty());
        let latest = vec![
            pb::TelemetryBatch {
                node: "a".into(),
                samples: vec![pb::GpuSample {
                    index: 0,
                    uuid: "GPU-a0".into(),
                    util_gpu: 97.4,
                    mem_used_bytes: 70 << 30,
                    mem_total_bytes: 141 << 30,
                    temperature_c: 64.0,
                    power_w: 651.0,
                    power_limit_w: 700.0,
                    throttle_reasons: 0x40 | 0x4,
                    xids: vec![79],
                    ..Default::default()
                }],
                ..Default::default()
            },
            pb::TelemetryBatch {
                node: "b".into(),
                samples: vec![pb::GpuSample {
                    index: 1,
                    util_gpu: 3.0,
                    ..Default::default()
                }],
                ..Default::default()
            },
        ];
        let cols = telemetry_columns(&job, &latest);
        assert_eq!(cols.headers, vec!["UTIL", "MEM", "TEMP", "POWER", "FLAGS"]);
        assert_eq!(
            cols.cells[&0],
            vec![
                "97%",
                "70.0/141 GiB",
                "64°C",
                "651/700 W",
                "hw-thermal XID 79"
            ]
        );
        assert_eq!(cols.cells[&1][0], "3%", "matched by index without a UUID");
        let table = status::render(&job, 0, &cols);
        assert!(table.contains("hw-thermal XID 79"), "{table}");
    }
}

//! One job for `gpuctl status` (and `submit --wait` when it ends without a
//! report): its header, then a row per rank with its latest progress and,
//! while it runs, its GPU's latest telemetry.

use std::collections::BTreeMap;

use gpuctl_proto::pb;

use crate::output::{self, table::Table};

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
        if let Some(s) = output::gpu_sample(r, latest) {
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

/// Columns appended to the rank table by callers that know more per rank
/// (`watch` will add GPU telemetry here).
#[derive(Debug, Default)]
pub struct ExtraColumns {
    pub headers: Vec<String>,
    /// Cells by rank; a rank without an entry gets `-`.
    pub cells: BTreeMap<u32, Vec<String>>,
}

pub fn header(job: &pb::Job, now: u64) -> String {
    let spec = job.spec.clone().unwrap_or_default();
    let world = job.plan.as_ref().map(|p| p.world_size).unwrap_or(0);
    let mut pairs = vec![("JOB", job.id.clone())];
    if !spec.name.is_empty() {
        pairs.push(("NAME", spec.name.clone()));
    }
    pairs.extend([
        ("WORKLOAD", output::dash(&spec.workload)),
        ("STATE", output::job_state(job).to_string()),
        ("ATTEMPT", job.attempt.to_string()),
        ("NODES", super::jobs::nodes_cell(job)),
        ("CREATED", output::age(job.created_unix_ms, now)),
        (
            "DURATION",
            output::fmt_duration_opt(output::job_duration_ms(job, now)),
        ),
        (
            "RESULTS",
            if world > 0 {
                format!("{}/{world} ranks", job.results_in)
            } else {
                job.results_in.to_string()
            },
        ),
    ]);
    if !job.message.is_empty() {
        pairs.push(("MESSAGE", job.message.clone()));
    }
    if job.ranks_left_out > 0 || job.checks_left_out > 0 {
        pairs.push((
            "SHOWN",
            format!(
                "the {} ranks furthest behind and the checks that did not pass; -o json for all",
                job.progress
                    .len()
                    .max(job.plan.as_ref().map_or(0, |p| p.ranks.len()))
            ),
        ));
    }
    output::table::key_values(&pairs)
}

/// One row per planned rank (or per reporting rank when there is no plan yet).
pub fn ranks_table(job: &pb::Job, now: u64, extra: &ExtraColumns) -> String {
    let progress: BTreeMap<u32, &pb::RankProgress> =
        job.progress.iter().map(|p| (p.rank, p)).collect();
    let mut placements: BTreeMap<u32, (String, String)> = BTreeMap::new();
    if let Some(plan) = &job.plan {
        for r in &plan.ranks {
            placements.insert(r.rank, (r.node.clone(), r.device_label()));
        }
    }
    for p in progress.values() {
        placements
            .entry(p.rank)
            .or_insert_with(|| (p.node.clone(), String::new()));
    }
    let mut headers: Vec<String> = [
        "RANK", "NODE", "DEVICE", "PHASE", "PROGRESS", "METRICS", "UPDATED", "MESSAGE",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    headers.extend(extra.headers.iter().cloned());
    let mut t = Table::new(&headers).right(&[0, 4]);
    for (rank, (node, device)) in &placements {
        let p = progress.get(rank);
        let mut row = vec![
            rank.to_string(),
            node.clone(),
            output::dash(device),
            output::dash(p.map(|p| p.phase.as_str()).unwrap_or("")),
            p.map(|p| format!("{:.0}%", (p.fraction.clamp(0.0, 1.0)) * 100.0))
                .unwrap_or_else(|| "-".into()),
            output::dash(
                &p.map(|p| output::fmt_metrics(&p.metrics))
                    .unwrap_or_default(),
            ),
            p.map(|p| output::age(p.unix_ms, now))
                .unwrap_or_else(|| "-".into()),
            output::truncate(
                &output::dash(p.map(|p| p.message.as_str()).unwrap_or("")),
                50,
            ),
        ];
        match extra.cells.get(rank) {
            Some(cells) => row.extend(cells.iter().cloned()),
            None => row.extend(std::iter::repeat_n("-".to_string(), extra.headers.len())),
        }
        t.row(row);
    }
    t.render()
}

pub fn render(job: &pb::Job, now: u64, extra: &ExtraColumns) -> String {
    let mut s = header(job, now);
    let has_ranks =
        job.plan.as_ref().is_some_and(|p| !p.ranks.is_empty()) || !job.progress.is_empty();
    if has_ranks {
        s.push_str("\nRANKS\n");
        s.push_str(&ranks_table(job, now, extra));
    }
    s
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
        let table = render(&job, 0, &cols);
        assert!(table.contains("hw-thermal XID 79"), "{table}");
    }

    #[test]
    fn ranks_join_plan_and_progress() {
        let mut metrics = std::collections::HashMap::new();
        metrics.insert("tflops".to_string(), 12.34);
        let job = pb::Job {
            id: "job-000001".into(),
            state: pb::JobState::Running as i32,
            spec: Some(pb::JobSpec {
                workload: "stress".into(),
                node_count: 1,
                ..Default::default()
            }),
            started_unix_ms: 1_000,
            plan: Some(pb::Plan {
                nodes: vec!["local-0".into()],
                world_size: 2,
                ranks: vec![
                    pb::RankPlacement {
                        rank: 0,
                        node: "local-0".into(),
                        ..Default::default()
                    },
                    pb::RankPlacement {
                        rank: 1,
                        node: "local-0".into(),
                        local_rank: 1,
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }),
            progress: vec![pb::RankProgress {
                rank: 0,
                node: "local-0".into(),
                phase: "gemm".into(),
                fraction: 0.5,
                metrics,
                unix_ms: 10_000,
                ..Default::default()
            }],
            ..Default::default()
        };
        let s = render(
            &job,
            11_000,
            &ExtraColumns {
                headers: vec!["GPU UTIL".into()],
                cells: BTreeMap::new(),
            },
        );
        assert!(s.contains("STATE     running"), "{s}");
        assert!(s.contains("RESULTS   0/2 ranks"), "{s}");
        let r0 = s
            .lines()
            .find(|l| l.trim_start().starts_with("0   local-0"))
            .expect(&s);
        assert!(
            r0.contains("gemm")
                && r0.contains("50%")
                && r0.contains("12.3 TFLOP/s")
                && r0.contains("1s ago"),
            "{r0}"
        );
        let r1 = s
            .lines()
            .find(|l| l.trim_start().starts_with("1   local-0"))
            .expect(&s);
        assert!(r1.ends_with('-'), "{r1}");
        assert!(s.contains("GPU UTIL"));
    }
}

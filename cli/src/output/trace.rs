//! `gpuctl trace`: a job's timeline in the Chrome trace-event format (JSON
//! Object Format), which Perfetto and chrome://tracing open. One process per
//! node, one thread per rank: the rank's phases as complete events (a
//! collective's phase names its op and size, and carries its measured row),
//! its iteration counter and stress TFLOP/s as counter tracks; each GPU's
//! telemetry as counter tracks of its node; the job's start, end and verdict
//! as instant events.
//!
//! Times are microseconds from the job's start, so a trace reads from 0.

use std::collections::BTreeMap;

use gpuctl_core::units::format_bytes;
use gpuctl_proto::pb;
use serde_json::{json, Value};

/// Builds the trace of a finished (or running) job from its report and its
/// stored telemetry.
pub fn build(report: &pb::Report, timeline: &pb::Timeline) -> Value {
    let t0 = start_ms(report, timeline);
    let us = |ms: u64| (ms.saturating_sub(t0)) as f64 * 1000.0;
    let end_ms = report.finished_unix_ms.max(t0);

    // Nodes in report order get pids 1..; telemetry of a node not in the
    // report (should not happen) still gets its own.
    let mut pids: BTreeMap<String, u64> = BTreeMap::new();
    for n in &report.nodes {
        let next = pids.len() as u64 + 1;
        pids.entry(n.name.clone()).or_insert(next);
    }
    for g in &timeline.gpus {
        let next = pids.len() as u64 + 1;
        pids.entry(g.node.clone()).or_insert(next);
    }

    let mut ev: Vec<Value> = Vec::new();
    for (node, pid) in &pids {
        ev.push(meta("process_name", *pid, 0, json!({ "name": node })));
        ev.push(meta(
            "process_sort_index",
            *pid,
            0,
            json!({ "sort_index": pid }),
        ));
    }
    let rows = collective_rows(report);
    for n in &report.nodes {
        let pid = pids[&n.name];
        for r in &n.ranks {
            rank_events(&mut ev, pid, r, &rows, end_ms, &us);
        }
    }
    for g in &timeline.gpus {
        let pid = pids[&g.node];
        gpu_counters(&mut ev, pid, g, &us);
    }
    job_instants(&mut ev, report, t0, &us);

    json!({
        "traceEvents": ev,
        "displayTimeUnit": "ms",
        "otherData": {
            "job_id": report.job_id,
            "workload": report.workload,
            "verdict": report.verdict().label(),
            "start_unix_ms": t0,
            "tool": format!("gpuctl {}", env!("CARGO_PKG_VERSION")),
        },
    })
}

/// The trace's zero: the job's start, else the earliest thing seen.
fn start_ms(report: &pb::Report, timeline: &pb::Timeline) -> u64 {
    if report.started_unix_ms > 0 {
        return report.started_unix_ms;
    }
    let marks = report
        .nodes
        .iter()
        .flat_map(|n| &n.ranks)
        .filter_map(|r| r.result.as_ref())
        .flat_map(|r| r.phases.iter().map(|m| m.unix_ms));
    let points = timeline
        .gpus
        .iter()
        .flat_map(|g| g.points.iter().map(|p| p.start_unix_ms));
    marks.chain(points).filter(|&t| t > 0).min().unwrap_or(0)
}

fn meta(name: &str, pid: u64, tid: u64, args: Value) -> Value {
    json!({ "name": name, "ph": "M", "pid": pid, "tid": tid, "args": args })
}

/// The job's collective rows by their phase name (`all_reduce 1 MiB`), as the
/// worker names a sweep step.
fn collective_rows(report: &pb::Report) -> BTreeMap<String, &pb::CollectiveRow> {
    report
        .collectives
        .iter()
        .map(|r| (format!("{} {}", r.op, format_bytes(r.bytes)), r))
        .collect()
}

/// A rank's thread: name, phase spans, iteration counter, TFLOP/s.
fn rank_events(
    ev: &mut Vec<Value>,
    pid: u64,
    r: &pb::RankReport,
    rows: &BTreeMap<String, &pb::CollectiveRow>,
    end_ms: u64,
    us: &dyn Fn(u64) -> f64,
) {
    let tid = r.rank as u64;
    let device = match r.gpu_index {
        Some(i) => format!("GPU {i}"),
        None => r.device.clone(),
    };
    ev.push(meta(
        "thread_name",
        pid,
        tid,
        json!({ "name": format!("rank {} ({device})", r.rank) }),
    ));
    ev.push(meta(
        "thread_sort_index",
        pid,
        tid,
        json!({ "sort_index": tid }),
    ));
    let Some(res) = &r.result else {
        // No result: the last progress the coordinator saw is all there is.
        if r.last_progress_unix_ms > 0 {
            ev.push(json!({
                "name": format!("last progress: {}", r.last_phase),
                "ph": "i", "s": "t", "pid": pid, "tid": tid,
                "ts": us(r.last_progress_unix_ms),
                "args": { "iterations": r.iterations, "process_state": r.process_state,
                          "verdict": r.verdict().label(), "reason": r.reason },
            }));
        }
        return;
    };
    // The rank's end: its last mark, at least; the job's end when later.
    let rank_end = res.phases.last().map_or(end_ms, |m| m.unix_ms.max(end_ms));
    for span in spans(&res.phases, rank_end) {
        let mut args = json!({
            "iterations": span.iterations,
            "iterations_at_start": span.iterations_at_start,
        });
        if let Some(row) = rows.get(span.phase) {
            args["bytes"] = json!(row.bytes);
            args["dtype"] = json!(row.dtype);
            args["time_us"] = json!(row.time_us);
            args["algbw_gbps"] = json!(row.algbw_gbps);
            args["busbw_gbps"] = json!(row.busbw_gbps);
        }
        // The category is what the workload declared the stretch to be; the
        // health rules judge the measured stretches alone.
        ev.push(json!({
            "name": span.phase, "cat": kind_name(span.kind), "ph": "X", "pid": pid, "tid": tid,
            "ts": us(span.start_ms), "dur": (span.end_ms.saturating_sub(span.start_ms)) as f64 * 1000.0,
            "args": args,
        }));
    }
    let counter = format!("rank {} iterations", r.rank);
    for m in &res.phases {
        ev.push(json!({
            "name": counter, "ph": "C", "pid": pid, "ts": us(m.unix_ms),
            "args": { "iterations": m.iterations },
        }));
    }
    if let Some(pb::rank_result::Detail::Stress(s)) = &res.detail {
        stress_counter(ev, pid, r.rank, s, &res.phases, us);
    }
}

/// What a stretch's kind is called in a trace: `phase` where the worker
/// declared none.
pub(super) fn kind_name(kind: pb::PhaseKind) -> &'static str {
    match kind {
        pb::PhaseKind::Unspecified => "phase",
        pb::PhaseKind::Setup => "setup",
        pb::PhaseKind::Warmup => "warmup",
        pb::PhaseKind::Measured => "measured",
        pb::PhaseKind::Verify => "verify",
        pb::PhaseKind::Sweep => "sweep",
    }
}

/// One phase from its first mark to the next phase's first mark (a change
/// of kind within a phase starts a span too).
struct Span<'a> {
    phase: &'a str,
    kind: pb::PhaseKind,
    start_ms: u64,
    end_ms: u64,
    iterations_at_start: u64,
    /// Units of work done within the span.
    iterations: u64,
}

fn spans(marks: &[pb::PhaseMark], end_ms: u64) -> Vec<Span<'_>> {
    let mut out: Vec<Span> = Vec::new();
    for (i, m) in marks.iter().enumerate() {
        if out
            .last()
            .is_some_and(|s| s.phase == m.phase && s.kind == m.kind())
        {
            continue;
        }
        // The span runs until the next mark of another phase or kind.
        let next = marks[i..]
            .iter()
            .find(|n| n.phase != m.phase || n.kind != m.kind);
        let (end, end_iter) = match next {
            Some(n) => (n.unix_ms, n.iterations),
            None => (
                end_ms.max(m.unix_ms),
                marks.last().map_or(m.iterations, |l| l.iterations),
            ),
        };
        out.push(Span {
            phase: &m.phase,
            kind: m.kind(),
            start_ms: m.unix_ms,
            end_ms: end.max(m.unix_ms),
            iterations_at_start: m.iterations,
            iterations: end_iter.saturating_sub(m.iterations),
        });
    }
    out
}

/// Stress's TFLOP/s per sampling interval, laid from the start of its GEMM
/// phase (the first phase after the inputs are prepared).
fn stress_counter(
    ev: &mut Vec<Value>,
    pid: u64,
    rank: u32,
    s: &pb::StressResult,
    marks: &[pb::PhaseMark],
    us: &dyn Fn(u64) -> f64,
) {
    if s.tflops_per_interval.is_empty() || s.interval_s <= 0.0 {
        return;
    }
    let start = marks
        .iter()
        .find(|m| m.phase != "starting" && !m.phase.starts_with("preparing"))
        .or(marks.first())
        .map_or(0, |m| m.unix_ms);
    let name = format!("rank {rank} TFLOP/s");
    for (i, v) in s.tflops_per_interval.iter().enumerate() {
        let at = start + ((i as f64 + 1.0) * s.interval_s * 1000.0) as u64;
        ev.push(
            json!({ "name": name, "ph": "C", "pid": pid, "ts": us(at), "args": { "tflops": v } }),
        );
    }
}

/// A GPU's telemetry as counter tracks of its node, one point per bucket.
fn gpu_counters(ev: &mut Vec<Value>, pid: u64, g: &pb::GpuTimeline, us: &dyn Fn(u64) -> f64) {
    let gpu = format!("GPU {}", g.index);
    for p in &g.points {
        let ts = us(p.start_unix_ms);
        let mut push = |what: &str, key: &str, v: f64| {
            ev.push(
                json!({ "name": format!("{gpu} {what}"), "ph": "C", "pid": pid, "ts": ts,
                            "args": { key: v } }),
            );
        };
        push("utilisation %", "util", p.util_mean);
        push("power W", "watts", p.power_mean_w);
        push("temperature °C", "celsius", p.temp_mean_c);
        push("SM clock MHz", "mhz", p.sm_clock_mean_mhz);
        push(
            "memory GiB",
            "gib",
            p.mem_used_max_bytes as f64 / (1u64 << 30) as f64,
        );
        // Slowdowns the GPU imposed on itself, as a 0/1 track (idle is not one).
        push(
            "throttled",
            "slowdown",
            if p.throttle_reasons & !0x1 != 0 {
                1.0
            } else {
                0.0
            },
        );
    }
}

/// Global instants: the job's start and end (with the verdict), and every
/// finding at the end so it is one click away.
fn job_instants(ev: &mut Vec<Value>, report: &pb::Report, t0: u64, us: &dyn Fn(u64) -> f64) {
    ev.push(json!({
        "name": format!("{} started", report.workload), "ph": "i", "s": "g", "pid": 0, "tid": 0,
        "ts": us(t0), "args": { "job_id": report.job_id },
    }));
    if report.finished_unix_ms > 0 {
        ev.push(json!({
            "name": format!("verdict {}", report.verdict().label()),
            "ph": "i", "s": "g", "pid": 0, "tid": 0, "ts": us(report.finished_unix_ms),
            "args": {
                "reason": report.reason,
                "findings": report.findings.iter().map(|f| f.detail.clone()).collect::<Vec<_>>(),
            },
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(phase: &str, unix_ms: u64, iterations: u64) -> pb::PhaseMark {
        pb::PhaseMark {
            phase: phase.into(),
            unix_ms,
            iterations,
            ..Default::default()
        }
    }

    #[test]
    fn marks_become_spans_until_the_next_phase() {
        let marks = vec![
            mark("starting", 1_000, 0),
            mark("all_reduce 1 MiB", 1_500, 0),
            mark("all_reduce 1 MiB", 2_500, 40),
            mark("all_reduce 2 MiB", 3_000, 50),
            mark("done", 4_000, 100),
        ];
        let s = spans(&marks, 4_200);
        let names: Vec<&str> = s.iter().map(|s| s.phase).collect();
        assert_eq!(
            names,
            ["starting", "all_reduce 1 MiB", "all_reduce 2 MiB", "done"]
        );
        assert_eq!(
            (s[1].start_ms, s[1].end_ms, s[1].iterations),
            (1_500, 3_000, 50)
        );
        assert_eq!(
            (s[2].start_ms, s[2].end_ms, s[2].iterations),
            (3_000, 4_000, 50)
        );
        assert_eq!((s[3].start_ms, s[3].end_ms), (4_000, 4_200));
    }

    #[test]
    fn a_trace_names_nodes_and_ranks_and_attaches_collective_rows() {
        let result = pb::RankResult {
            rank: 1,
            node: "n1".into(),
            phases: vec![
                mark("all_reduce 1 MiB", 10_100, 0),
                mark("done", 10_900, 25),
            ],
            ..Default::default()
        };
        let report = pb::Report {
            job_id: "job-000001".into(),
            workload: "nccl".into(),
            started_unix_ms: 10_000,
            finished_unix_ms: 11_000,
            nodes: vec![pb::NodeReport {
                name: "n1".into(),
                ranks: vec![pb::RankReport {
                    rank: 1,
                    device: "cpu".into(),
                    result: Some(Box::new(result)),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            collectives: vec![pb::CollectiveRow {
                op: "all_reduce".into(),
                bytes: 1 << 20,
                busbw_gbps: 3.5,
                ..Default::default()
            }],
            ..Default::default()
        };
        let t = build(&report, &pb::Timeline::default());
        let ev = t["traceEvents"].as_array().unwrap();
        assert!(ev
            .iter()
            .any(|e| e["ph"] == "M" && e["args"]["name"] == "n1" && e["pid"] == 1));
        assert!(ev
            .iter()
            .any(|e| e["ph"] == "M" && e["args"]["name"] == "rank 1 (cpu)" && e["tid"] == 1));
        let x = ev
            .iter()
            .find(|e| e["ph"] == "X" && e["name"] == "all_reduce 1 MiB")
            .unwrap();
        assert_eq!(x["ts"], 100_000.0);
        assert_eq!(x["dur"], 800_000.0);
        assert_eq!(x["args"]["busbw_gbps"], 3.5);
        assert_eq!(x["args"]["iterations"], 25);
    }
}

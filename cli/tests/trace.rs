//! `gpuctl trace` on real processes: an nccl sweep and a stress job on two CPU
//! nodes, their traces read back as Chrome trace-event JSON and checked the
//! way Perfetto would read them: every event well formed, one named process
//! per node and one named thread per rank, the sweep's collectives as spans
//! with their sizes and measured rows, the iteration counter growing, and the
//! stress TFLOP/s as a counter track.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::*;
use serde_json::Value;

fn finished(c: &Cluster, args: &[&str]) -> String {
    let id = c.submit(args);
    let state = c.wait_state(
        &id,
        &["succeeded", "failed", "cancelled"],
        Duration::from_secs(120),
    );
    assert_eq!(state, "succeeded", "{id}: {}", c.logs());
    id
}

fn trace(c: &Cluster, id: &str) -> Value {
    let out = c.gpuctl(&["trace", id]);
    assert!(out.status.success(), "trace {id}: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("the trace is JSON")
}

/// What chrome://tracing and Perfetto need of every event.
fn well_formed(events: &[Value]) {
    for e in events {
        let ph = e["ph"].as_str().unwrap_or_else(|| panic!("no ph: {e}"));
        assert!(e["name"].is_string(), "no name: {e}");
        assert!(e["pid"].is_u64(), "no pid: {e}");
        match ph {
            "M" => assert!(e["args"].is_object(), "{e}"),
            "X" => {
                assert!(e["ts"].as_f64().unwrap() >= 0.0, "{e}");
                assert!(e["dur"].as_f64().unwrap() >= 0.0, "{e}");
                assert!(e["tid"].is_u64(), "{e}");
            }
            "C" => {
                assert!(e["ts"].as_f64().unwrap() >= 0.0, "{e}");
                let args = e["args"].as_object().expect("counter args");
                assert!(args.values().all(Value::is_number), "{e}");
            }
            "i" => assert!(e["ts"].as_f64().unwrap() >= 0.0, "{e}"),
            other => panic!("unexpected phase type {other}: {e}"),
        }
    }
}

/// Process names by pid and thread names by (pid, tid).
fn names(events: &[Value]) -> (BTreeMap<u64, String>, BTreeMap<(u64, u64), String>) {
    let mut procs = BTreeMap::new();
    let mut threads = BTreeMap::new();
    for e in events.iter().filter(|e| e["ph"] == "M") {
        let pid = e["pid"].as_u64().unwrap();
        let name = e["args"]["name"].as_str().map(str::to_string);
        match (e["name"].as_str().unwrap(), name) {
            ("process_name", Some(n)) => {
                procs.insert(pid, n);
            }
            ("thread_name", Some(n)) => {
                threads.insert((pid, e["tid"].as_u64().unwrap()), n);
            }
            _ => {}
        }
    }
    (procs, threads)
}

#[test]
fn traces_show_ranks_phases_collectives_and_counters() {
    let c = Cluster::start(2, 1);
    let nodes: BTreeSet<String> = (0..2).map(Cluster::agent_name).collect();

    let id = finished(
        &c,
        &[
            "nccl",
            "--nodes",
            "2",
            "--ops",
            "all_reduce,all_gather",
            "--min-bytes",
            "64K",
            "--max-bytes",
            "256K",
            "--iters",
            "5",
            "--warmup",
            "1",
        ],
    );
    let t = trace(&c, &id);
    assert_eq!(t["otherData"]["job_id"], id.as_str(), "{t}");
    assert_eq!(t["displayTimeUnit"], "ms");
    let ev = t["traceEvents"].as_array().expect("traceEvents[]");
    well_formed(ev);
    let (procs, threads) = names(ev);
    assert_eq!(
        procs.values().cloned().collect::<BTreeSet<_>>(),
        nodes,
        "one process per node: {procs:?}"
    );
    let ranks: BTreeSet<&str> = threads.values().map(String::as_str).collect();
    assert_eq!(
        ranks,
        BTreeSet::from(["rank 0 (cpu)", "rank 1 (cpu)"]),
        "{threads:?}"
    );

    // Every collective and size of the sweep is a span on both ranks, with
    // the job's measured row attached.
    for op in ["all_reduce", "all_gather"] {
        for size in ["64 KiB", "128 KiB", "256 KiB"] {
            let name = format!("{op} {size}");
            let spans: Vec<&Value> = ev
                .iter()
                .filter(|e| e["ph"] == "X" && e["name"] == name.as_str())
                .collect();
            assert_eq!(spans.len(), 2, "{name} on both ranks: {spans:?}");
            for s in spans {
                assert!(s["args"]["busbw_gbps"].as_f64().unwrap() > 0.0, "{s}");
                assert!(s["args"]["bytes"].as_u64().unwrap() > 0, "{s}");
                assert!(s["args"]["iterations"].as_u64().unwrap() > 0, "{s}");
            }
        }
    }
    // Spans of one rank follow each other in time.
    for tid in [0u64, 1] {
        let mut starts: Vec<(f64, f64)> = ev
            .iter()
            .filter(|e| e["ph"] == "X" && e["tid"] == tid)
            .map(|e| (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap()))
            .collect();
        starts.sort_by(|a, b| a.0.total_cmp(&b.0));
        for w in starts.windows(2) {
            assert!(
                w[0].0 + w[0].1 <= w[1].0 + 1.0,
                "overlap on rank {tid}: {w:?}"
            );
        }
    }
    let iterations: Vec<u64> = ev
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == "rank 0 iterations")
        .map(|e| e["args"]["iterations"].as_u64().unwrap())
        .collect();
    assert!(iterations.len() >= 2, "{iterations:?}");
    assert!(
        iterations.windows(2).all(|w| w[0] <= w[1]),
        "{iterations:?}"
    );
    assert!(*iterations.last().unwrap() > 0, "{iterations:?}");
    assert!(ev
        .iter()
        .any(|e| e["ph"] == "i" && e["name"] == "verdict pass"));

    // Stress: its TFLOP/s per interval as a counter of each rank, written to
    // a file with --out.
    let id = finished(
        &c,
        &[
            "stress",
            "--nodes",
            "2",
            "--duration",
            "4s",
            "--interval",
            "1s",
        ],
    );
    let path = c.dir.path().join("stress-trace.json");
    let out = c.gpuctl(&["trace", &id, "--out", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("perfetto"), "{}", stderr(&out));
    let t: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let ev = t["traceEvents"].as_array().unwrap();
    well_formed(ev);
    for rank in 0..2 {
        let name = format!("rank {rank} TFLOP/s");
        let n = ev
            .iter()
            .filter(|e| e["ph"] == "C" && e["name"] == name.as_str())
            .filter(|e| e["args"]["tflops"].as_f64().unwrap() > 0.0)
            .count();
        assert!(n >= 3, "{name}: {n} points");
    }

    let out = c.gpuctl(&["trace", "job-999999"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
}

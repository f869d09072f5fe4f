//! End to end on CPU: a real coordinator, 4 real agents with 2 CPU ranks each and
//! real workers on loopback, driven through the `gpuctl` binary. Each test owns
//! its own fleet; they run one at a time because every fleet wants both cores.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// Ranks of the report, checked to be 0..world each once, in nodes named as the fleet.
fn check_ranks(report: &Value, nodes: usize, world: usize) {
    let node_list = report["nodes"].as_array().expect("nodes[]");
    assert_eq!(node_list.len(), nodes, "nodes in report: {report}");
    let mut seen = Vec::new();
    for n in node_list {
        assert!(n["name"].as_str().unwrap().starts_with("node-"), "{n}");
        let v = n["verdict"].as_str().unwrap_or("");
        assert!(v == "pass" || v == "warn", "node verdict: {n}");
        for r in n["ranks"].as_array().expect("ranks[]") {
            seen.push(r["rank"].as_u64().expect("rank number") as usize);
        }
    }
    seen.sort();
    assert_eq!(seen, (0..world).collect::<Vec<_>>(), "each rank once");
}

#[test]
fn stress_and_nccl_on_four_nodes_pass() {
    let _g = serial();
    let cluster = Cluster::start(4, 2);

    let out = cluster.gpuctl(&[
        "submit",
        "stress",
        "--duration",
        "4s",
        "--nodes",
        "4",
        "--wait",
        "--output",
        "json",
    ]);
    let report = parse_json(&out, &["submit stress --wait"]);
    assert_eq!(report["state"], "succeeded", "{report}\n{}", cluster.logs());
    passed(&report);
    assert_eq!(report["workload"], "stress");
    check_ranks(&report, 4, 8);
    for n in report["nodes"].as_array().unwrap() {
        for r in n["ranks"].as_array().unwrap() {
            let median = r.pointer("/stress/tflops_median").and_then(Value::as_f64);
            assert!(median.is_some_and(|t| t > 0.0), "TFLOP/s in {r}");
        }
    }

    let out = cluster.gpuctl(&[
        "submit",
        "nccl",
        "--nodes",
        "4",
        "--min-bytes",
        "1K",
        "--max-bytes",
        "64K",
        "--iters",
        "3",
        "--warmup",
        "1",
        "--wait",
        "--output",
        "json",
    ]);
    let report = parse_json(&out, &["submit nccl --wait"]);
    assert_eq!(report["state"], "succeeded", "{report}\n{}", cluster.logs());
    assert_eq!(report["verdict"], "pass");
    check_ranks(&report, 4, 8);
    let rows = report["collectives"].as_array().expect("collectives[]");
    let ops: BTreeSet<&str> = rows.iter().map(|r| r["op"].as_str().unwrap()).collect();
    let all: BTreeSet<&str> = [
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "broadcast",
        "reduce",
        "alltoall",
        "sendrecv",
    ]
    .into_iter()
    .collect();
    assert_eq!(ops, all, "every collective measured");
    for r in rows {
        assert!(r["busbw_gbps"].as_f64().unwrap() > 0.0, "busbw in {r}");
        assert!(r["algbw_gbps"].as_f64().unwrap() > 0.0, "algbw in {r}");
        assert_eq!(r["wrong"], 0, "out-of-place #wrong in {r}");
        assert_eq!(r["wrong_ip"], 0, "in-place #wrong in {r}");
        let bytes = r["bytes"].as_u64().unwrap();
        assert!((1024..=65536).contains(&bytes), "size in range: {r}");
    }

    // The table form carries the same job, readable.
    let id = job_id(&report).expect("job id");
    let table = cluster.gpuctl(&["report", &id]);
    assert!(table.status.success(), "{}", stderr(&table));
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("all_reduce") && text.contains("busbw"),
        "{text}"
    );
}

#[test]
fn cancel_stops_every_worker() {
    let _g = serial();
    let cluster = Cluster::start(4, 2);
    let id = cluster.submit(&["stress", "--duration", "5m", "--nodes", "4"]);
    cluster.wait_workers(&id, 8, Duration::from_secs(30));

    let out = cluster.gpuctl(&["cancel", &id]);
    assert!(out.status.success(), "cancel: {}", stderr(&out));
    let gone = cluster.wait_workers_gone(&id, Duration::from_secs(5));
    assert!(
        gone.is_ok(),
        "workers still alive 5 s after cancel: {gone:?}"
    );
    assert_eq!(cluster.job_state(&id), "cancelled");

    // A cancelled job's report exits non-zero and says so.
    let out = cluster.gpuctl(&["report", &id, "--output", "json"]);
    let report: Value = serde_json::from_slice(&out.stdout).expect("report json");
    assert_eq!(report["state"], "cancelled");
    assert_ne!(report["verdict"], "pass");
}

#[test]
fn lost_agent_fails_the_job_naming_the_node() {
    let _g = serial();
    let mut cluster = Cluster::start_with(4, 2, "3s");
    let id = cluster.submit(&["stress", "--duration", "5m", "--nodes", "4"]);
    cluster.wait_workers(&id, 8, Duration::from_secs(30));
    cluster.wait_state(&id, &["running"], Duration::from_secs(10));

    let killed = Instant::now();
    cluster.kill_agent(2);
    cluster.wait_state(&id, &["failed"], Duration::from_secs(3 + 5));
    let job = cluster.job(&id);
    let message = job
        .get("message")
        .or_else(|| job.pointer("/job/message"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    assert!(message.contains("node-2"), "failure names the node: {job}");
    let left = Duration::from_secs(3 + 5).saturating_sub(killed.elapsed());
    let gone = cluster.wait_workers_gone(&id, left.max(Duration::from_secs(2)));
    assert!(
        gone.is_ok(),
        "workers left after the node was lost: {gone:?}"
    );

    let nodes = cluster.json(&["nodes"]);
    let lost: Vec<_> = nodes_array(&nodes)
        .into_iter()
        .filter(|n| n["state"] == "lost")
        .map(|n| n["name"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(lost, vec!["node-2".to_string()], "{nodes}");
}

#[test]
fn reports_survive_a_coordinator_restart() {
    let _g = serial();
    let mut cluster = Cluster::start(4, 2);
    let out = cluster.gpuctl(&[
        "submit",
        "stress",
        "--duration",
        "3s",
        "--nodes",
        "4",
        "--wait",
        "--output",
        "json",
    ]);
    let before = parse_json(&out, &["submit stress --wait"]);
    assert_eq!(before["verdict"], "pass", "{before}\n{}", cluster.logs());
    let id = job_id(&before).unwrap();

    cluster.restart_coordinator();
    let after = cluster.json(&["report", &id]);
    assert_eq!(after["job_id"], before["job_id"]);
    assert_eq!(after["verdict"], "pass");
    // Where each rank was when the job ended (phase, counter, process state)
    // is a live view: a coordinator killed before the report's write landed
    // makes the report again from the stored results, which carry no live
    // view (seen under load). Results, figures and verdicts must be the same.
    let settled = |nodes: &Value| {
        let mut nodes = nodes.clone();
        for rank in nodes
            .as_array_mut()
            .into_iter()
            .flatten()
            .flat_map(|n| n["ranks"].as_array_mut().into_iter().flatten())
        {
            let rank = rank.as_object_mut().expect("a rank is an object");
            for live in [
                "iterations",
                "last_phase",
                "last_progress_unix_ms",
                "process_state",
            ] {
                rank.remove(live);
            }
        }
        nodes
    };
    assert_eq!(
        settled(&after["nodes"]),
        settled(&before["nodes"]),
        "the same per-node results"
    );

    // Agents find the new coordinator by themselves and take new work.
    cluster.wait_ready(4, Duration::from_secs(30));
    let out = cluster.gpuctl(&[
        "submit",
        "stress",
        "--duration",
        "2s",
        "--nodes",
        "4",
        "--wait",
        "--output",
        "json",
    ]);
    let again = parse_json(&out, &["submit stress --wait after restart"]);
    assert_eq!(again["verdict"], "pass", "{again}");
    assert_ne!(again["job_id"], before["job_id"]);
}

#[test]
fn bad_input_is_refused_and_stores_nothing() {
    let _g = serial();
    let cluster = Cluster::start(4, 1);
    let cases: &[(&[&str], &str)] = &[
        (&["submit", "stress", "--nodes", "0"], "--nodes"),
        (&["submit", "stress", "--nodes", "5"], "5 nodes"),
        (
            &["submit", "stress", "--duration", "-5m", "--nodes", "1"],
            "duration",
        ),
        (&["submit", "burn", "--nodes", "1"], "burn"),
        (
            &["submit", "stress", "--nodes", "1", "--frobnicate"],
            "--frobnicate",
        ),
        (
            &["submit", "stress", "--nodes", "1", "--selector", "gpu"],
            "selector",
        ),
    ];
    for (args, needle) in cases {
        let out = cluster.gpuctl(args);
        let err = stderr(&out);
        assert!(!out.status.success(), "{args:?} must fail, got: {err}");
        assert!(
            err.contains(needle),
            "{args:?}: error should name `{needle}`: {err}"
        );
        assert!(err.lines().count() <= 12, "{args:?}: a short error: {err}");
    }
    let jobs = cluster.json(&["jobs"]);
    let list = jobs
        .as_array()
        .or_else(|| jobs.get("jobs").and_then(Value::as_array))
        .cloned()
        .unwrap_or_default();
    assert!(list.is_empty(), "nothing stored: {jobs}");
}

//! `p2p` on real processes: a CPU fleet measures every pair of ranks inside
//! each node (TCP between the node's workers) and each rank's copies, twice
//! each; the report holds the pair matrix and judges it. A node made slow for
//! real (a CPU quota on its agent's process tree, which its workers inherit)
//! is named, on its host copies, and only that node.

mod common;

use std::time::Duration;

use common::cgroup::CpuQuota;
use common::*;
use serde_json::Value;

/// The job's report, waiting up to 240 s for its end.
fn run_job(c: &Cluster, args: &[&str]) -> Value {
    common::run_job(c, args, Duration::from_secs(240))
}

#[test]
fn every_pair_of_each_node_is_measured_twice_and_a_healthy_fleet_passes() {
    let _g = serial();
    let c = Cluster::start(2, 3);
    let r = run_job(&c, &["p2p", "--nodes", "2", "--bytes", "4M"]);
    // CPU ranks' memcpy on two shared cores: a healthy one was seen at 0.39x
    // of its peers, a warning (listed, not a failure), as for other CPU
    // figures; nothing may fail.
    passed(&r);
    let pairs = r["gpu_pairs"].as_array().expect("gpu_pairs[]");
    // Three ranks a node: six ordered pairs each, never across nodes.
    assert_eq!(pairs.len(), 12, "{r:#}");
    for node in [Cluster::agent_name(0), Cluster::agent_name(1)] {
        let mine: Vec<&Value> = pairs.iter().filter(|p| p["node"] == *node).collect();
        assert_eq!(mine.len(), 6, "{node}: {mine:#?}");
        let mut seen: Vec<(u64, u64)> = mine
            .iter()
            .map(|p| {
                (
                    p["src_local"].as_u64().unwrap(),
                    p["dst_local"].as_u64().unwrap(),
                )
            })
            .collect();
        seen.sort();
        assert_eq!(seen, [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]);
    }
    for p in pairs {
        let (first, repeat, judged) = (
            p["first_gbps"].as_f64().unwrap(),
            p["repeat_gbps"].as_f64().unwrap(),
            p["gbps"].as_f64().unwrap(),
        );
        assert!(first > 0.0 && repeat > 0.0, "both passes measured: {p}");
        assert_eq!(judged, first.max(repeat), "{p}");
        assert_eq!(p["wrong"], 0, "{p}");
        assert_eq!(p["verdict"], "pass", "{p}");
    }
    for n in r["nodes"].as_array().unwrap() {
        for k in n["ranks"].as_array().unwrap() {
            let x = &k["p2p"];
            assert_eq!(x["method"], "host", "{k:#}");
            for f in ["h2d_gbps", "h2d_repeat_gbps", "d2h_gbps", "d2h_repeat_gbps"] {
                assert!(x[f].as_f64().unwrap() > 0.0, "{f}: {k:#}");
            }
            // Each rank took part in four of its node's six pairs.
            assert_eq!(x["peers"].as_array().unwrap().len(), 4, "{k:#}");
        }
    }
    let table = c.gpuctl(&["report", r["job_id"].as_str().unwrap()]);
    let text = String::from_utf8_lossy(&table.stdout);
    let heading = format!("GPU PAIRS {}", Cluster::agent_name(0));
    assert!(text.contains(&heading), "{text}");
    assert!(text.contains("HOST <-> DEVICE"), "{text}");
    // The history keeps the figures: `gpuctl fleet` shows the worst GPU's.
    let fleet = c.json(&["fleet"]);
    let rows = fleet["nodes"].as_array().expect("nodes[]");
    assert_eq!(rows.len(), 2, "{fleet:#}");
    for row in rows {
        assert!(row["p2p_gbps_worst"].as_f64().unwrap() > 0.0, "{row:#}");
        assert!(row["h2d_gbps_worst"].as_f64().unwrap() > 0.0, "{row:#}");
    }
}

#[test]
fn a_node_slowed_for_real_is_named_on_its_copies_and_the_others_pass() {
    let _g = serial();
    // Four nodes: a fleet reference needs three besides the node judged
    // (one vote per node, issue 46).
    let c = Cluster::start(4, 2);
    let slow = Cluster::agent_name(2);
    // 6% of one core for the node's two ranks together, its agent left
    // free. At 3% for agent and ranks together, on CI's host of 2026-11-30,
    // slower than the one it was tuned on, the slowed ranks went 120 s
    // without a copy and were judged hung instead of slow, or the job
    // outlasted the test. With a
    // tenth, a host loaded beside the test (two busy loops and another
    // fleet's stress job) gave the healthy ranks little more, and the slowed
    // node read 0.5x of them, a warning; and one 10 ms try fitting in a
    // tenth's refilled quota read full speed.
    let _quota = CpuQuota::on_ranks("gpuctl-test-p2p", c.agent_pid(2), 0.06);
    let r = run_job(&c, &["p2p", "--nodes", "4", "--bytes", "16M"]);
    assert_eq!(r["verdict"], "fail", "{r:#}");
    for n in r["nodes"].as_array().unwrap() {
        let name = n["name"].as_str().unwrap();
        if name == slow {
            assert_eq!(n["verdict"], "fail", "{n:#}");
            let metrics: Vec<&str> = fails(&n["findings"])
                .iter()
                .filter_map(|f| f["metric"].as_str())
                .collect();
            assert!(
                metrics.iter().any(|m| *m == "h2d_gbps" || *m == "d2h_gbps"),
                "{slow} should fail on its copies: {n:#}"
            );
        } else {
            assert!(fails(&n["findings"]).is_empty(), "healthy {name}: {n:#}");
            assert_ne!(n["verdict"], "fail", "healthy {name} blamed: {n:#}");
        }
    }
}

//! The fleet over time, on real processes: three stress jobs in a row on 4
//! nodes with a coordinator restart (kill -9) between them, the last one with
//! one node under a CPU quota. `gpuctl fleet` must show all three runs of
//! every node, flag the slowed node's drift against its own history, and
//! leave the healthy nodes unflagged.

mod common;

use std::time::Duration;

use common::cgroup::CpuQuota;
use common::*;
use serde_json::Value;

fn finish(c: &Cluster, args: &[&str]) -> String {
    let id = c.submit(args);
    c.wait_state(
        &id,
        &["succeeded", "failed", "cancelled"],
        Duration::from_secs(180),
    );
    id
}

fn flagged(row: &Value) -> Vec<String> {
    row["drift"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["flagged"] == true)
        .map(|d| d["metric"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn history_survives_a_restart_and_drift_names_the_slowed_node() {
    // CPU ranks on a shared 2-core machine move 20 % run to run (a CI run saw
    // a healthy node at 0.80 of its own median); the node held to 0.05 of a
    // core drops far below either tolerance. At 0.15 it did not stand out
    // while other tests loaded the machine: four nodes sharing two busy
    // cores get about that much each.
    let rules = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(rules.path(), "[fleet]\ndrift = 0.6\n").unwrap();
    // The only test of this binary: the coordinator it starts inherits it.
    std::env::set_var("GPUCTL_RULES", rules.path());
    let mut c = Cluster::start(4, 1);
    let stress = ["stress", "--nodes", "4", "--duration", "7s"];
    let first = finish(&c, &stress);

    c.restart_coordinator();
    c.wait_ready(4, Duration::from_secs(60));
    let second = finish(&c, &stress);

    // The last job's workers gone first, so that what runs next on the
    // slowed node starts under its quota.
    c.wait_workers_gone(&second, Duration::from_secs(30))
        .expect("workers of the second job");
    let slow = Cluster::agent_name(1);
    let third = {
        let _quota = CpuQuota::apply("gpuctl-test-fleet", c.agent_pid(1), 0.05);
        // Longer than the others: at 0.05 of a core one GEMM took ~1.9 s in
        // a full CI run (2026-11-30), and 7 s gave the slowed rank fewer than
        // the 5 intervals the fleet reference needs, so its job passed.
        finish(&c, &["stress", "--nodes", "4", "--duration", "20s"])
    };

    let fleet = c.json(&["fleet"]);
    for i in 0..4 {
        let name = Cluster::agent_name(i);
        let r = fleet_row(&fleet, &name);
        assert_eq!(r["runs"], 3, "{name}: {r:#}");
        assert_eq!(r["last_job"], third.as_str(), "{name}: {r:#}");
        assert!(r["stress_tflops_median"].as_f64().unwrap() > 0.0, "{r:#}");
        let f = flagged(r);
        if name == slow {
            assert!(
                f.contains(&"stress_tflops".to_string()),
                "{name} drifted: {r:#}"
            );
            assert_eq!(r["last_verdict"], "fail", "{r:#}");
        } else {
            assert!(f.is_empty(), "healthy {name} flagged: {r:#}");
            // JSON carries every figure's drift, flagged or not (the
            // tables ask for the flagged alone).
            let drift = r["drift"].as_array().unwrap();
            assert!(
                drift.iter().any(|d| d["metric"] == "stress_tflops"),
                "{r:#}"
            );
        }
    }

    // One node's runs, newest first, each with its per-GPU figures.
    let mine = c.json(&["fleet", "--node", &slow]);
    let runs: Vec<&str> = mine["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["job_id"].as_str().unwrap())
        .collect();
    assert_eq!(runs, vec![third.as_str(), second.as_str(), first.as_str()]);
    assert!(mine["runs"][0]["figures"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["metric"] == "stress_tflops"));

    // The table a person reads names the drift.
    let out = c.gpuctl(&["fleet"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with(&slow))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("stress_tflops"), "{text}");

    let unknown = c.gpuctl(&["fleet", "--node", "nope"]);
    assert_ne!(unknown.status.code(), Some(0), "{}", stderr(&unknown));
    assert!(stderr(&unknown).contains("no runs of node `nope`"));
}

//! The healthy-run matrix on CPU ranks (issue 47): every workload, the
//! models and sizes a CPU rank runs in the CI budget, on one agent of two
//! ranks and on two one-rank agents, run healthy. Each job must pass with no
//! FAIL and no WARN finding: a rule that fires on a healthy fleet is a defect
//! exactly like one that misses a fault. The GPU matrix is `bench/matrix.sh`
//! (docs/benchmarks.md).
//!
//! CPU ranks share this machine's cores with every other test, so the
//! performance rules are the tests' CPU rules (`Cluster::cpu_rules`), which
//! judge as the defaults do but with margins a busy 2-core machine keeps.

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;

/// The findings of `report` at `level`.
fn at<'a>(report: &'a Value, level: &str) -> Vec<&'a Value> {
    report["findings"]
        .as_array()
        .expect("findings[]")
        .iter()
        .filter(|f| f["level"] == level)
        .collect()
}

/// Runs each job on `c` and asserts it passed with no FAIL or WARN finding.
fn healthy(c: &Cluster, nodes: &str, jobs: &[&[&str]]) {
    let rules = c.cpu_rules();
    for job in jobs {
        let mut args: Vec<&str> = job.to_vec();
        args.extend(["--nodes", nodes, "--rules", &rules]);
        let r = run_job(c, &args, Duration::from_secs(240));
        let (fail, warn) = (at(&r, "fail"), at(&r, "warn"));
        assert!(
            r["verdict"] == "pass" && fail.is_empty() && warn.is_empty(),
            "{job:?} on a healthy fleet: verdict {}, fail {fail:#?}, warn {warn:#?}\n{}",
            r["verdict"],
            c.logs()
        );
    }
}

const JOBS: &[&[&str]] = &[
    &["stress", "--duration", "3s"],
    &["stress", "--duration", "3s", "--precision", "bf16"],
    &["stress", "--duration", "3s", "--with-comm"],
    &["nccl", "--max-bytes", "1M"],
    &["ddp", "--steps", "4"],
    &["ddp", "--model", "gpt", "--gpt-size", "toy", "--steps", "4"],
    &["fsdp", "--steps", "4"],
    &[
        "fsdp",
        "--model",
        "gpt",
        "--gpt-size",
        "toy",
        "--steps",
        "4",
    ],
    &["maxbatch", "--limit", "8"],
];

/// One test, the layouts in turn: two fleets at once would share the cores
/// and each would measure the other.
#[test]
fn every_workload_passes_clean_on_one_agent_and_on_one_rank_agents() {
    let c = Cluster::start(1, 2);
    healthy(&c, "1", JOBS);
    healthy(&c, "1", &[&["p2p"]]);
    drop(c);
    let c = Cluster::start(2, 1);
    healthy(&c, "2", JOBS);
}

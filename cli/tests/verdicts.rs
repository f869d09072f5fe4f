//! Performance verdicts on real processes: a fleet of 4 agents with one CPU
//! rank each, one of them made slow for real by a CPU quota on its process
//! tree (cgroup), judged against the fleet median, a saved baseline and a
//! floor from a rules file; and healthy runs that must not be blamed. The
//! ratios are [`CPU_RULES`]: CPU ranks sharing two cores are noisier than GPUs.

mod common;

use std::time::Duration;

use common::cgroup::CpuQuota;
use common::*;
use serde_json::Value;

/// 8 % of one core for the slowed node's ranks (about 0.15x of a healthy
/// one, far under every ratio of [`CPU_RULES`] even when the machine's load
/// moves); the healthy ones share the machine's other cores. The ranks
/// alone, the agent left free: throttled whole, the worker its agent
/// prestarted after the first job loaded libtorch under the quota, and a
/// full CI run (2026-11-30) found the second job still running after 180 s.
const SLOW_CORES: f64 = 0.08;

/// The job's report, waiting up to 180 s for its end.
fn run_job(c: &Cluster, args: &[&str]) -> Value {
    common::run_job(c, args, Duration::from_secs(180))
}

/// The slowed node fails with a finding on `metric` against `kind`; every
/// other node passes with no failed finding.
fn only_slow_node_fails(report: &Value, slow: &str, metric: &str, kind: &str) {
    assert_eq!(report["verdict"], "fail", "{report:#}");
    for n in report["nodes"].as_array().unwrap() {
        let name = n["name"].as_str().unwrap();
        if name == slow {
            assert_eq!(n["verdict"], "fail", "{n:#}");
            let f = fails(&n["findings"]);
            assert!(
                f.iter()
                    .any(|f| f["metric"] == metric && f["reference_kind"] == kind),
                "{slow} should fail {metric} against {kind}: {n:#}"
            );
            let hit = f.iter().find(|f| f["metric"] == metric).unwrap();
            assert!(hit["value"].as_f64().unwrap() < hit["reference"].as_f64().unwrap());
            assert!(hit["rule"].as_str().unwrap().contains(metric), "{hit}");
        } else {
            assert!(
                n["verdict"] == "pass" || n["verdict"] == "warn",
                "healthy {name} blamed: {n:#}"
            );
            assert!(fails(&n["findings"]).is_empty(), "healthy {name}: {n:#}");
        }
    }
    // The table leads with the verdict and names the node in its findings.
    let first = report["findings"][0].clone();
    assert_eq!(first["level"], "fail", "{report:#}");
    assert_eq!(first["node"], slow, "{report:#}");
}

#[test]
fn a_slow_node_fails_stress_and_ddp_against_the_fleet_and_the_others_pass() {
    let _g = serial();
    let c = Cluster::start(4, 1);
    let slow = Cluster::agent_name(2);
    let _quota = CpuQuota::on_ranks("gpuctl-test-verdicts", c.agent_pid(2), SLOW_CORES);
    let rules = c.cpu_rules();

    let r = run_job(
        &c,
        &[
            "stress",
            "--nodes",
            "4",
            "--duration",
            "8s",
            "--rules",
            &rules,
        ],
    );
    only_slow_node_fails(&r, &slow, "stress_tflops", "fleet");

    let r = run_job(
        &c,
        &[
            "ddp",
            "--rules",
            &rules,
            "--nodes",
            "4",
            "--model",
            "cnn",
            "--steps",
            "12",
            "--batch-size",
            "16",
        ],
    );
    only_slow_node_fails(&r, &slow, "solo_samples_per_s", "fleet");

    // Beside an all_reduce every rank goes at the slowest one's pace; the
    // GEMMs alone first name the slow node, judged as plain stress.
    let r = run_job(
        &c,
        &[
            "stress",
            "--nodes",
            "4",
            "--duration",
            "14s",
            "--with-comm",
            "--rules",
            &rules,
        ],
    );
    only_slow_node_fails(&r, &slow, "stress_tflops", "fleet");
    let plain = r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["node"] == slow && f["metric"] == "stress_tflops")
        .unwrap_or_else(|| panic!("{r:#}"));
    assert_eq!(plain["key"], "fp32 256", "the phase alone: {plain:#}");
    for n in r["nodes"].as_array().unwrap() {
        for rank in n["ranks"].as_array().unwrap() {
            let s = &rank["stress"];
            assert_eq!(s["with_comm"], true, "{s:#}");
            let alone = s["solo_tflops_per_interval"].as_array().unwrap().len();
            let beside = s["tflops_per_interval"].as_array().unwrap().len();
            assert!(
                alone >= 5 && beside >= 5,
                "{alone} alone, {beside} beside: {s:#}"
            );
        }
    }
}

#[test]
fn baselines_judge_later_jobs_and_floors_fail_what_the_cpu_cannot_reach() {
    let _g = serial();
    let c = Cluster::start(4, 1);
    let rules = c.cpu_rules();
    let stress = [
        "stress",
        "--nodes",
        "4",
        "--duration",
        "7s",
        "--rules",
        rules.as_str(),
    ];

    let healthy = run_job(&c, &stress);
    assert_ne!(healthy["verdict"], "fail", "{healthy:#}");
    let id = healthy["job_id"].as_str().unwrap();
    let saved = c.json(&["baseline", "save", id, "--name", "cpu-fleet"]);
    assert!(
        saved["figures"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["metric"] == "stress_tflops"),
        "{saved:#}"
    );
    let again = c.gpuctl(&["baseline", "save", id, "--name", "cpu-fleet"]);
    assert_eq!(
        again.status.code(),
        Some(1),
        "a second save needs --replace"
    );
    assert!(stderr(&again).contains("--replace"), "{}", stderr(&again));

    let mut args = stress.to_vec();
    args.extend(["--baseline", "cpu-fleet"]);
    let pass = run_job(&c, &args);
    assert_ne!(
        pass["verdict"], "fail",
        "healthy against its baseline: {pass:#}"
    );
    assert!(fails(&pass["findings"]).is_empty(), "{pass:#}");
    assert!(
        pass["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("baseline `cpu-fleet`")),
        "{pass:#}"
    );

    {
        let slow = Cluster::agent_name(1);
        let _quota = CpuQuota::on_ranks("gpuctl-test-baseline", c.agent_pid(1), SLOW_CORES);
        let r = run_job(&c, &args);
        only_slow_node_fails(&r, &slow, "stress_tflops", "baseline");
    }

    let unknown = c.gpuctl(&["submit", "stress", "--baseline", "nope"]);
    assert_eq!(unknown.status.code(), Some(3), "{}", stderr(&unknown));
    assert!(stderr(&unknown).contains("no baseline `nope`"));

    // A floor the CPU cannot reach, for the model the ranks report.
    let rules = unreachable_floor(c.dir.path(), &healthy);
    let mut args = stress[..5].to_vec();
    let path = rules.to_str().unwrap().to_string();
    args.extend(["--rules", &path]);
    let r = run_job(&c, &args);
    assert_eq!(r["verdict"], "fail", "{r:#}");
    for n in r["nodes"].as_array().unwrap() {
        let f = fails(&n["findings"]);
        assert!(
            f.iter().any(|f| f["reference_kind"] == "floor"
                && f["rule"].as_str().unwrap().contains("test: out of reach")),
            "every node misses the floor: {n:#}"
        );
    }
    let bad = c.dir.path().join("bad.toml");
    std::fs::write(&bad, "[metrics.tflops]\nfail = 0.5\n").unwrap();
    let out = c.gpuctl(&["submit", "stress", "--rules", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--rules") && stderr(&out).contains("unknown metric"));
}

#[test]
fn healthy_runs_are_never_blamed() {
    let _g = serial();
    let c = Cluster::start(4, 1);
    let rules = c.cpu_rules();
    for run in 0..5 {
        let r = run_job(
            &c,
            &[
                "stress",
                "--nodes",
                "4",
                "--duration",
                "10s",
                "--rules",
                &rules,
            ],
        );
        let judged = r["notes"].as_array().unwrap().iter().any(|n| {
            n.as_str()
                .unwrap()
                .contains("fleet reference: each rank of")
        });
        assert!(
            judged,
            "run {run}: the fleet reference must have been used: {r:#}"
        );
        let f = fails(&r["findings"]);
        assert!(
            f.is_empty(),
            "run {run}: failed findings on a healthy fleet: {r:#}"
        );
        assert_ne!(r["verdict"], "fail", "run {run}: {r:#}");
    }
}

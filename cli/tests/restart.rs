//! Running jobs survive the coordinator: it is killed with SIGKILL mid-job
//! and started again on the same port and data folder, while real agents keep
//! their workers (`--coordinator-grace`), register again listing them, and the
//! restarted coordinator adopts the jobs. Real processes on loopback.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

// Each test owns a fleet that wants both cores: one at a time (`serial()`).

/// The job's report; `report` exits 1 for a failed job and prints it anyway.
fn report(cluster: &Cluster, id: &str) -> Value {
    let args = ["report", id, "--output", "json"];
    let out = cluster.gpuctl(&args);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "gpuctl {args:?} printed no JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            stderr(&out)
        )
    })
}

/// Rank → whether the report holds its result.
fn reported(report: &Value) -> BTreeMap<u64, bool> {
    report["nodes"]
        .as_array()
        .expect("nodes[]")
        .iter()
        .flat_map(|n| n["ranks"].as_array().expect("ranks[]").iter())
        .map(|r| (r["rank"].as_u64().unwrap(), r["reported"] == true))
        .collect()
}

#[test]
fn a_job_survives_a_coordinator_killed_mid_run() {
    let _g = serial();
    let mut cluster = Cluster::start(4, 2);
    // 8 ranks on two cores through a restart, judged by the built-in
    // ratios for CPU ranks (a healthy one ran at 0.86x of the others here).
    let id = cluster.submit(&["stress", "--duration", "20s", "--nodes", "4"]);
    cluster.wait_workers(&id, 8, Duration::from_secs(30));
    let before: BTreeSet<u32> = cluster.worker_pids(&id).into_iter().collect();
    std::thread::sleep(Duration::from_secs(5));

    cluster.kill_coordinator();
    let killed = Instant::now();
    std::thread::sleep(Duration::from_secs(4));
    let during: BTreeSet<u32> = cluster.worker_pids(&id).into_iter().collect();
    assert_eq!(
        during, before,
        "the workers run on while the coordinator is away"
    );
    cluster.restart_coordinator();
    assert!(killed.elapsed() < Duration::from_secs(10));
    let state = cluster.job_state(&id);
    assert_eq!(state, "running", "the restarted coordinator keeps the job");

    let end = cluster.wait_state(
        &id,
        &["succeeded", "failed", "cancelled"],
        Duration::from_secs(90),
    );
    let job = cluster.job(&id);
    assert_eq!(end, "succeeded", "{job}\n{}", cluster.logs());
    let r = report(&cluster, &id);
    let ranks = reported(&r);
    assert_eq!(ranks.len(), 8, "{r}");
    assert!(ranks.values().all(|x| *x), "every rank's result: {ranks:?}");
    let nodes = cluster.json(&["nodes"]);
    let busy: Vec<Value> = nodes_array(&nodes)
        .into_iter()
        .filter(|n| n["state"] != "ready")
        .collect();
    assert!(busy.is_empty(), "every node free again: {busy:?}");
}

/// A tiny deterministic generator (xorshift), seeded from the clock and
/// printed, so a failing run can be told apart and repeated.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// (job, rank) of every worker the agents saw exit with code 0: such a
/// worker had its result acknowledged by a coordinator before it exited.
fn delivered(cluster: &Cluster, agents: usize) -> BTreeSet<(String, u64)> {
    let mut out = BTreeSet::new();
    for i in 0..agents {
        let log = std::fs::read_to_string(cluster.dir.path().join(format!("agent-{i}.log")))
            .unwrap_or_default();
        for line in log.lines().filter(|l| l.contains("worker exited")) {
            let field = |k: &str| {
                line.split_whitespace()
                    .find_map(|w| w.strip_prefix(k))
                    .map(str::to_string)
            };
            if field("exit_code=").as_deref() == Some("0") {
                if let (Some(job), Some(rank)) = (field("job="), field("rank=")) {
                    out.insert((job, rank.parse().unwrap()));
                }
            }
        }
    }
    out
}

#[test]
fn jobs_stay_consistent_through_twenty_kills() {
    let _g = serial();
    let agents = 4;
    let mut cluster = Cluster::start(agents, 1);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("seed {seed}");
    let mut rng = Rng(seed);
    let mut jobs: Vec<String> = Vec::new();
    for kill in 0..20 {
        // Keep a few short jobs in flight (a submit right after a restart may
        // find the nodes not back yet; that is fine).
        let in_flight = jobs
            .iter()
            .filter(|j| matches!(cluster.job_state(j).as_str(), "pending" | "running"))
            .count();
        for _ in in_flight..3 {
            let out = cluster.gpuctl(&[
                "submit",
                "stress",
                "--duration",
                "3s",
                "--nodes",
                "2",
                "--output",
                "json",
            ]);
            if out.status.success() {
                let v: Value = serde_json::from_slice(&out.stdout).unwrap();
                jobs.push(job_id(&v).unwrap());
            }
        }
        std::thread::sleep(Duration::from_millis(200 + rng.below(2800)));
        cluster.kill_coordinator();
        std::thread::sleep(Duration::from_millis(rng.below(1000)));
        cluster.restart_coordinator();
        eprintln!(
            "kill {kill}: {} jobs so far, {in_flight} in flight",
            jobs.len()
        );
    }
    assert!(!jobs.is_empty(), "no job could be submitted");

    let mut states = BTreeMap::new();
    for id in &jobs {
        let s = cluster.wait_state(
            id,
            &["succeeded", "failed", "cancelled"],
            Duration::from_secs(120),
        );
        states.insert(id.clone(), s);
    }
    let delivered = delivered(&cluster, agents);
    for id in &jobs {
        let job = cluster.job(id);
        let r = report(&cluster, id);
        let ranks = reported(&r);
        match states[id].as_str() {
            "succeeded" => assert!(
                ranks.len() == 2 && ranks.values().all(|x| *x),
                "{id} succeeded without every result: {ranks:?}\n{r}"
            ),
            "failed" => assert!(
                !job["message"].as_str().unwrap_or("").trim().is_empty(),
                "{id} failed without saying why: {job}"
            ),
            other => panic!("{id} ended {other}: {job}"),
        }
        for (_, rank) in delivered.iter().filter(|(j, _)| j == id) {
            assert_eq!(
                ranks.get(rank),
                Some(&true),
                "{id}: rank {rank} delivered its result, the report lacks it: {r}\n{}",
                cluster.logs()
            );
        }
    }
    // Jobs are adopted across kills, so some succeed however the kills fall
    // (how many depends on how loaded the machine is).
    let ok = states.values().filter(|s| *s == "succeeded").count();
    eprintln!("{ok} of {} jobs succeeded: {states:?}", jobs.len());
    assert!(
        ok > 0,
        "no job survived the kills: {states:?}\n{}",
        cluster.logs()
    );
}

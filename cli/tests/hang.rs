//! Hung ranks on CPU: a worker stopped with SIGSTOP in the middle of an nccl
//! sweep (its peers block on it) and in the middle of a stress run (its peers
//! go on). With `--hang-timeout 10s` the job fails soon after, naming the
//! stopped rank and its node; only that node fails in the report, which shows
//! where every rank was; and no worker of the job is left.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// A worker we stopped: continued and killed on the way out if it is still
/// there, so that a failing test leaves nothing behind.
struct Stopped {
    pid: u32,
    job: String,
    /// The fleet's folder: its workers' working folders are below it.
    dir: PathBuf,
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if worker_pids_under(&self.dir, &self.job).contains(&self.pid) {
            // SAFETY: signals to a worker process this test started.
            unsafe {
                libc::kill(self.pid as i32, libc::SIGCONT);
                libc::kill(self.pid as i32, libc::SIGKILL);
            }
        }
    }
}

/// Submits `args` on 2 nodes of 2 CPU ranks with a 10 s hang timeout, stops
/// one worker once every rank works, and checks what follows. Returns the
/// job's failure message.
fn stop_one_worker(args: &[&str]) -> String {
    let cluster = Cluster::start(2, 2);
    let mut all = args.to_vec();
    all.extend(["--nodes", "2", "--hang-timeout", "10s"]);
    let id = cluster.submit(&all);
    cluster.wait_workers(&id, 4, Duration::from_secs(30));
    cluster.wait_all_progress(&id, 4);

    // The highest rank of node-1, so that neither the first rank nor the first node is blamed by luck.
    let (pid, rank, node) = cluster
        .worker_pids(&id)
        .into_iter()
        .map(|pid| {
            let (rank, node) = rank_and_node(pid);
            (pid, rank, node)
        })
        .filter(|(_, _, node)| node == "node-1")
        .max_by_key(|(_, rank, _)| *rank)
        .expect("a worker on node-1");
    // SAFETY: a signal to a worker process this test started.
    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    let _guard = Stopped {
        pid,
        job: id.clone(),
        dir: cluster.dir.path().to_path_buf(),
    };
    let stopped = Instant::now();

    cluster.wait_state(&id, &["failed"], Duration::from_secs(40));
    let took = stopped.elapsed();
    assert!(
        took < Duration::from_secs(40),
        "failed {took:?} after SIGSTOP"
    );
    assert!(
        took >= Duration::from_secs(9),
        "failed {took:?} after SIGSTOP, before the 10 s hang timeout"
    );
    let job = cluster.job(&id);
    let message = job_field(&job, "message")
        .as_str()
        .unwrap_or_default()
        .to_string();
    let culprit = format!("rank {rank} on {node} hung");
    assert!(message.contains(&culprit), "{culprit}? {message}");
    assert!(message.contains("stopped (SIGSTOP?)"), "{message}");

    let gone = cluster.wait_workers_gone(&id, Duration::from_secs(15));
    assert!(gone.is_ok(), "workers left after the hang: {gone:?}");

    let out = cluster.gpuctl(&["report", &id, "--output", "json"]);
    let report: Value = serde_json::from_slice(&out.stdout).expect("report json");
    assert_eq!(report["state"], "failed", "{report}");
    assert_eq!(report["hang_timeout_ms"], 10_000, "{report}");
    assert!(
        report["reason"].as_str().unwrap_or("").contains(&culprit),
        "{report}"
    );
    for n in report["nodes"].as_array().expect("nodes[]") {
        let verdict = n["verdict"].as_str().unwrap_or("");
        if n["name"] == node.as_str() {
            assert_eq!(verdict, "fail", "{n}");
        } else {
            assert_ne!(verdict, "fail", "only {node} fails: {n}");
        }
        for r in n["ranks"].as_array().expect("ranks[]") {
            assert!(r["iterations"].as_u64().unwrap_or(0) > 0, "{r}");
            assert!(!r["last_phase"].as_str().unwrap_or("").is_empty(), "{r}");
            assert!(r["last_progress_unix_ms"].as_u64().unwrap_or(0) > 0, "{r}");
            let blamed = r["rank"].as_u64() == Some(rank);
            assert_eq!(r["verdict"] == "fail", blamed, "{r}");
            if blamed {
                assert_eq!(r["process_state"], "stopped", "{r}");
            }
        }
    }
    let out = cluster.gpuctl(&["report", &id]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("LAST PROGRESS") && text.contains(&format!("{rank}!")),
        "{text}"
    );
    message
}

#[test]
fn a_rank_stopped_mid_nccl_fails_the_job_naming_it() {
    let _g = serial();
    let message = stop_one_worker(&[
        "nccl",
        "--min-bytes",
        "64K",
        "--max-bytes",
        "16M",
        "--iters",
        "2000",
    ]);
    // Its peers block in the ring waiting on it.
    assert!(
        message.ends_with("the other 3 ranks are blocked waiting on it"),
        "{message}"
    );
}

#[test]
fn a_rank_stopped_mid_stress_fails_the_job_naming_it() {
    let _g = serial();
    let message = stop_one_worker(&["stress", "--duration", "5m"]);
    // Stress ranks do not wait on each other.
    assert!(
        message.ends_with("the other 3 ranks still make progress"),
        "{message}"
    );
}

/// Issue 36: a rank stopped in the second round of `nccl --pattern pairs` on
/// four nodes. The job fails naming it, the ranks waiting at the round's
/// barrier are not blamed, and the links measured in the first round stay in
/// the report and in `gpuctl fleet links`: each worker the coordinator stops
/// sends what it measured so far before it dies (`RankResult.partial`),
/// which counts for those links and for no rank's verdict.
#[test]
fn links_measured_before_a_hang_stay_in_the_report() {
    let _g = serial();
    let cluster = Cluster::start(4, 1);
    let id = cluster.submit(&[
        "nccl",
        "--pattern",
        "pairs",
        "--nodes",
        "4",
        "--max-bytes",
        "1M",
        "--iters",
        "400",
        "--warmup",
        "1",
        "--hang-timeout",
        "10s",
    ]);
    cluster.wait_workers(&id, 4, Duration::from_secs(30));
    // Until some rank is in round 2 of 3.
    let start = Instant::now();
    loop {
        let job = cluster.job(&id);
        let progress = job_field(&job, "progress");
        let in_round_2 = progress.as_array().into_iter().flatten().any(|p| {
            p["phase"]
                .as_str()
                .is_some_and(|s| s.starts_with("pairs round 2/3"))
        });
        if in_round_2 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no rank reached round 2: {job:#}\n{}",
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (pid, rank, node) = cluster
        .worker_pids(&id)
        .into_iter()
        .map(|pid| {
            let (rank, node) = rank_and_node(pid);
            (pid, rank, node)
        })
        .max_by_key(|(_, rank, _)| *rank)
        .expect("a worker");
    // SAFETY: a signal to a worker process this test started.
    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    let _guard = Stopped {
        pid,
        job: id.clone(),
        dir: cluster.dir.path().to_path_buf(),
    };
    cluster.wait_state(&id, &["failed"], Duration::from_secs(60));
    let message = job_field(&cluster.job(&id), "message")
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        message.contains(&format!("rank {rank} on {node} hung")),
        "{message}"
    );
    // The stopped workers' figures come in after the job's end and are folded
    // into its report once they stop coming.
    let start = Instant::now();
    let report = loop {
        let out = cluster.gpuctl(&["report", &id, "--output", "json"]);
        let report: Value = serde_json::from_slice(&out.stdout).expect("report json");
        let first_round = report["links"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|l| l["round"] == 0)
            .count();
        if first_round == 4 {
            break report;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the first round's 2 pairs x 2 ops are not in the report: {report:#}\n{}",
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    for l in report["links"].as_array().unwrap() {
        assert_eq!(l["verdict"], "pass", "{l}");
    }
    for n in report["nodes"].as_array().unwrap() {
        let verdict = n["verdict"].as_str().unwrap_or("");
        if n["name"] == node.as_str() {
            assert_eq!(verdict, "fail", "{n}");
        } else {
            assert_ne!(verdict, "fail", "only {node} fails: {n}");
        }
    }
    let fleet = cluster.json(&["fleet", "links"]);
    assert!(
        fleet["links"].as_array().is_some_and(|l| l.len() >= 4),
        "{fleet:#}"
    );
}

//! Hung ranks on CPU: a worker stopped with SIGSTOP in the middle of an nccl
//! sweep (its peers block on it) and in the middle of a stress run (its peers
//! go on). With `--hang-timeout 10s` the job fails soon after, naming the
//! stopped rank and its node; only that node fails in the report, which shows
//! where every rank was; and no worker of the job is left.

mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A worker we stopped: continued and killed on the way out if it is still
/// there, so that a failing test leaves nothing behind.
struct Stopped {
    pid: u32,
    job: String,
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if worker_pids(&self.job).contains(&self.pid) {
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
    let (pid, rank, node) = worker_pids(&id)
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

    let gone = wait_workers_gone(&id, Duration::from_secs(15));
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

//! A running job survives a failover: two real `gpuctl-coordinator`
//! processes on one real etcd, two real agents given both URLs, a 20 s stress
//! on both nodes; the leader is killed with SIGKILL 5 s in, the standby takes
//! over, the agents (which kept their workers) register with it and it adopts
//! the job, which ends `succeeded` with every rank's result.
//!
//! Runs the `gpuctl`, `gpuctl-agent`, `gpuctl-worker` and `gpuctl-coordinator`
//! binaries: `cargo build --workspace` first (scripts/test.sh does). etcd must
//! be installed.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::etcd::{bin, free_port, gpuctl, Coordinator, Etcd};
use gpuctl_coordinator::store::etcd::LEADER_TTL;
use serde_json::Value;

/// An agent process, killed on drop.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn agent(urls: &str, dir: &Path, name: &str) -> Agent {
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    Agent(
        Command::new(bin("gpuctl-agent"))
            .args(["--coordinator", urls, "--name", name])
            .args(["--cpu-ranks", "1", "--no-gpu"])
            .arg("--work-dir")
            .arg(dir.join(name))
            .args(["--heartbeat-interval", "500ms", "--metrics-listen", "off"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start gpuctl-agent"),
    )
}

/// `gpuctl ... --output json`, whatever its exit code (a failed job's
/// status or report exits 1 and prints it all the same).
fn json(urls: &str, args: &[&str]) -> Result<Value, String> {
    let mut all = args.to_vec();
    all.extend(["--output", "json"]);
    let out = gpuctl(urls, &all);
    serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "gpuctl {all:?}: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn logs(dir: &Path) -> String {
    let mut s = String::new();
    for name in ["a", "b", "node-0", "node-1"] {
        let text = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        s += &format!("--- {name}\n");
        for l in tail.into_iter().rev() {
            s += l;
            s.push('\n');
        }
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_job_survives_a_failover_to_the_standby() {
    let etcd = Etcd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (port_a, port_b) = (free_port(), free_port());
    let listen = |p: u16| format!("127.0.0.1:{p}");
    let mut a = Coordinator::start_on(&etcd, "/adopt-test/", dir.path(), "a", &listen(port_a));
    let url_a = a.serving(Duration::from_secs(30));
    let mut b = Coordinator::start_on(&etcd, "/adopt-test/", dir.path(), "b", &listen(port_b));
    let urls = format!("{url_a},http://127.0.0.1:{port_b}");
    let _agents: Vec<Agent> = (0..2)
        .map(|i| agent(&urls, dir.path(), &format!("node-{i}")))
        .collect();

    // Both nodes ready, then the job.
    let started = Instant::now();
    let id = loop {
        let out = gpuctl(
            &urls,
            &[
                "submit",
                "stress",
                "--duration",
                "20s",
                "--nodes",
                "2",
                "--output",
                "json",
            ],
        );
        if out.status.success() {
            let v: Value = serde_json::from_slice(&out.stdout).unwrap();
            break v["id"].as_str().unwrap().to_string();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the nodes never became ready: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            logs(dir.path())
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    // Running with both ranks reporting progress, then 5 s in: kill -9 the leader.
    let running = Instant::now();
    loop {
        let j = json(&urls, &["status", &id]).unwrap_or_default();
        if j["state"] == "running" && j["progress"].as_array().is_some_and(|p| p.len() == 2) {
            break;
        }
        assert!(
            running.elapsed() < Duration::from_secs(30),
            "{j}\n{}",
            logs(dir.path())
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    b.serving(LEADER_TTL + Duration::from_secs(20));

    // The standby adopts the job; it ends with both ranks' results.
    let waited = Instant::now();
    let job = loop {
        let j = json(&urls, &["status", &id]).unwrap_or_default();
        if matches!(
            j["state"].as_str(),
            Some("succeeded" | "failed" | "cancelled")
        ) {
            break j;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(90),
            "{j}\n{}",
            logs(dir.path())
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(job["state"], "succeeded", "{job}\n{}", logs(dir.path()));
    let report = json(&urls, &["report", &id]).unwrap();
    let reported: Vec<bool> = report["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|n| n["ranks"].as_array().unwrap().iter())
        .map(|r| r["reported"] == true)
        .collect();
    assert_eq!(reported, vec![true, true], "{report}");
    let b_log = std::fs::read_to_string(dir.path().join("b.log")).unwrap_or_default();
    assert!(
        b_log.contains("job adopted"),
        "the standby adopted it: {b_log}"
    );
}

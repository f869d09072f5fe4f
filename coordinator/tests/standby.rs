//! Two real `gpuctl-coordinator` processes on one real etcd: the standby
//! answers every service at once with UNAVAILABLE naming the leader (text and
//! `gpuctl-leader` metadata); `gpuctl --coordinator standby,leader` and an
//! agent given both URLs use the leader; after a kill -9 of the leader the
//! standby takes over and both the CLI and the agent follow it; with every
//! coordinator gone the CLI exits 4 naming each URL.
//!
//! Runs the `gpuctl`, `gpuctl-agent` and `gpuctl-coordinator` binaries:
//! `cargo build --workspace` first (scripts/test.sh does). etcd must be installed.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::etcd::{bin, free_port, gpuctl, Coordinator, Etcd};
use gpuctl_coordinator::store::etcd::LEADER_TTL;
use gpuctl_core::leader::{leader_of, LEADER_METADATA};
use gpuctl_proto::pb::agent_service_client::AgentServiceClient;
use gpuctl_proto::pb::job_service_client::JobServiceClient;
use gpuctl_proto::pb::worker_service_client::WorkerServiceClient;
use gpuctl_proto::pb::*;
use serde_json::Value;
use tonic::Code;

/// A child process with its stderr in `log`, killed on drop.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A coordinator on `--store etcd` listening on 127.0.0.1:`port`.
fn coordinator(etcd: &Etcd, dir: &Path, name: &str, port: u16) -> Coordinator {
    let listen = format!("127.0.0.1:{port}");
    Coordinator::start_on(etcd, "/standby-test/", dir, name, &listen)
}

/// `gpuctl nodes -o json` through `urls`: the node named `name`, if listed.
fn node(urls: &str, name: &str) -> Result<Value, String> {
    let out = gpuctl(urls, &["nodes", "--output", "json"]);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    if !out.status.success() {
        return Err(format!("exit {:?}: {stderr}", out.status.code()));
    }
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    v.as_array()
        .into_iter()
        .flatten()
        .find(|n| n["name"] == name)
        .cloned()
        .ok_or_else(|| format!("no node {name} in {v}"))
}

/// Waits until `node` is ready through `urls` and registered at or after `since_ms`.
fn wait_registered(urls: &str, name: &str, since_ms: u64, agent: &Proc, limit: Duration) {
    let start = Instant::now();
    loop {
        let seen = node(urls, name);
        if let Ok(n) = &seen {
            if n["state"] == "ready" && n["registered_unix_ms"].as_u64().unwrap_or(0) >= since_ms {
                return;
            }
        }
        assert!(
            start.elapsed() < limit,
            "{name} did not register through {urls} within {limit:?}: {seen:?}\nagent log:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The standby's answer to one call of each service, each within 3 s;
/// `None` while its process has not bound its port yet.
async fn standby_answers(url: &str) -> Option<Vec<tonic::Status>> {
    let within = Duration::from_secs(3);
    let ch = tonic::transport::Endpoint::from_shared(url.to_string())
        .unwrap()
        .connect()
        .await
        .ok()?;
    let mut jobs = JobServiceClient::new(ch.clone());
    let jobs = tokio::time::timeout(within, jobs.list_nodes(ListNodesRequest::default())).await;
    let mut agents = AgentServiceClient::new(ch.clone());
    let agents = tokio::time::timeout(within, agents.register(RegisterRequest::default())).await;
    let mut workers = WorkerServiceClient::new(ch);
    let req = RendezvousGetRequest::default();
    let workers = tokio::time::timeout(within, workers.rendezvous_get(req)).await;
    Some(vec![
        jobs.expect("ListNodes must be answered, not hang")
            .unwrap_err(),
        agents
            .expect("Register must be answered, not hang")
            .unwrap_err(),
        workers
            .expect("RendezvousGet must be answered, not hang")
            .unwrap_err(),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_names_the_leader_and_clients_follow_it_through_a_failover() {
    let etcd = Etcd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (port_a, port_b) = (free_port(), free_port());
    let (url_a, url_b) = (
        format!("http://127.0.0.1:{port_a}"),
        format!("http://127.0.0.1:{port_b}"),
    );

    let mut a = coordinator(&etcd, dir.path(), "a", port_a);
    assert_eq!(a.serving(Duration::from_secs(30)), url_a);
    let mut b = coordinator(&etcd, dir.path(), "b", port_b);

    // The standby answers at once, on every service, naming the leader. (It
    // answers from its start; the leader's URL once it has read the key.)
    let started = Instant::now();
    let statuses = loop {
        let asked = Instant::now();
        let statuses = standby_answers(&url_b).await.unwrap_or_default();
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "{:?}",
            asked.elapsed()
        );
        if !statuses.is_empty() && statuses.iter().all(|s| leader_of(s).is_some()) {
            break statuses;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the standby never named the leader: {statuses:?}\n{}",
            b.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for s in &statuses {
        assert_eq!(s.code(), Code::Unavailable, "{s:?}");
        assert_eq!(
            s.message(),
            format!("standby; the leader is {url_a}; retry there")
        );
        assert_eq!(
            s.metadata().get(LEADER_METADATA).unwrap().to_str().unwrap(),
            url_a
        );
    }
    assert!(
        b.url.try_recv().is_err(),
        "b must not lead yet:\n{}",
        b.log()
    );

    // An agent given both URLs, the standby first, registers with the leader.
    let agent_log = dir.path().join("agent.log");
    let work = dir.path().join("agent");
    let agent = Proc {
        child: Command::new(bin("gpuctl-agent"))
            .args(["--coordinator", &format!("{url_b},{url_a}")])
            .args(["--name", "node-x", "--cpu-ranks", "1", "--no-gpu"])
            .arg("--work-dir")
            .arg(&work)
            .args(["--heartbeat-interval", "500ms", "--metrics-listen", "off"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&agent_log).unwrap())
            .spawn()
            .expect("start gpuctl-agent"),
        log: agent_log,
    };
    // The CLI too: standby first, leader second.
    let both_b_first = format!("{url_b},{url_a}");
    wait_registered(&both_b_first, "node-x", 0, &agent, Duration::from_secs(30));
    let out = gpuctl(&both_b_first, &["nodes"]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("node-x"));
    assert!(
        agent.log().contains(&format!("leader={url_a}")),
        "{}",
        agent.log()
    );

    // kill -9 of the leader: the standby takes over once the lease expires.
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let killed_ms = gpuctl_core::now_ms();
    assert_eq!(b.serving(LEADER_TTL + Duration::from_secs(20)), url_b);

    // The CLI with the dead leader first uses the new one; the agent
    // registers with it again.
    let both_a_first = format!("{url_a},{url_b}");
    wait_registered(
        &both_a_first,
        "node-x",
        killed_ms,
        &agent,
        Duration::from_secs(30),
    );
    let out = gpuctl(&both_a_first, &["nodes"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        agent.log().contains(&format!("leader={url_b}")),
        "{}",
        agent.log()
    );

    // Nobody left: exit 4 ("coordinator unreachable"), naming every URL.
    drop(b);
    let out = gpuctl(&both_a_first, &["nodes"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("cannot reach coordinator"), "{stderr}");
    assert!(
        stderr.contains(&url_a) && stderr.contains(&url_b),
        "{stderr}"
    );
}

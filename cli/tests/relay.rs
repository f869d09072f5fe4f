//! How workers reach the coordinator, counted on the real sockets: with the
//! agent's relay (the default) the coordinator holds one connection per node
//! while a job's ranks work, and no worker holds any to it; with
//! `--worker-connections direct` every worker dials it itself. Both ways the
//! job's results arrive and it passes. A worker whose own way to the
//! coordinator is cut, while its agent's holds, ends unknown, not failed.

mod common;

use std::collections::HashSet;
use std::io::ErrorKind;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

/// One line of /proc/net/tcp{,6}: local port, remote port, state, inode.
struct Socket {
    local_port: u16,
    remote_port: u16,
    established: bool,
    inode: u64,
}

fn sockets() -> Vec<Socket> {
    let port = |addr: &str| {
        addr.rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok())
            .unwrap_or(0)
    };
    let mut out = Vec::new();
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 {
                continue;
            }
            out.push(Socket {
                local_port: port(f[1]),
                remote_port: port(f[2]),
                // TCP_ESTABLISHED
                established: f[3] == "01",
                inode: f[9].parse().unwrap_or(0),
            });
        }
    }
    out
}

/// Socket inodes a process holds open.
fn socket_inodes(pid: u32) -> HashSet<u64> {
    let mut inodes = HashSet::new();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return inodes;
    };
    for fd in fds.flatten() {
        if let Ok(target) = std::fs::read_link(fd.path()) {
            let t = target.to_string_lossy();
            if let Some(n) = t.strip_prefix("socket:[").and_then(|t| t.strip_suffix(']')) {
                inodes.extend(n.parse::<u64>().ok());
            }
        }
    }
    inodes
}

/// What the coordinator's port sees now: connections it accepted, and how
/// many of them belong to workers of the job.
fn connections(cluster: &Cluster, job: &str) -> (usize, usize) {
    let port = cluster.port;
    let all = sockets();
    let accepted = all
        .iter()
        .filter(|s| s.established && s.local_port == port)
        .count();
    let workers: HashSet<u64> = cluster
        .worker_pids(job)
        .into_iter()
        .flat_map(socket_inodes)
        .collect();
    let of_workers = all
        .iter()
        .filter(|s| s.established && s.remote_port == port && workers.contains(&s.inode))
        .count();
    (accepted, of_workers)
}

/// Runs an 8 s stress on 2 nodes of 2 CPU ranks and samples the
/// coordinator's connections while every rank works; returns the samples
/// (accepted, of workers) after checking that the job passed.
fn sample_during_a_job(agent_args: &[&str]) -> Vec<(usize, usize)> {
    let cluster = Cluster::start_with_agent_args(2, 2, "15s", agent_args);
    let id = cluster.submit(&["stress", "--duration", "8s", "--nodes", "2"]);
    cluster.wait_workers(&id, 4, Duration::from_secs(60));
    cluster.wait_all_progress(&id, 4);
    let mut samples = Vec::new();
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        samples.push(connections(&cluster, &id));
        std::thread::sleep(Duration::from_millis(200));
    }
    let state = cluster.wait_state(
        &id,
        &["succeeded", "failed", "cancelled"],
        Duration::from_secs(90),
    );
    assert_eq!(
        state,
        "succeeded",
        "{}\n{}",
        cluster.job(&id),
        cluster.logs()
    );
    let report = cluster.json(&["report", &id]);
    passed(&report);
    samples
}

#[test]
fn through_the_relay_the_coordinator_holds_one_connection_per_node() {
    let _g = serial();
    let samples = sample_during_a_job(&[]);
    assert!(
        samples
            .iter()
            .all(|&(accepted, of_workers)| accepted == 2 && of_workers == 0),
        "wanted 2 connections (the agents') and none of a worker in every sample: {samples:?}"
    );
}

#[test]
fn direct_workers_each_connect_themselves() {
    let _g = serial();
    let samples = sample_during_a_job(&["--worker-connections", "direct"]);
    // Each worker calls from its main thread and its progress thread.
    assert!(
        samples
            .iter()
            .any(|&(accepted, of_workers)| of_workers >= 4 && accepted >= 2 + of_workers),
        "wanted every worker's own connections: {samples:?}"
    );
}

/// A TCP way to the coordinator that the test cuts, as a firewall rule
/// would for some processes of a host: it passes bytes both ways until
/// [`Way::cut`], which resets every connection on it but those it was told
/// to keep ([`Way::keep_open`]), and stops listening, so that new calls
/// over it are refused.
struct Way {
    port: u16,
    to: Arc<AtomicU16>,
    cut: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    kept: Mutex<Vec<TcpStream>>,
}

impl Way {
    fn start() -> Way {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the way");
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let way = Way {
            port,
            to: Arc::new(AtomicU16::new(0)),
            cut: Arc::new(AtomicBool::new(false)),
            open: Arc::new(Mutex::new(Vec::new())),
            kept: Mutex::new(Vec::new()),
        };
        let (to, cut, open) = (way.to.clone(), way.cut.clone(), way.open.clone());
        std::thread::spawn(move || {
            while !cut.load(Ordering::SeqCst) {
                let inbound = match listener.accept() {
                    Ok((s, _)) => s,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                    Err(e) => panic!("the way's accept: {e}"),
                };
                let port = to.load(Ordering::SeqCst);
                let Ok(outbound) = TcpStream::connect(("127.0.0.1", port)) else {
                    continue;
                };
                inbound.set_nonblocking(false).unwrap();
                let mut held = open.lock().unwrap();
                for (mut from, mut into) in [
                    (inbound.try_clone().unwrap(), outbound.try_clone().unwrap()),
                    (outbound.try_clone().unwrap(), inbound.try_clone().unwrap()),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut into);
                        let _ = into.shutdown(Shutdown::Both);
                    });
                }
                held.extend([inbound, outbound]);
            }
            // Dropped: a connect to the port is refused from now on.
            drop(listener);
        });
        way
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The connections open now are left alone by [`Way::cut`].
    fn keep_open(&self) {
        let open = std::mem::take(&mut *self.open.lock().unwrap());
        self.kept.lock().unwrap().extend(open);
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// At 16,384 × 8 a starved coordinator answered no ReportResult for 65 s;
/// the worker gave up and exited 1, and the job failed its healthy node.
/// Here node-1's agent and its workers (direct, to the advertised URL)
/// reach the coordinator over one way, cut for the workers while they
/// work; the agent's connection and node-0's keep going. node-1's worker
/// gives up after its wait (30 s) and says so by its exit code: the job
/// ends incomplete, node-1 is not judged (no run in the fleet history),
/// node-0 passes and is named in no failure.
#[test]
fn a_result_cut_off_from_the_coordinator_is_unknown_and_fails_no_node() {
    let _g = serial();
    let way = Way::start();
    let url = way.url();
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").expect("a free port");
        l.local_addr().unwrap().port()
    };
    way.to.store(port, Ordering::SeqCst);
    let listen = format!("127.0.0.1:{port}");
    let node_1: &[&str] = &[
        "--coordinator",
        &url,
        "--worker-connections",
        "direct",
        "--coordinator-grace",
        "1s",
    ];
    let cluster = Cluster::start_each(
        &[&[], node_1],
        1,
        "15s",
        &[],
        &[("GPUCTL_ADVERTISE_URL", &url), ("GPUCTL_LISTEN", &listen)],
    );
    // The agents' own connections, node-1's over the way.
    way.keep_open();
    let id = cluster.submit(&["stress", "--duration", "6s", "--nodes", "2"]);
    cluster.wait_workers(&id, 2, Duration::from_secs(60));
    cluster.wait_all_progress(&id, 2);
    way.cut();
    let cut = Instant::now();
    let state = cluster.wait_state(
        &id,
        &["succeeded", "failed", "cancelled"],
        Duration::from_secs(120),
    );
    // `report` exits 1 for any verdict but pass, and prints it all the same.
    let out = cluster.gpuctl(&["report", &id, "--output", "json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no report JSON ({e}): {}", stderr(&out)));
    let (verdict, reason) = (report["verdict"].as_str(), report["reason"].as_str());
    assert_eq!(
        (state.as_str(), verdict),
        ("failed", Some("incomplete")),
        "{report:#}\n{}",
        cluster.logs()
    );
    let reason = reason.unwrap_or_default();
    assert!(
        reason.contains("did not reach the coordinator") && reason.contains("node-1"),
        "{reason}"
    );
    assert!(!reason.contains("node-0"), "{reason}");
    assert!(
        cut.elapsed() >= Duration::from_secs(25),
        "the worker waited {:?}, not its 30 s",
        cut.elapsed()
    );
    let node = |name: &str| {
        nodes_array(&report)
            .into_iter()
            .find(|n| n["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {report:#}"))
    };
    let (n0, n1) = (node("node-0"), node("node-1"));
    assert_eq!(n0["verdict"], "pass", "{n0:#}");
    assert_eq!(n1["verdict"], "unknown", "{n1:#}");
    assert!(
        n1["reason"]
            .as_str()
            .unwrap_or("")
            .starts_with("not judged"),
        "{n1:#}"
    );
    assert!(fails(&report["findings"]).is_empty(), "{report:#}");
    // The fleet history has node-0's run and none of node-1's.
    let fleet = cluster.json(&["fleet"]);
    assert_eq!(
        fleet_row(&fleet, "node-0")["last_verdict"],
        "pass",
        "{fleet:#}"
    );
    let rows = fleet["nodes"].as_array().expect("nodes[]");
    assert!(rows.iter().all(|r| r["node"] != "node-1"), "{fleet:#}");
}

//! How workers reach the coordinator, counted on the real sockets: with the
//! agent's relay (the default) the coordinator holds one connection per node
//! while a job's ranks work, and no worker holds any to it; with
//! `--worker-connections direct` every worker dials it itself. Both ways the
//! job's results arrive and it passes.

mod common;

use std::collections::HashSet;
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

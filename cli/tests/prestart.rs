//! Pre-started workers on a real local fleet: ranks run on the idle
//! `gpuctl-worker --prestarted` processes the agent started before the job,
//! every slot gets a new one after its rank, and neither a cancel, nor a
//! prestarted worker killed while idle, nor the agent stopping leaves a process behind.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// Idle prestarted workers of the agent `agent`: its children whose command line is
/// still `gpuctl-worker --prestarted` (zombies excluded).
fn prestarted(agent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let f: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, r)| r.split_whitespace().collect())
            .unwrap_or_default();
        if f.len() < 2 || f[0] == "Z" || f[1] != agent.to_string() {
            continue;
        }
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        if args.len() > 1
            && args[0].ends_with(b"gpuctl-worker")
            && args[1] == b"--prestarted".as_slice()
        {
            out.push(pid);
        }
    }
    out.sort();
    out
}

fn wait_prestarted(agent: u32, n: usize, limit: Duration) -> Vec<u32> {
    let start = Instant::now();
    loop {
        let s = prestarted(agent);
        if s.len() == n {
            return s;
        }
        assert!(
            start.elapsed() < limit,
            "agent {agent} has prestarted workers {s:?}, not {n}, after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether the process exists at all (a zombie counts: it was not reaped).
fn exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn jobs_run_on_prestarted_workers_and_nothing_is_left_behind() {
    let cluster = Cluster::start(1, 2);
    let agent = cluster.agent_pid(0);
    let before = wait_prestarted(agent, 2, Duration::from_secs(30));

    // A job's workers are the prestarted workers that were there before the submit,
    // showing the job's command line like a worker started cold.
    let id = cluster.submit(&["stress", "--duration", "3s", "--nodes", "1"]);
    cluster.wait_workers(&id, 2, Duration::from_secs(20));
    let mut workers = cluster.worker_pids(&id);
    workers.sort();
    assert_eq!(
        workers, before,
        "the job's workers are the prestarted workers"
    );
    assert_eq!(
        cluster.wait_state(&id, &["succeeded", "failed"], Duration::from_secs(60)),
        "succeeded",
        "{}",
        cluster.logs()
    );
    let report = cluster.json(&["report", &id]);
    assert_eq!(report["verdict"], "pass", "{report}");
    let ranks: Vec<u64> = report["nodes"][0]["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rank"].as_u64().unwrap())
        .collect();
    assert_eq!(ranks, vec![0, 1]);

    // Each slot got a new prestarted worker once its rank ended.
    let after = wait_prestarted(agent, 2, Duration::from_secs(20));
    assert!(
        after.iter().all(|p| !before.contains(p)),
        "{before:?} {after:?}"
    );

    // A cancelled job: its workers (the prestarted workers) go, new prestarted workers come.
    let id = cluster.submit(&["stress", "--duration", "5m", "--nodes", "1"]);
    cluster.wait_workers(&id, 2, Duration::from_secs(20));
    let out = cluster.gpuctl(&["cancel", &id]);
    assert!(out.status.success(), "cancel: {}", stderr(&out));
    let gone = cluster.wait_workers_gone(&id, Duration::from_secs(10));
    assert!(gone.is_ok(), "workers alive after cancel: {gone:?}");
    assert_eq!(cluster.job_state(&id), "cancelled");
    let idle = wait_prestarted(agent, 2, Duration::from_secs(20));
    assert!(
        idle.iter().all(|p| !after.contains(p)),
        "{after:?} {idle:?}"
    );

    // A prestarted worker SIGKILLed while idle is reaped and replaced; the next job runs.
    unsafe { libc::kill(idle[0] as i32, libc::SIGKILL) };
    let t0 = Instant::now();
    while exists(idle[0]) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "killed prestarted worker {} never reaped",
            idle[0]
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let id = cluster.submit(&["stress", "--duration", "1s", "--nodes", "1"]);
    assert_eq!(
        cluster.wait_state(&id, &["succeeded", "failed"], Duration::from_secs(60)),
        "succeeded",
        "{}",
        cluster.logs()
    );
    let last = wait_prestarted(agent, 2, Duration::from_secs(20));

    // Stopping the agent ends its prestarted workers too.
    drop(cluster);
    for pid in last {
        assert!(!exists(pid), "prestarted worker {pid} outlived its agent");
    }
}

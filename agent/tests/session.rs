//! The agent's session against a stand-in coordinator on loopback: the real
//! gRPC transport, the real agent loop and real (shell-script) workers.
//! Checks the contract of docs/architecture.md "Agent process": heartbeat
//! first, ack, logs, kill on coordinator loss, re-register, kill on shutdown.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::{assignment, config, pid_alive, read_pid, workers};
use gpuctl_agent::facts::HostRoot;
use gpuctl_agent::gpus::GpuInventory;
use gpuctl_agent::preflight::Preflight;
use gpuctl_agent::session::{self, SessionConfig};
use gpuctl_proto::pb::{
    agent_message::Msg, coordinator_message, CancelJob, CoordinatorMessage, HostFacts,
    RankPlacement,
};
use gpuctl_testkit::coordinator::{FakeCoordinator, Replies};
use tokio_util::sync::CancellationToken;

/// The fake coordinator both tests talk to: it tells the agent a URL for
/// workers other than the one the agent dialled.
async fn coordinator() -> FakeCoordinator {
    FakeCoordinator::start_with(Replies {
        coordinator_url: "http://workers-use-this:1".into(),
        ..Replies::default()
    })
    .await
}

#[tokio::test]
async fn session_contract_loss_and_shutdown() {
    let tmp = tempfile::tempdir().unwrap();
    let mut coord = coordinator().await;
    let url = coord.url.clone();

    let (workers, events) = workers(tmp.path(), "$GPUCTL_COORDINATOR $4", &url);
    // Workers die with the session (no grace), as the contract below pins.
    let cfg = SessionConfig {
        facts: HostFacts {
            hostname: "h".into(),
            cpu_ranks: 1,
            ..Default::default()
        },
        ..config(&url)
    };
    let connected = cfg.connected.clone();
    let shutdown = CancellationToken::new();
    let agent = tokio::spawn(session::run(cfg, workers.clone(), events, shutdown.clone()));

    // Register, then a session whose first message is a heartbeat.
    let reg = coord.registration().await;
    assert_eq!(
        (reg.name.as_str(), reg.protocol_version),
        ("test-node", gpuctl_proto::PROTOCOL_VERSION)
    );
    let mut s = coord.session().await;
    match s.next().await {
        Msg::Heartbeat(h) => {
            assert_eq!(h.node, "test-node");
            assert_eq!(h.protocol_version, gpuctl_proto::PROTOCOL_VERSION);
            assert!(h.running.is_empty());
        }
        other => panic!("first message must be a heartbeat, got {other:?}"),
    }

    // Assignment → ack, the worker's output, and the rank listed as running.
    s.send(assignment("job-1")).await;
    let ack = s.ack().await;
    assert!(ack.ok, "{}", ack.error);
    assert_eq!(ack.job_id, "job-1");
    assert!(
        connected.load(Ordering::Relaxed),
        "session open → connected"
    );
    let line = s.log().await.lines[0].clone();
    assert_eq!(
        line, "http://workers-use-this:1 job-1",
        "workers get the coordinator's URL"
    );
    let running = s
        .until(|m| match m {
            Msg::Heartbeat(h) if !h.running.is_empty() => Some(h.running.clone()),
            _ => None,
        })
        .await;
    assert_eq!(
        (running[0].job_id.as_str(), running[0].ranks.clone()),
        ("job-1", vec![0])
    );
    let pid1 = read_pid(&tmp.path().join("pid-job-1")).await;
    assert!(pid_alive(pid1));

    // The coordinator ends the session: the worker dies, the agent registers again.
    s.close();
    let reg2 = coord.registration_within(Duration::from_secs(10)).await;
    assert_eq!(reg2.name, "test-node");
    assert!(
        !pid_alive(pid1),
        "worker {pid1} outlived the lost coordinator"
    );
    let mut s = coord.session().await;
    match s.next().await {
        Msg::Heartbeat(h) => assert!(h.running.is_empty(), "{:?}", h.running),
        other => panic!("first message must be a heartbeat, got {other:?}"),
    }
    // The killed worker's exit was kept and is sent on the new session.
    let exited = s.exited().await;
    assert_eq!(
        (exited.job_id.as_str(), exited.stopped_by().label()),
        ("job-1", "coordinator-lost")
    );

    // Cancel: the worker is killed and reported as cancelled.
    s.send(assignment("job-2")).await;
    assert!(s.ack().await.ok);
    let pid2 = read_pid(&tmp.path().join("pid-job-2")).await;
    s.send(CoordinatorMessage {
        msg: Some(coordinator_message::Msg::Cancel(CancelJob {
            job_id: "job-2".into(),
            attempt: 1,
            reason: "test".into(),
            ..Default::default()
        })),
    })
    .await;
    let exited = s.exited().await;
    assert_eq!(
        (
            exited.job_id.as_str(),
            exited.stopped_by().label(),
            exited.signal.as_str()
        ),
        ("job-2", "cancel", "SIGTERM")
    );
    assert!(!pid_alive(pid2));

    // Agent shutdown: the worker is killed, its exit still reaches the coordinator.
    s.send(assignment("job-3")).await;
    assert!(s.ack().await.ok);
    let pid3 = read_pid(&tmp.path().join("pid-job-3")).await;
    shutdown.cancel();
    let exited = s.exited().await;
    assert_eq!(
        (exited.job_id.as_str(), exited.stopped_by().label()),
        ("job-3", "agent-shutdown")
    );
    tokio::time::timeout(Duration::from_secs(10), agent)
        .await
        .expect("agent did not stop")
        .unwrap();
    assert!(!pid_alive(pid3));
    assert_eq!(workers.live_workers(), 0);
    assert!(
        !connected.load(Ordering::Relaxed),
        "no session → not connected"
    );
}

/// A failing preflight check refuses the assignment: `AssignmentAck{ok:false}`
/// naming the check and its fix, a `WorkerExited` per rank, no worker
/// started. The start checks travel with `Register`.
#[tokio::test]
async fn failing_preflight_refuses_the_assignment() {
    let tmp = tempfile::tempdir().unwrap();
    let mut coord = coordinator().await;
    let url = coord.url.clone();
    let (workers, events) = workers(tmp.path(), "$GPUCTL_COORDINATOR $4", &url);
    // A fixture host whose libtorch cannot be found.
    let checker = Arc::new(Preflight::new(
        "test-node",
        HostRoot::new(tmp.path().join("host")),
        Err("--libtorch /nowhere: no such folder".into()),
        &GpuInventory::none("unavailable: test"),
        2,
    ));
    let (_, start_checks) = checker.run(&Default::default());
    // Workers die with the session (no grace), as the contract above pins.
    let cfg = SessionConfig {
        preflight: start_checks,
        checker: Some(checker),
        ..config(&url)
    };
    let shutdown = CancellationToken::new();
    let agent = tokio::spawn(session::run(cfg, workers.clone(), events, shutdown.clone()));

    let reg = coord.registration().await;
    let names: Vec<&str> = reg.preflight.iter().map(|c| c.name.as_str()).collect();
    assert!(
        names.contains(&"libtorch") && names.contains(&"shm"),
        "{names:?}"
    );
    assert!(reg.preflight.iter().all(|c| c.node == "test-node"));

    let mut s = coord.session().await;
    let mut a = assignment("job-9");
    if let Some(coordinator_message::Msg::Assignment(a)) = &mut a.msg {
        a.ranks.push(RankPlacement {
            rank: 1,
            local_rank: 1,
            node: "test-node".into(),
            ..Default::default()
        });
    }
    s.send(a).await;
    let ack = s.ack().await;
    assert!(!ack.ok);
    assert!(
        ack.error
            .starts_with("node test-node: preflight failed: libtorch: "),
        "{}",
        ack.error
    );
    assert!(
        ack.error.contains("fix: run scripts/install-libtorch.sh"),
        "{}",
        ack.error
    );
    let mut exited = Vec::new();
    while exited.len() < 2 {
        let e = s.exited().await;
        exited.push((e.rank, e.exit_code, e.stderr_tail.contains("libtorch")));
    }
    exited.sort();
    assert_eq!(exited, vec![(0, 127, true), (1, 127, true)]);
    assert!(
        !tmp.path().join("pid-job-9").exists(),
        "no worker may start"
    );
    assert!(workers.running().is_empty());

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), agent)
        .await
        .expect("agent did not stop")
        .unwrap();
}

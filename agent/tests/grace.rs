//! An agent that loses its coordinator keeps its workers for the grace: it
//! registers again listing them, stops the jobs the coordinator refuses, and
//! stops the rest only when the grace runs out without a session; the exits
//! still reach the coordinator it finds next. Against a stand-in coordinator
//! on loopback with real (shell-script) workers.

mod common;

use std::time::Duration;

use common::{assignment, config, pid_alive, read_pid, workers};
use gpuctl_agent::session::{self, SessionConfig};
use gpuctl_testkit::FakeCoordinator;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn workers_outlive_the_coordinator_for_the_grace() {
    let tmp = tempfile::tempdir().unwrap();
    // A coordinator that refuses job-2 when the agent asks it to adopt it.
    let mut coord = FakeCoordinator::start().await;
    coord.refuse(&["job-2"]);
    let url = coord.url.clone();
    let (workers, events) = workers(tmp.path(), "grace=$GPUCTL_COORDINATOR_GRACE_MS", &url);
    let grace = Duration::from_secs(3);
    let cfg = SessionConfig {
        coordinator_grace: grace,
        ..config(&url)
    };
    let shutdown = CancellationToken::new();
    let agent = tokio::spawn(session::run(cfg, workers.clone(), events, shutdown.clone()));

    assert!(coord.registration().await.running.is_empty());
    let mut s = coord.session().await;
    for job in ["job-1", "job-2"] {
        s.send(assignment(job)).await;
        assert!(s.ack().await.ok);
    }
    let line = s.log().await.lines[0].clone();
    assert_eq!(line, "grace=3000", "workers are told the grace");
    let pid1 = read_pid(&tmp.path().join("pid-job-1")).await;
    let pid2 = read_pid(&tmp.path().join("pid-job-2")).await;

    // The session ends: the agent registers again listing both jobs, keeps
    // the adopted one and stops the refused one.
    s.close();
    let reg = coord.registration_within(Duration::from_secs(10)).await;
    let listed: Vec<&str> = reg.running.iter().map(|r| r.job_id.as_str()).collect();
    assert_eq!(listed, vec!["job-1", "job-2"]);
    let mut s = coord.session().await;
    let exited = s.exited().await;
    assert_eq!(
        (exited.job_id.as_str(), exited.stopped_by().label()),
        ("job-2", "coordinator-lost")
    );
    assert!(!pid_alive(pid2));
    assert!(pid_alive(pid1), "the adopted job's worker runs on");

    // Away for longer than the grace: the worker is stopped at its end, and
    // its exit reaches the coordinator once it is back.
    coord.set_away(true);
    let lost_at = std::time::Instant::now();
    s.close();
    tokio::time::sleep(grace - Duration::from_millis(500)).await;
    assert!(pid_alive(pid1), "killed before the grace ended");
    let mut gone = None;
    for _ in 0..100 {
        if !pid_alive(pid1) {
            gone = Some(lost_at.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let gone = gone.expect("the worker outlived the grace by 5 s");
    assert!(gone >= grace, "{gone:?}");
    coord.set_away(false);
    let reg = coord.registration_within(Duration::from_secs(15)).await;
    assert!(reg.running.is_empty(), "{:?}", reg.running);
    let mut s = coord.session().await;
    let exited = s.exited().await;
    assert_eq!(
        (exited.job_id.as_str(), exited.stopped_by().label()),
        ("job-1", "coordinator-lost")
    );

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), agent)
        .await
        .expect("agent did not stop")
        .unwrap();
    assert_eq!(workers.live_workers(), 0);
}

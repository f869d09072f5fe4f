//! The coordinator's pace through the real session against a stand-in
//! coordinator: a `Pace` message spaces the agent's heartbeats out, and one
//! asking for no spacing brings back the interval it had.

mod common;

use std::time::Duration;

use common::{config, workers};
use gpuctl_agent::session::{self, SessionConfig};
use gpuctl_proto::pb::{agent_message::Msg, coordinator_message, CoordinatorMessage, Pace};
use gpuctl_testkit::coordinator::{FakeCoordinator, FakeSession};
use tokio_util::sync::CancellationToken;

fn pace(heartbeat_ms: u32) -> CoordinatorMessage {
    CoordinatorMessage {
        msg: Some(coordinator_message::Msg::Pace(Pace {
            heartbeat_interval_ms: heartbeat_ms,
            telemetry_send_ms: 0,
        })),
    }
}

/// Heartbeats the agent sends within `d`.
async fn beats_within(s: &mut FakeSession, d: Duration) -> usize {
    let until = tokio::time::Instant::now() + d;
    let mut n = 0;
    while let Ok(m) = tokio::time::timeout_at(until, s.inbound.message()).await {
        if let Some(Msg::Heartbeat(_)) = m.unwrap().unwrap().msg {
            n += 1;
        }
    }
    n
}

#[tokio::test]
async fn a_pace_spaces_heartbeats_out_and_no_pace_brings_them_back() {
    let tmp = tempfile::tempdir().unwrap();
    let mut coord = FakeCoordinator::start().await;
    let url = coord.url.clone();
    let (workers, events) = workers(tmp.path(), "", &url);
    let cfg = SessionConfig {
        heartbeat_interval: Duration::from_millis(100),
        ..config(&url)
    };
    let shutdown = CancellationToken::new();
    let agent = tokio::spawn(session::run(cfg, workers, events, shutdown.clone()));
    coord.registration().await;
    let mut s = coord.session().await;

    let unpaced = beats_within(&mut s, Duration::from_secs(1)).await;
    assert!(unpaced >= 4, "{unpaced} heartbeats in 1 s at 100 ms");

    // Paced to a minute: the first beat is a minute away.
    s.send(pace(60_000)).await;
    let paced = beats_within(&mut s, Duration::from_secs(2)).await;
    assert!(paced <= 1, "{paced} heartbeats in 2 s after a 60 s pace");

    s.send(pace(0)).await;
    let again = beats_within(&mut s, Duration::from_secs(1)).await;
    assert!(
        again >= 4,
        "{again} heartbeats in 1 s once no pace is asked"
    );

    shutdown.cancel();
    agent.await.unwrap();
}

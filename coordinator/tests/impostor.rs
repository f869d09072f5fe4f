//! A session opened under a live node's name (issue 35): the real agent's
//! session used to stay open with its heartbeats ignored, and its node stayed
//! `lost` long after the impostor left. The agent whose session was let go is
//! told (ABORTED), so it registers again, and the node is ready again.

mod common;

use std::time::Duration;

use common::{list_nodes, start};
use gpuctl_proto::pb::NodeState;
use gpuctl_testkit::{host, FakeAgent};
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_whose_session_is_taken_is_told_and_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let coord = start(dir.path(), Duration::from_secs(2)).await;
    let mut real = FakeAgent::start(&coord.url, "n", host::cpu("n", 1), vec![]).await;
    let impostor = FakeAgent::start(&coord.url, "n", host::cpu("n", 1), vec![]).await;
    let told = tokio::time::timeout(Duration::from_secs(5), real.down.message())
        .await
        .expect("the replaced session is ended, not left open");
    let status = told.expect_err("ended with a status");
    assert_eq!(status.code(), Code::Aborted, "{status}");
    assert!(status.message().contains("register again"), "{status}");

    // The impostor leaves; the real agent registers again (as gpuctl-agent
    // does on a broken session) and its node is ready, not lost.
    drop(impostor);
    let _back = FakeAgent::start(&coord.url, "n", host::cpu("n", 1), vec![]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut jobs = coord.jobs().await;
    let nodes = list_nodes(&mut jobs).await;
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].state(), NodeState::Ready, "{:?}", nodes[0]);
    coord.shutdown().await;
}

//! A coordinator that closes its connections (here by a short
//! `--max-connection-age`; under load by its keepalive, issue 51) loses no
//! client's call: the gRPC client every gpuctl process builds
//! (gpuctl_core::client) opens a new connection and makes again the calls
//! the closing cut short. A counting TCP relay in front of the coordinator
//! shows the connections did close.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gpuctl_proto::pb::job_service_client::JobServiceClient;
use gpuctl_proto::pb::{GetFleetRequest, ListJobsRequest, ListNodesRequest, SubmitRequest};
use tokio::net::{TcpListener, TcpStream};

/// Relays every connection to `to`, counting them.
async fn counting_relay(to: String) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let to = to.clone();
            tokio::spawn(async move {
                if let Ok(mut up) = TcpStream::connect(&to).await {
                    let _ = tokio::io::copy_bidirectional(&mut conn, &mut up).await;
                }
            });
        }
    });
    (url, count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_cut_short_by_the_coordinator_closing_connections_are_made_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = gpuctl_coordinator::Config::for_dir(dir.path());
    cfg.max_connection_age = Some(Duration::from_millis(100));
    let co = common::start_cfg(cfg).await;
    co.jobs().await; // up
    let (url, opened) = counting_relay(co.url.trim_start_matches("http://").to_string()).await;
    let channel = gpuctl_core::client::builder(&url).connect().await.unwrap();

    // Eight callers at once, as a CLI's `watch` and scripts beside an
    // agent's calls, until the coordinator has closed a dozen connections.
    let mut callers = Vec::new();
    for i in 0..8 {
        let mut c = JobServiceClient::new(channel.clone());
        let opened = opened.clone();
        callers.push(tokio::spawn(async move {
            let mut calls = 0u64;
            let deadline = std::time::Instant::now() + Duration::from_secs(120);
            while opened.load(Ordering::SeqCst) < 12 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the coordinator closed fewer than 12 connections in 2 minutes"
                );
                let r = match (i + calls) % 3 {
                    0 => c.list_nodes(ListNodesRequest::default()).await.map(drop),
                    1 => c.get_fleet(GetFleetRequest::default()).await.map(drop),
                    _ => c.list_jobs(ListJobsRequest { limit: 10 }).await.map(drop),
                };
                if let Err(e) = r {
                    panic!("call {calls} of caller {i} failed: {e}");
                }
                calls += 1;
            }
            calls
        }));
    }
    let mut calls = 0;
    for c in callers {
        calls += c.await.unwrap();
    }
    assert!(calls > 0);

    // A call that is no read goes again only when the coordinator never
    // took it: the answer is the coordinator's (no nodes), never a
    // transport error.
    let mut c = JobServiceClient::new(channel.clone());
    for _ in 0..20 {
        let e = c
            .submit(SubmitRequest {
                spec: Some(gpuctl_proto::pb::JobSpec {
                    workload: "stress".into(),
                    all_nodes: true,
                    duration_ms: 1000,
                    ..Default::default()
                }),
            })
            .await
            .map(|j| j.into_inner().id);
        if let Err(e) = &e {
            use tonic::Code::*;
            assert!(
                !matches!(e.code(), Cancelled | Unavailable | Internal | Unknown),
                "{e}"
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    co.shutdown().await;
}

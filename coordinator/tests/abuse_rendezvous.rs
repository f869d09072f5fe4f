//! Rendezvous keys written by a rank that does not own them, with that
//! rank's real secret over real gRPC: a probe once had rank 2 write rank 0's
//! pair address first and rank 0 connect to `6.6.6.6:6666` (issue 46). Every
//! key has one writer named by the key; any other rank is refused, named,
//! and counted on `/metrics`, and readers get the owner's value.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{as_rank, secrets, spec, Coord};
use gpuctl_coordinator::config::MetricsListen;
use gpuctl_coordinator::Config;
use gpuctl_proto::pb::worker_service_client::WorkerServiceClient;
use gpuctl_proto::pb::*;
use gpuctl_testkit::FakeAgent;
use tonic::transport::Channel;
use tonic::Code;

const REFUSED: &str = "gpuctl_refused_messages_total{kind=\"rendezvous\"}";

/// A coordinator with metrics and a stress job on three one-rank CPU
/// nodes: (coordinator, agents, job id, every rank's secret).
async fn running_job(
    dir: &std::path::Path,
) -> (Coord, Vec<FakeAgent>, String, HashMap<u32, String>) {
    let mut cfg = Config::for_dir(dir);
    cfg.metrics_listen = Some(MetricsListen::At("127.0.0.1:0".parse().unwrap()));
    let coord = common::start_with_metrics(cfg).await;
    let mut agents = Vec::new();
    for n in 0..3 {
        agents.push(FakeAgent::cpu(&coord.url, &format!("node-{n}")).await);
    }
    let mut jobs = coord.jobs().await;
    let id = jobs
        .submit(spec("stress", 3))
        .await
        .unwrap()
        .into_inner()
        .id;
    let mut assignments = Vec::new();
    for a in &mut agents {
        assignments.push(a.assignment().await);
    }
    let sec = secrets(&assignments.iter().collect::<Vec<_>>());
    (coord, agents, id, sec)
}

fn put(job: &str, key: &str, value: &[u8]) -> RendezvousPutRequest {
    RendezvousPutRequest {
        job_id: job.into(),
        attempt: 1,
        key: key.into(),
        value: value.to_vec(),
    }
}

fn get(job: &str, key: &str) -> RendezvousGetRequest {
    RendezvousGetRequest {
        job_id: job.into(),
        attempt: 1,
        key: key.into(),
        timeout_ms: 200,
    }
}

/// A job's ranks, each speaking with its own secret.
struct Ranks {
    w: WorkerServiceClient<Channel>,
    sec: HashMap<u32, String>,
    job: String,
}

impl Ranks {
    async fn put(&mut self, rank: u32, key: &str, value: &[u8]) -> Result<Ack, tonic::Status> {
        let req = as_rank(&self.sec, rank, put(&self.job, key, value));
        self.w.rendezvous_put(req).await.map(|r| r.into_inner())
    }

    async fn get(&mut self, rank: u32, key: &str) -> Result<RendezvousGetResponse, tonic::Status> {
        let req = as_rank(&self.sec, rank, get(&self.job, key));
        self.w.rendezvous_get(req).await.map(|r| r.into_inner())
    }

    /// Rank `rank`'s write of `key`, which must be refused naming the key
    /// and `names`.
    async fn refused(&mut self, rank: u32, key: &str, names: &[&str]) {
        let status = self
            .put(rank, key, b"6.6.6.6:6666")
            .await
            .expect_err("a write of another rank's key is refused");
        assert_eq!(status.code(), Code::PermissionDenied, "{key}: {status:?}");
        let msg = status.message();
        assert!(msg.contains(&format!("`{key}`")), "{msg}");
        for n in names {
            assert!(msg.contains(n), "{key}: `{n}` missing from {msg}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_cannot_write_another_s_key_and_readers_get_the_owner_s() {
    let dir = tempfile::tempdir().unwrap();
    let (coord, _agents, job, sec) = running_job(dir.path()).await;
    let w = coord.workers().await;
    let mut r = Ranks { w, sec, job };
    let pair = "pairs/0/0-1/tcp/addr/0@0";

    // Rank 2 goes first: at rank 0's pair address, at the key as it was
    // before keys named their writer, at rank 0's job-wide address and at
    // the shape verdict of pairs.
    r.refused(2, pair, &["rank 0's", "rank 2 may not"]).await;
    let unowned = "pairs/0/0-1/tcp/addr/0";
    r.refused(2, unowned, &["names no writer", "rank 2"]).await;
    r.refused(2, "tcp/addr/0", &["rank 0's", "rank 2"]).await;
    r.refused(2, "pairs/shape@0", &["rank 0's", "rank 2"]).await;

    // Rank 0 writes its own; a reader gets exactly that.
    let ack = r.put(0, pair, b"127.0.0.1:4000").await.unwrap();
    assert!(ack.ok, "{ack:?}");
    r.refused(2, pair, &["rank 0's"]).await;
    let got = r.get(1, pair).await.unwrap();
    assert!(got.found, "{got:?}");
    assert_eq!(got.value, b"127.0.0.1:4000");
    // Rank 2 may write its own key: no reader of rank 0's asks for it.
    let ack = r.put(2, "pairs/0/0-1/tcp/addr/0@2", b"6.6.6.6:6666").await;
    assert!(ack.unwrap().ok);
    // Nothing rank 2 was refused is stored.
    let got = r.get(1, unowned).await.unwrap();
    assert!(!got.found && !got.job_over, "{got:?}");

    // A write with no secret is refused as before, and counts as no rank's.
    let e =
        r.w.rendezvous_put(put(&r.job, pair, b"x"))
            .await
            .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("not from rank 0's worker"), "{e}");

    // Five refusals of ranks of the job, counted.
    let start = Instant::now();
    loop {
        let body = coord.get("/metrics").await.body;
        let n = gpuctl_core::metrics_http::value(&body, REFUSED);
        if n == Some(5.0) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{REFUSED} is {n:?}, not 5:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    coord.shutdown().await;
}

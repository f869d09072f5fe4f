//! The harness the integration tests share: an in-process coordinator
//! ([`Coord`]) served on a loopback `TcpListener`, and the requests and job
//! polling (`spec`, `job`, `wait_state`, `latest_telemetry`) the tests drive
//! it with. The agents that talk to it are `gpuctl_testkit::FakeAgent`s.
//!
//! Not every test uses every helper, hence the `dead_code` allowance.

#![allow(dead_code)]

use std::time::Duration;

use gpuctl_coordinator::Config;
use gpuctl_core::shutdown::Shutdown;
use gpuctl_proto::pb::job_service_client::JobServiceClient;
use gpuctl_proto::pb::worker_service_client::WorkerServiceClient;
use gpuctl_proto::pb::*;
use gpuctl_testkit::FakeAgent;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// A coordinator running in this process until [`Coord::shutdown`].
pub struct Coord {
    /// The gRPC URL (`http://127.0.0.1:PORT`).
    pub url: String,
    /// The metrics listener's address, where one was started.
    pub metrics: Option<String>,
    stop: Shutdown,
    task: JoinHandle<anyhow::Result<()>>,
}

/// A coordinator on `dir` with the given node timeout and no metrics listener.
pub async fn start(dir: &std::path::Path, node_timeout: Duration) -> Coord {
    let mut cfg = Config::for_dir(dir);
    cfg.node_timeout = node_timeout;
    start_cfg(cfg).await
}

/// A coordinator on `cfg`, serving metrics where `cfg.metrics_listen` says.
pub async fn start_with_metrics(cfg: Config) -> Coord {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics = gpuctl_coordinator::server::bind_metrics(&cfg)
        .await
        .unwrap()
        .expect("metrics listener");
    let url = format!("http://{}", listener.local_addr().unwrap());
    let metrics_at = metrics.local_addr().unwrap().to_string();
    let stop = Shutdown::new();
    let task = tokio::spawn(gpuctl_coordinator::server::run_with(
        cfg,
        listener,
        Some(metrics),
        stop.clone(),
    ));
    Coord {
        url,
        metrics: Some(metrics_at),
        stop,
        task,
    }
}

impl Coord {
    /// A job client; retries the connection for a moment while the server
    /// comes up.
    pub async fn jobs(&self) -> JobServiceClient<Channel> {
        for _ in 0..50 {
            if let Ok(c) = JobServiceClient::connect(self.url.clone()).await {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("coordinator at {} does not answer", self.url);
    }

    pub async fn workers(&self) -> WorkerServiceClient<Channel> {
        WorkerServiceClient::connect(self.url.clone())
            .await
            .unwrap()
    }

    pub async fn shutdown(self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("coordinator stops within 10 s")
            .unwrap()
            .unwrap();
    }

    /// A plain HTTP/1.1 GET on the metrics listener, as Prometheus does it.
    pub async fn get(&self, path: &str) -> gpuctl_core::metrics_http::Scrape {
        let at = self.metrics.as_deref().expect("a metrics listener");
        let within = Duration::from_secs(10);
        gpuctl_core::metrics_http::get(at, path, within)
            .await
            .unwrap_or_else(|e| panic!("GET {path} from {at}: {e}"))
    }
}

/// A job of `workload` on `nodes` nodes running for `duration_ms`.
pub fn submit_request(workload: &str, nodes: u32, duration_ms: u64) -> SubmitRequest {
    SubmitRequest {
        spec: Some(JobSpec {
            workload: workload.into(),
            node_count: nodes,
            duration_ms,
            ..Default::default()
        }),
    }
}

/// A one-second job of `workload` on `nodes` nodes.
pub fn spec(workload: &str, nodes: u32) -> SubmitRequest {
    submit_request(workload, nodes, 1_000)
}

/// Every node the coordinator knows.
/// The fleet view after an attack: `gpuctl nodes` as a table and as JSON
/// answers, through the real CLI, and lists `expect` nodes.
pub fn fleet_view_answers(url: &str, expect: usize) {
    let table = etcd::gpuctl(url, &["nodes"]);
    assert!(
        table.status.success(),
        "gpuctl nodes: {}",
        String::from_utf8_lossy(&table.stderr)
    );
    let json = etcd::gpuctl(url, &["nodes", "-o", "json"]);
    assert!(
        json.status.success(),
        "gpuctl nodes -o json: {}",
        String::from_utf8_lossy(&json.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("nodes JSON");
    let n = v.as_array().map_or(0, Vec::len);
    assert_eq!(n, expect, "{v:#}");
}

pub async fn list_nodes(c: &mut JobServiceClient<Channel>) -> Vec<Node> {
    c.list_nodes(ListNodesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .nodes
}

pub async fn job(c: &mut JobServiceClient<Channel>, id: &str) -> Job {
    c.get_job(GetJobRequest {
        job_id: id.into(),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
}

/// Polls job `id` every 100 ms until it is in state `want`; fails after `limit`.
pub async fn wait_state(
    c: &mut JobServiceClient<Channel>,
    id: &str,
    want: JobState,
    limit: Duration,
) -> Job {
    let start = std::time::Instant::now();
    loop {
        let j = job(c, id).await;
        if j.state() == want {
            return j;
        }
        assert!(
            start.elapsed() < limit,
            "job {id} is {:?}, wanted {want:?}: {j:?}",
            j.state()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls a job's latest telemetry (up to 50 times, `pause` apart) until
/// `done` holds of it; returns the last answer either way.
pub async fn latest_telemetry(
    c: &mut JobServiceClient<Channel>,
    id: &str,
    pause: Duration,
    done: impl Fn(&[TelemetryBatch]) -> bool,
) -> Vec<TelemetryBatch> {
    let mut latest = Vec::new();
    for _ in 0..50 {
        latest = c
            .get_telemetry(GetTelemetryRequest { job_id: id.into() })
            .await
            .unwrap()
            .into_inner()
            .latest;
        if done(&latest) {
            break;
        }
        tokio::time::sleep(pause).await;
    }
    latest
}

/// A coordinator on `cfg` (its listen address is ignored: a free loopback
/// port), without metrics.
pub async fn start_cfg(cfg: Config) -> Coord {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = Shutdown::new();
    let task = tokio::spawn(gpuctl_coordinator::server::run_on(
        cfg,
        listener,
        stop.clone(),
    ));
    Coord {
        url,
        metrics: None,
        stop,
        task,
    }
}

/// A real etcd server, for the `--store etcd` tests.
pub mod etcd;

/// `msg` as rank `rank`'s worker sends it: with the secret its agent was
/// handed in the assignment (`Assignment.rank_secrets`).
pub fn as_rank<T>(
    secrets: &std::collections::HashMap<u32, String>,
    rank: u32,
    msg: T,
) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut().insert(
        gpuctl_core::auth::RANK_SECRET,
        secrets[&rank].parse().expect("a secret is ASCII"),
    );
    req
}

/// The secrets of every rank in `assignments`.
pub fn secrets(assignments: &[&Assignment]) -> std::collections::HashMap<u32, String> {
    assignments
        .iter()
        .flat_map(|a| a.rank_secrets.clone())
        .collect()
}

/// A passing stress result of `rank` with result digest `digest`.
pub fn stress_result(job: &str, rank: u32, digest: &str) -> RankResult {
    RankResult {
        job_id: job.into(),
        attempt: 1,
        rank,
        ok: true,
        detail: Some(rank_result::Detail::Stress(StressResult {
            digest: digest.into(),
            device_class: "cpu".into(),
            checks: 3,
            tflops_median: 0.1,
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// A coordinator with CPU agents `node-0`… and one submitted stress job
/// across all of them, each agent handed its assignment.
pub struct RunningJob {
    pub coord: Coord,
    pub agents: Vec<FakeAgent>,
    pub jobs: JobServiceClient<Channel>,
    pub workers: WorkerServiceClient<Channel>,
    pub id: String,
    /// Every rank's secret, for [`as_rank`].
    pub secrets: std::collections::HashMap<u32, String>,
}

/// Submits a one-node stress job, reports its `ranks` results as the
/// workers `agent` was assigned, and waits until it succeeded; its id.
pub async fn stress_to_end(
    jobs: &mut JobServiceClient<Channel>,
    workers: &mut WorkerServiceClient<Channel>,
    agent: &mut FakeAgent,
    ranks: u32,
) -> String {
    let id = jobs
        .submit(spec("stress", 1))
        .await
        .unwrap()
        .into_inner()
        .id;
    let sec = secrets(&[&agent.assignment_after_cancels().await]);
    for rank in 0..ranks {
        let result = stress_result(&id, rank, "d");
        let ack = workers.report_result(as_rank(&sec, rank, result)).await;
        assert!(ack.unwrap().into_inner().ok);
    }
    wait_state(jobs, &id, JobState::Succeeded, Duration::from_secs(10)).await;
    id
}

/// A coordinator on `dir` (node timeout `node_timeout`) with `nodes` CPU
/// agents of one rank each, running one stress job on all of them.
pub async fn running_stress(
    dir: &std::path::Path,
    node_timeout: Duration,
    nodes: u32,
) -> RunningJob {
    let coord = start(dir, node_timeout).await;
    let mut agents = Vec::new();
    for n in 0..nodes {
        agents.push(FakeAgent::cpu(&coord.url, &format!("node-{n}")).await);
    }
    let mut jobs = coord.jobs().await;
    let workers = coord.workers().await;
    let id = jobs
        .submit(spec("stress", nodes))
        .await
        .unwrap()
        .into_inner()
        .id;
    let mut assignments = Vec::new();
    for a in &mut agents {
        assignments.push(a.assignment().await);
    }
    let secrets = secrets(&assignments.iter().collect::<Vec<_>>());
    RunningJob {
        coord,
        agents,
        jobs,
        workers,
        id,
        secrets,
    }
}

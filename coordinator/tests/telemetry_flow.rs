//! Telemetry end to end over real gRPC and HTTP: an agent stand-in with two
//! GPUs streams samples, a GPU that breaks a health rule (from a rules file)
//! fails its rank and node, `/metrics` counts what came in, and a job's
//! stored telemetry survives a coordinator restart.

mod common;

use std::time::Duration;

use common::{latest_telemetry, submit_request, wait_state, Coord};
use gpuctl_coordinator::config::MetricsListen;
use gpuctl_coordinator::Config;
use gpuctl_core::now_ms;
use gpuctl_proto::pb::worker_service_client::WorkerServiceClient;
use gpuctl_proto::pb::*;
use gpuctl_testkit::{gpu, host, FakeAgent};

/// A coordinator on `dir/data` with a health rules file and a metrics listener.
async fn start(dir: &std::path::Path) -> Coord {
    start_adopting(dir, None).await
}

/// The same, with `adopt_grace` for jobs found running at start.
async fn start_adopting(dir: &std::path::Path, adopt_grace: Option<Duration>) -> Coord {
    let mut cfg = Config::for_dir(dir.join("data"));
    if let Some(g) = adopt_grace {
        cfg.adopt_grace = g;
    }
    let rules = dir.join("rules.toml");
    // XID 31 is a program fault by default; this site treats it as fatal.
    std::fs::write(&rules, "critical_xids = [31, 79]\nidle = \"off\"\n").unwrap();
    cfg.health_rules = Some(rules);
    let metrics_addr = "127.0.0.1:0".parse().unwrap();
    cfg.metrics_listen = Some(MetricsListen::At(metrics_addr));
    common::start_with_metrics(cfg).await
}

/// A fake agent on a GPU host with two healthy H200s.
async fn gpu_agent(url: &str, name: &str) -> FakeAgent {
    FakeAgent::start(url, name, host::gpu(name), gpu::infos(name, 2)).await
}

/// One sample of each of `agent`'s two GPUs at `t`, for `job`: healthy, GPU 1
/// a degree warmer (the report's maximum) and reporting `xid_on_1`.
async fn samples(agent: &FakeAgent, job: &str, t: u64, xid_on_1: Vec<u32>) {
    let node = agent.name.as_str();
    let sample = |i: u32, xids: Vec<u32>| GpuSample {
        uuid: gpu::uuid_on(node, i),
        unix_ms: t,
        temperature_c: 61.0 + i as f64,
        xids,
        ..gpu::healthy(i)
    };
    let batch = gpu::batch(node, job, vec![sample(0, vec![]), sample(1, xid_on_1)]);
    agent.telemetry(batch).await;
}

fn stress() -> SubmitRequest {
    submit_request("stress", 1, 60_000)
}

fn metric(body: &str, series: &str) -> f64 {
    gpuctl_core::metrics_http::value(body, series)
        .unwrap_or_else(|| panic!("no `{series}` in\n{body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_health_metrics_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let coord = start(dir.path()).await;
    let mut jobs = coord.jobs().await;
    let agent = gpu_agent(&coord.url, "g0").await;
    let mut agent = agent;

    let id = jobs.submit(stress()).await.unwrap().into_inner().id;
    let asg = agent.assignment_after_cancels().await;
    assert_eq!(asg.ranks.len(), 2);
    let t0 = now_ms();
    for s in 0..5u64 {
        let xids = if s == 3 { vec![31] } else { vec![] };
        samples(&agent, &id, t0 + s * 1_000, xids).await;
    }
    // GetTelemetry: the latest sample of each GPU, once the batches are in.
    let latest = latest_telemetry(&mut jobs, &id, Duration::from_millis(50), |l| {
        l.first()
            .is_some_and(|b| b.samples[0].unix_ms == t0 + 4_000)
    })
    .await;
    assert_eq!(latest.len(), 1, "{latest:?}");
    assert_eq!(latest[0].samples.len(), 2);
    assert_eq!(latest[0].samples[0].unix_ms, t0 + 4_000);

    let scrape = coord.get("/metrics").await;
    assert_eq!(scrape.status, 200, "{scrape:?}");
    // prometheus-client writes OpenMetrics text.
    assert!(
        scrape
            .content_type
            .starts_with("application/openmetrics-text"),
        "{scrape:?}"
    );
    let body = scrape.body;
    assert_eq!(
        metric(&body, "gpuctl_telemetry_samples_ingested_total"),
        10.0
    );
    assert_eq!(metric(&body, "gpuctl_jobs_submitted_total"), 1.0);
    assert_eq!(metric(&body, "gpuctl_jobs{state=\"running\"}"), 1.0);
    assert_eq!(metric(&body, "gpuctl_nodes{state=\"busy\"}"), 1.0);
    assert_eq!(coord.get("/nope").await.status, 404);

    // A last batch just before the results: the scheduler's periodic write
    // (every 500 ms) will almost never have stored it before the job ends,
    // so only the job's last write can (checked after the restart below).
    samples(&agent, &id, t0 + 5_000, vec![]).await;
    latest_telemetry(&mut jobs, &id, Duration::from_millis(5), |l| {
        l.first()
            .is_some_and(|b| b.samples[0].unix_ms == t0 + 5_000)
    })
    .await;

    // No run of the node yet; the scrape's rows are kept until the history
    // changes, which the job's end below does.
    let body = coord.get("/metrics").await.body;
    assert!(!body.contains("gpuctl_node_verdict{node=\"g0\"}"), "{body}");

    // Both ranks succeed, but GPU 1 had a (site-critical) XID: rank 1, its node
    // and the job fail, and the report says why.
    let mut w = WorkerServiceClient::connect(coord.url.clone())
        .await
        .unwrap();
    for rank in 0..2 {
        let result = RankResult {
            job_id: id.clone(),
            attempt: 1,
            rank,
            ok: true,
            ..Default::default()
        };
        let ack = w
            .report_result(common::as_rank(
                &asg.rank_secrets.clone().into_iter().collect(),
                rank,
                result,
            ))
            .await
            .unwrap()
            .into_inner();
        assert!(ack.ok, "{ack:?}");
    }
    let done = wait_state(&mut jobs, &id, JobState::Failed, Duration::from_secs(10)).await;
    assert!(done.message.contains("XID 31"), "{}", done.message);
    let report = jobs
        .get_report(GetReportRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(report.telemetry.len(), 2);
    let g1 = report.telemetry.iter().find(|t| t.index == 1).unwrap();
    assert_eq!((g1.samples, g1.xids.clone()), (6, vec![31]));
    assert_eq!(g1.verdict(), Verdict::Fail);
    assert_eq!(g1.temp_max, 62.0);
    assert_eq!(report.health.len(), 1, "{:?}", report.health);
    assert_eq!(
        (report.health[0].rule.as_str(), report.health[0].gpu_index),
        ("xid", 1)
    );
    let node = &report.nodes[0];
    assert_eq!(node.verdict(), Verdict::Fail);
    assert_eq!(node.ranks[0].verdict(), Verdict::Pass);
    assert!(
        node.ranks[1].reason.contains("health `xid`"),
        "{:?}",
        node.ranks[1]
    );
    let body = coord.get("/metrics").await.body;
    assert_eq!(metric(&body, "gpuctl_results_ingested_total"), 2.0);
    assert_eq!(metric(&body, "gpuctl_jobs{state=\"failed\"}"), 1.0);
    // The node's last verdict from the fleet history: the job failed on it.
    assert_eq!(metric(&body, "gpuctl_node_verdict{node=\"g0\"}"), 2.0);

    // A second job is running when the coordinator stops: its telemetry is in
    // the store, and the restarted coordinator's report of it keeps it.
    let id2 = jobs.submit(stress()).await.unwrap().into_inner().id;
    agent.assignment_after_cancels().await;
    for s in 0..3u64 {
        samples(&agent, &id2, t0 + 10_000 + s * 1_000, vec![]).await;
    }
    latest_telemetry(&mut jobs, &id2, Duration::from_millis(50), |l| {
        l.first()
            .is_some_and(|b| b.samples[0].unix_ms == t0 + 12_000)
    })
    .await;
    drop(agent);
    coord.shutdown().await;

    // The stand-in agent never comes back to hand the job over: it fails
    // when the (short) adopt grace ends.
    let coord = start_adopting(dir.path(), Some(Duration::from_secs(1))).await;
    let mut jobs = coord.jobs().await;
    wait_state(&mut jobs, &id2, JobState::Failed, Duration::from_secs(10)).await;
    let report = jobs
        .get_report(GetReportRequest {
            job_id: id2.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(report.state(), JobState::Failed);
    assert_eq!(report.telemetry.len(), 2, "{report:?}");
    assert!(report.telemetry.iter().all(|t| t.samples == 3));
    assert!(report.health.is_empty(), "{:?}", report.health);
    // The first job's report is stored whole, and its telemetry with every
    // sample: the last ones were written after the report.
    let first = jobs
        .get_report(GetReportRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.health.len(), 1);
    let timeline = jobs
        .get_timeline(GetTimelineRequest { job_id: id })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(timeline.gpus.len(), 2, "{timeline:?}");
    for g in &timeline.gpus {
        let samples: u32 = g.points.iter().map(|p| p.samples).sum();
        assert_eq!(samples, 6, "GPU {}: {:?}", g.index, g.points);
    }
    coord.shutdown().await;
}

//! `--keep-jobs`: ended jobs past the newest N are deleted whole, from the
//! coordinator's answers at once and from the store on disk; a restart
//! deletes what a lowered `--keep-jobs` leaves over.

mod common;

use std::time::Duration;

use common::stress_to_end;
use gpuctl_coordinator::config::MetricsListen;
use gpuctl_coordinator::store::{RedbStore, Store};
use gpuctl_coordinator::Config;
use gpuctl_proto::pb::job_service_client::JobServiceClient;
use gpuctl_proto::pb::*;
use gpuctl_testkit::{host, FakeAgent};
use tonic::transport::Channel;
use tonic::Code;

fn config(dir: &std::path::Path, keep: u32) -> Config {
    let mut cfg = Config::for_dir(dir);
    cfg.keep_jobs = keep;
    cfg.metrics_listen = Some(MetricsListen::At("127.0.0.1:0".parse().unwrap()));
    cfg
}

async fn get_job(jobs: &mut JobServiceClient<Channel>, id: &str) -> Result<Job, tonic::Status> {
    jobs.get_job(GetJobRequest {
        job_id: id.into(),
        max_ranks: 0,
    })
    .await
    .map(|r| r.into_inner())
}

/// How many keys of job `id` the store on disk holds, by kind.
async fn stored_keys(dir: &std::path::Path, id: &str) -> Vec<(String, usize)> {
    let store = RedbStore::open(&dir.join(gpuctl_coordinator::server::STORE_FILE)).unwrap();
    let mut out = Vec::new();
    for prefix in ["jobs/", "plans/", "results/", "reports/"] {
        let n = store
            .scan_prefix(format!("{prefix}{id}"))
            .await
            .unwrap()
            .len();
        out.push((prefix.to_string(), n));
    }
    store.close().await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_past_keep_jobs_are_deleted_from_answers_and_disk() {
    let dir = tempfile::tempdir().unwrap();
    let coord = common::start_with_metrics(config(dir.path(), 2)).await;
    let mut agent = FakeAgent::start(&coord.url, "node-0", host::cpu("node-0", 2), vec![]).await;
    let mut jobs = coord.jobs().await;
    let mut workers = coord.workers().await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        let id = stress_to_end(&mut jobs, &mut workers, &mut agent, 2).await;
        // Its report is stored before the next job ends.
        let report = GetReportRequest { job_id: id.clone() };
        jobs.get_report(report).await.unwrap();
        ids.push(id);
    }
    // The two that ended first are gone from every answer.
    for id in &ids[..2] {
        let e = get_job(&mut jobs, id).await.unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{id}: {e:?}");
        let e = jobs
            .get_report(GetReportRequest { job_id: id.clone() })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{id}: {e:?}");
        // Said as deleted, with the setting that did it.
        assert!(
            e.message().contains("was deleted") && e.message().contains("--keep-jobs"),
            "{id}: {e:?}"
        );
    }
    // An id never given out is only unknown.
    let e = get_job(&mut jobs, "job-000099").await.unwrap_err();
    assert!(e.message().starts_with("no job"), "{e:?}");
    for id in &ids[2..] {
        get_job(&mut jobs, id).await.unwrap();
    }
    let listed: Vec<String> = jobs
        .list_jobs(ListJobsRequest { limit: 0 })
        .await
        .unwrap()
        .into_inner()
        .jobs
        .into_iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(listed, ids[2..]);
    // The store's deletions are counted once done.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let body = coord.get("/metrics").await.body;
        if gpuctl_core::metrics_http::value(&body, "gpuctl_jobs_deleted_total") == Some(2.0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no 2 jobs deleted in 10 s:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    coord.shutdown().await;

    for id in &ids[..2] {
        let keys = stored_keys(dir.path(), id).await;
        assert!(keys.iter().all(|(_, n)| *n == 0), "{id}: {keys:?}");
    }
    for id in &ids[2..] {
        let keys = stored_keys(dir.path(), id).await;
        assert!(keys.iter().all(|(_, n)| *n > 0), "{id}: {keys:?}");
    }

    // Restarted with --keep-jobs 1: the older of the two goes at load.
    let coord = common::start_with_metrics(config(dir.path(), 1)).await;
    let mut jobs = coord.jobs().await;
    let e = get_job(&mut jobs, &ids[2]).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert_eq!(get_job(&mut jobs, &ids[3]).await.unwrap().id, ids[3]);
    coord.shutdown().await;
    let keys = stored_keys(dir.path(), &ids[2]).await;
    assert!(keys.iter().all(|(_, n)| *n == 0), "{keys:?}");
    let keys = stored_keys(dir.path(), &ids[3]).await;
    assert!(keys.iter().all(|(_, n)| *n > 0), "{keys:?}");
}

/// A gauge of `/metrics` once `ok` holds for it (10 s at most).
async fn metric_when(coord: &common::Coord, name: &str, ok: impl Fn(f64) -> bool) -> f64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let body = coord.get("/metrics").await.body;
        if let Some(v) = gpuctl_core::metrics_http::value(&body, name).filter(|v| ok(*v)) {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} not as waited for in 10 s:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Bytes of job `id`'s keys in the store on disk.
async fn stored_bytes(dir: &std::path::Path, id: &str) -> u64 {
    let store = RedbStore::open(&dir.join(gpuctl_coordinator::server::STORE_FILE)).unwrap();
    let mut bytes = 0;
    for prefix in [
        "jobs/",
        "plans/",
        "results/",
        "reports/",
        "telemetry/",
        "logs/",
    ] {
        bytes += store.bytes_under(format!("{prefix}{id}")).await.unwrap();
    }
    store.close().await.unwrap();
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_past_keep_jobs_bytes_are_deleted_and_the_rest_fit() {
    let dir = tempfile::tempdir().unwrap();
    // What one job holds, as the coordinator measures it.
    let coord = common::start_with_metrics(config(dir.path(), 100)).await;
    let mut agent = FakeAgent::start(&coord.url, "node-0", host::cpu("node-0", 2), vec![]).await;
    let (mut jobs, mut workers) = (coord.jobs().await, coord.workers().await);
    let first = stress_to_end(&mut jobs, &mut workers, &mut agent, 2).await;
    let one = metric_when(&coord, "gpuctl_jobs_stored_bytes", |v| v > 0.0).await as u64;
    coord.shutdown().await;
    drop(agent);
    assert!(
        one > 1000,
        "a 2-rank job's record, results and report: {one} B"
    );

    // Room for two and a half such jobs: two are kept, the older deleted.
    let bound = one * 5 / 2;
    let mut cfg = config(dir.path(), 100);
    cfg.keep_jobs_bytes = bound;
    let coord = common::start_with_metrics(cfg).await;
    // Read back from the store at load, not measured again.
    let kept = metric_when(&coord, "gpuctl_jobs_stored_bytes", |v| v > 0.0).await;
    assert_eq!(kept as u64, one);
    let mut agent = FakeAgent::start(&coord.url, "node-0", host::cpu("node-0", 2), vec![]).await;
    let (mut jobs, mut workers) = (coord.jobs().await, coord.workers().await);
    let mut ids = vec![first];
    for _ in 0..3 {
        ids.push(stress_to_end(&mut jobs, &mut workers, &mut agent, 2).await);
    }
    metric_when(&coord, "gpuctl_jobs_deleted_total", |v| v == 2.0).await;
    let kept = metric_when(&coord, "gpuctl_jobs_stored_bytes", |v| v > one as f64).await;
    assert!(
        kept as u64 <= bound,
        "{kept} B kept past the bound of {bound}"
    );
    for id in &ids[..2] {
        let e = get_job(&mut jobs, id).await.unwrap_err();
        assert!(
            e.message().contains("was deleted") && e.message().contains("--keep-jobs-bytes"),
            "{id}: {e:?}"
        );
    }
    for id in &ids[2..] {
        get_job(&mut jobs, id).await.unwrap();
    }
    coord.shutdown().await;
    drop(agent);

    // On disk: the deleted jobs hold nothing; the kept ones fit.
    for id in &ids[..2] {
        assert_eq!(stored_bytes(dir.path(), id).await, 0, "{id}");
    }
    let mut on_disk = 0;
    for id in &ids[2..] {
        let b = stored_bytes(dir.path(), id).await;
        assert!(b > 0, "{id}");
        on_disk += b;
    }
    assert!(
        on_disk <= bound,
        "{on_disk} B on disk past the bound of {bound}"
    );
}

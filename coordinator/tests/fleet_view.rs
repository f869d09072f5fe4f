//! `gpuctl fleet`'s answer is kept built between writes (issue 51): a
//! listing taken, then a job's runs, an acceptance, a node leaving and one
//! joining, each shows in the next `gpuctl fleet` (the real CLI); and the
//! pages of one listing come from one build even when a job ends between
//! them.

mod common;

use common::{as_rank, secrets, spec, stress_result, stress_to_end, wait_state};
use gpuctl_proto::pb::job_service_client::JobServiceClient;
use gpuctl_proto::pb::worker_service_client::WorkerServiceClient;
use gpuctl_proto::pb::*;
use gpuctl_testkit::{host, FakeAgent};
use serde_json::Value;
use std::time::Duration;
use tonic::transport::Channel;

/// `gpuctl fleet -o json`, the real CLI, as (node, runs, last job, accepted)
/// per row.
async fn gpuctl_fleet(url: &str) -> Vec<(String, u64, String, bool)> {
    let url = url.to_string();
    let out =
        tokio::task::spawn_blocking(move || common::etcd::gpuctl(&url, &["fleet", "-o", "json"]))
            .await
            .unwrap();
    assert!(
        out.status.success(),
        "gpuctl fleet: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("fleet JSON");
    v["nodes"]
        .as_array()
        .expect("nodes[]")
        .iter()
        .map(|r| {
            (
                r["node"].as_str().unwrap().to_string(),
                r["runs"].as_u64().unwrap(),
                r["last_job"].as_str().unwrap().to_string(),
                !r["acceptance"].is_null(),
            )
        })
        .collect()
}

fn row(node: &str, runs: u64, job: &str, accepted: bool) -> (String, u64, String, bool) {
    (node.to_string(), runs, job.to_string(), accepted)
}

/// A stress job on every agent (one rank each), to its end and its report.
async fn stress_on_all(
    jobs: &mut JobServiceClient<Channel>,
    workers: &mut WorkerServiceClient<Channel>,
    agents: &mut [FakeAgent],
) -> String {
    let n = agents.len() as u32;
    let id = jobs
        .submit(spec("stress", n))
        .await
        .unwrap()
        .into_inner()
        .id;
    let mut assigned = Vec::new();
    for a in agents.iter_mut() {
        assigned.push(a.assignment_after_cancels().await);
    }
    let sec = secrets(&assigned.iter().collect::<Vec<_>>());
    for rank in 0..n {
        let ack = workers
            .report_result(as_rank(&sec, rank, stress_result(&id, rank, "d")))
            .await;
        assert!(ack.unwrap().into_inner().ok);
    }
    wait_state(jobs, &id, JobState::Succeeded, Duration::from_secs(10)).await;
    reported(jobs, &id).await;
    id
}

/// Waits for the job's report: its runs are stored with it.
async fn reported(jobs: &mut JobServiceClient<Channel>, id: &str) {
    let req = GetReportRequest { job_id: id.into() };
    jobs.get_report(req).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_write_shows_in_the_next_gpuctl_fleet() {
    let dir = tempfile::tempdir().unwrap();
    let coord = common::start(dir.path(), Duration::from_secs(30)).await;
    let mut agent = FakeAgent::start(&coord.url, "node-0", host::cpu("node-0", 2), vec![]).await;
    let mut jobs = coord.jobs().await;
    let mut workers = coord.workers().await;
    assert_eq!(gpuctl_fleet(&coord.url).await, [], "no runs yet");

    let first = stress_to_end(&mut jobs, &mut workers, &mut agent, 2).await;
    reported(&mut jobs, &first).await;
    let want = [row("node-0", 1, &first, false)];
    assert_eq!(gpuctl_fleet(&coord.url).await, want, "the job's runs");
    // Asked again with nothing written: the same answer.
    assert_eq!(gpuctl_fleet(&coord.url).await, want);

    let second = stress_to_end(&mut jobs, &mut workers, &mut agent, 2).await;
    reported(&mut jobs, &second).await;
    let want = [row("node-0", 2, &second, false)];
    assert_eq!(gpuctl_fleet(&coord.url).await, want, "the next job's runs");

    // Registered again with other CPU ranks: a finding, its acceptance state.
    drop(agent);
    let agent = FakeAgent::start(&coord.url, "node-0", host::cpu("node-0", 3), vec![]).await;
    let want = [row("node-0", 2, &second, true)];
    assert_eq!(gpuctl_fleet(&coord.url).await, want, "an acceptance state");

    // Out of the inventory: its runs not listed (its acceptance state
    // stays); back in: listed with them.
    drop(agent);
    let out = tokio::task::spawn_blocking({
        let url = coord.url.clone();
        move || common::etcd::gpuctl(&url, &["nodes", "remove", "node-0"])
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let removed = [row("node-0", 0, "", true)];
    assert_eq!(gpuctl_fleet(&coord.url).await, removed, "a node removed");
    let _agent = FakeAgent::start(&coord.url, "node-0", host::cpu("node-0", 3), vec![]).await;
    assert_eq!(gpuctl_fleet(&coord.url).await, want, "a node registered");
    coord.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pages_of_one_listing_agree_when_a_job_ends_between_them() {
    let dir = tempfile::tempdir().unwrap();
    let coord = common::start(dir.path(), Duration::from_secs(30)).await;
    let mut agents = Vec::new();
    for name in ["node-0", "node-1"] {
        agents.push(FakeAgent::cpu(&coord.url, name).await);
    }
    let mut jobs = coord.jobs().await;
    let mut workers = coord.workers().await;
    let first = stress_on_all(&mut jobs, &mut workers, &mut agents).await;

    // A byte a page: one row each, as a fleet past 8 MiB comes.
    let ask = |after: &str| GetFleetRequest {
        page_bytes: 1,
        after: after.into(),
        ..Default::default()
    };
    let page = |p: &GetFleetResponse| (p.rows[0].node.clone(), p.rows[0].last_job.clone());
    let p1 = jobs.get_fleet(ask("")).await.unwrap().into_inner();
    let second = stress_on_all(&mut jobs, &mut workers, &mut agents).await;
    let p2 = jobs
        .get_fleet(ask(&p1.next_after))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        [page(&p1), page(&p2)],
        [
            ("node-0".to_string(), first.clone()),
            ("node-1".to_string(), first.clone())
        ],
        "the listing as it began"
    );
    assert!(p2.next_after.is_empty(), "{p2:?}");

    // The next listing: the second job's runs.
    let want = [
        row("node-0", 2, &second, false),
        row("node-1", 2, &second, false),
    ];
    assert_eq!(gpuctl_fleet(&coord.url).await, want);
    coord.shutdown().await;
}

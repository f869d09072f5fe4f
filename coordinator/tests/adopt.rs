//! A restarted coordinator adopts the jobs that were running: over real gRPC,
//! stand-in agents register again listing the workers they kept, the job is
//! taken back (the node Busy with it again), results posted before and after
//! the restart make its report, and whatever the coordinator does not know
//! as running is refused. An agent that comes back without its workers still
//! fails the job.

mod common;

use std::time::Duration;

use common::{job, list_nodes, spec, start_cfg, wait_state};
use gpuctl_proto::pb::agent_service_client::AgentServiceClient;
use gpuctl_proto::pb::*;
use gpuctl_testkit::agent::{register, register_with};
use gpuctl_testkit::{host, FakeAgent};
use tonic::transport::Channel;

fn config(dir: &std::path::Path) -> gpuctl_coordinator::Config {
    let mut cfg = gpuctl_coordinator::Config::for_dir(dir);
    cfg.node_timeout = Duration::from_secs(5);
    cfg.adopt_grace = Duration::from_secs(30);
    cfg
}

/// Registers `name` (one CPU rank) saying it still runs `running`.
async fn register_running(
    url: &str,
    name: &str,
    running: Vec<RunningJob>,
) -> (AgentServiceClient<Channel>, RegisterResponse) {
    let req = RegisterRequest {
        running,
        ..host::register_request(name, host::cpu(name, 1))
    };
    register_with(url, req).await
}

fn running(job: &str, rank: u32) -> RunningJob {
    RunningJob {
        job_id: job.into(),
        attempt: 1,
        ranks: vec![rank],
        processes: vec![],
    }
}

fn result(job: &str, rank: u32) -> RankResult {
    common::stress_result(job, rank, "d")
}

/// Two stand-in agents with their sessions open and a 2-node stress job
/// assigned to them; returns the agents, the job id and the ranks' secrets
/// (what each worker presents).
async fn running_job(
    coord: &common::Coord,
) -> (
    FakeAgent,
    FakeAgent,
    String,
    std::collections::HashMap<u32, String>,
) {
    let mut agents = Vec::new();
    for name in ["node-0", "node-1"] {
        let (client, _) = register(&coord.url, name, host::cpu(name, 1), vec![]).await;
        agents.push(FakeAgent::session(client, name).await);
    }
    let mut jobs = coord.jobs().await;
    // Sessions open asynchronously: wait until both nodes can take the job.
    let mut id = String::new();
    for _ in 0..50 {
        if let Ok(j) = jobs.submit(spec("stress", 2)).await {
            id = j.into_inner().id;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!id.is_empty(), "the job was never accepted");
    let mut a1 = agents.pop().unwrap();
    let mut a0 = agents.pop().unwrap();
    let (s0, s1) = (a0.assignment().await, a1.assignment().await);
    assert_eq!(
        (s0.job_id.as_str(), s1.job_id.as_str()),
        (id.as_str(), id.as_str())
    );
    let secrets = common::secrets(&[&s0, &s1]);
    (a0, a1, id, secrets)
}

fn node_state(nodes: &[Node], name: &str) -> (NodeState, String) {
    let n = nodes.iter().find(|n| n.name == name).unwrap();
    (n.state(), n.current_job.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_coordinator_adopts_running_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let coord = start_cfg(config(dir.path())).await;
    let (a0, a1, id, secrets) = running_job(&coord).await;
    let mut w = coord.workers().await;
    assert!(
        w.report_result(common::as_rank(&secrets, 0, result(&id, 0)))
            .await
            .unwrap()
            .into_inner()
            .ok
    );
    drop((a0, a1, w));
    coord.shutdown().await;

    let coord = start_cfg(config(dir.path())).await;
    let mut jobs = coord.jobs().await;
    let j = job(&mut jobs, &id).await;
    assert_eq!(j.state(), JobState::Running, "awaiting adoption: {j:?}");
    assert_eq!(j.results_in, 1, "the stored result is back");

    // node-0 comes back with the job's worker and one the coordinator never ran.
    let (c0, resp) = register_running(
        &coord.url,
        "node-0",
        vec![running(&id, 0), running("job-999999", 0)],
    )
    .await;
    assert_eq!(resp.adopted, vec![id.clone()]);
    assert_eq!(resp.refused, vec!["job-999999".to_string()]);
    let nodes = list_nodes(&mut jobs).await;
    assert_eq!(node_state(&nodes, "node-0"), (NodeState::Busy, id.clone()));
    assert_eq!(node_state(&nodes, "node-1").0, NodeState::Lost);
    let _a0 = FakeAgent::session(c0, "node-0").await;

    let (c1, resp) = register_running(&coord.url, "node-1", vec![running(&id, 1)]).await;
    assert_eq!(resp.adopted, vec![id.clone()]);
    assert!(resp.refused.is_empty());
    let _a1 = FakeAgent::session(c1, "node-1").await;
    // A result posted after the restart finishes the job, both ranks in.
    let mut w = coord.workers().await;
    assert!(
        w.report_result(common::as_rank(&secrets, 1, result(&id, 1)))
            .await
            .unwrap()
            .into_inner()
            .ok
    );
    let j = wait_state(&mut jobs, &id, JobState::Succeeded, Duration::from_secs(5)).await;
    assert_eq!(j.results_in, 2);
    let report = jobs
        .get_report(GetReportRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(report.verdict(), Verdict::Pass, "{report:?}");
    let ranks: Vec<bool> = report
        .nodes
        .iter()
        .flat_map(|n| &n.ranks)
        .map(|r| r.result.is_some())
        .collect();
    assert_eq!(ranks, vec![true, true]);
    let nodes = list_nodes(&mut jobs).await;
    assert_eq!(
        node_state(&nodes, "node-0"),
        (NodeState::Ready, String::new())
    );

    // Once the job has ended, an agent still listing it is told to stop it.
    let (_, resp) = register_running(&coord.url, "node-1", vec![running(&id, 1)]).await;
    assert!(resp.adopted.is_empty());
    assert_eq!(resp.refused, vec![id.clone()]);
    coord.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_back_without_its_workers_fails_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let coord = start_cfg(config(dir.path())).await;
    let (a0, a1, id, _) = running_job(&coord).await;
    drop((a0, a1));
    coord.shutdown().await;

    let coord = start_cfg(config(dir.path())).await;
    let mut jobs = coord.jobs().await;
    // node-1's agent restarted: it runs nothing, and its rank has no result.
    let (_, resp) = register_running(&coord.url, "node-1", vec![]).await;
    assert!(resp.adopted.is_empty() && resp.refused.is_empty());
    let j = wait_state(&mut jobs, &id, JobState::Failed, Duration::from_secs(5)).await;
    assert!(
        j.message
            .starts_with("node node-1 registered again without the job's workers"),
        "{}",
        j.message
    );
    // node-0, still lost, is no longer tied to the failed job.
    let nodes = list_nodes(&mut jobs).await;
    assert_eq!(
        node_state(&nodes, "node-0"),
        (NodeState::Lost, String::new())
    );
    assert_eq!(
        node_state(&nodes, "node-1"),
        (NodeState::Ready, String::new())
    );
    coord.shutdown().await;
}

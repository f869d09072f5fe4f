//! The coordinator served on loopback and driven over real gRPC, the way agents,
//! workers and the CLI talk to it: registration and sessions, planning, job life,
//! rendezvous, results and reports, lost nodes, cancel and restart.

mod common;

use std::time::Duration;

use common::{
    as_rank, job, list_nodes, secrets, spec, start, start_cfg, stress_result, stress_to_end,
    wait_state,
};
use gpuctl_core::now_ms;
use gpuctl_proto::pb::agent_message::Msg as Up;
use gpuctl_proto::pb::agent_service_client::AgentServiceClient;
use gpuctl_proto::pb::*;
use gpuctl_proto::PROTOCOL_VERSION;
use gpuctl_testkit::agent::{heartbeat, register};
use gpuctl_testkit::{gpu, host, FakeAgent};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

/// A stand-in agent running `cpu_ranks` CPU ranks, no GPUs; the coordinator
/// answers with its name and the URL workers reach it at.
async fn agent(url: &str, name: &str, cpu_ranks: u32) -> FakeAgent {
    let (client, resp) = register(url, name, host::cpu(name, cpu_ranks), vec![]).await;
    assert_eq!(resp.name, name);
    assert_eq!(resp.coordinator_url, url, "workers reach the listen URL");
    FakeAgent::session(client, name).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_life_from_submit_to_report() {
    let dir = tempfile::tempdir().unwrap();
    let coord = start(dir.path(), Duration::from_secs(5)).await;
    let mut a1 = agent(&coord.url, "node-1", 2).await;
    let mut a0 = agent(&coord.url, "node-0", 2).await;
    let mut jobs = coord.jobs().await;

    let nodes = list_nodes(&mut jobs).await;
    assert_eq!(nodes.len(), 2);
    assert!(
        nodes
            .iter()
            .all(|n| n.state() == NodeState::Ready && n.slots == 2),
        "{nodes:?}"
    );

    // Bad input and too few nodes: refused, nothing stored.
    let err = jobs.submit(spec("stress", 3)).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(
        err.message(),
        "asked for 3 nodes, 2 registered nodes match (node-0, node-1)"
    );
    let err = jobs.submit(spec("burn", 1)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("burn"), "{}", err.message());
    let listed = jobs
        .list_jobs(ListJobsRequest { limit: 0 })
        .await
        .unwrap()
        .into_inner()
        .jobs;
    assert!(listed.is_empty(), "{listed:?}");

    // Plan: a dry run with the rank table and the environment.
    let plan_of = |max_ranks| PlanRequest {
        spec: spec("stress", 2).spec,
        max_ranks,
    };
    let plan = jobs.plan_job(plan_of(0)).await.unwrap().into_inner();
    assert_eq!(plan.nodes, vec!["node-0", "node-1"]);
    assert_eq!(plan.world_size, 4);
    assert_eq!(plan.ranks.len(), 4);
    assert_eq!(
        (
            plan.ranks_left_out,
            plan.passes_left_out,
            plan.faults_left_out
        ),
        (0, 0, 0)
    );
    // Bounded, as `gpuctl plan` asks for a person: the first rank, and the
    // rest counted, of the same whole plan.
    let view = jobs.plan_job(plan_of(1)).await.unwrap().into_inner();
    assert_eq!(view.world_size, 4);
    assert_eq!(view.ranks, plan.ranks[..1]);
    assert_eq!(view.ranks_left_out, 3);
    assert_eq!(view.env, plan.env);
    assert!(view.checks.iter().all(|c| c.verdict() != Verdict::Pass));
    assert_eq!(
        view.checks.len() as u32 + view.passes_left_out + view.faults_left_out,
        plan.checks.len() as u32
    );
    assert!(plan.env.iter().any(|e| e.name == "NCCL_IB_DISABLE"));
    assert!(plan
        .env
        .iter()
        .any(|e| e.name == "OMP_NUM_THREADS" && e.value == "2"));
    assert!(jobs
        .list_jobs(ListJobsRequest { limit: 0 })
        .await
        .unwrap()
        .into_inner()
        .jobs
        .is_empty());

    let submitted = jobs.submit(spec("stress", 2)).await.unwrap().into_inner();
    assert_eq!(submitted.id, "job-000001");
    let id = submitted.id.clone();
    wait_state(&mut jobs, &id, JobState::Running, Duration::from_secs(2)).await;

    let asg0 = a0.assignment().await;
    let asg1 = a1.assignment().await;
    let sec = secrets(&[&asg0, &asg1]);
    assert_eq!((asg0.node_rank, asg1.node_rank), (0, 1));
    let ranks0: Vec<u32> = asg0.ranks.iter().map(|r| r.rank).collect();
    let ranks1: Vec<u32> = asg1.ranks.iter().map(|r| r.rank).collect();
    assert_eq!((ranks0, ranks1), (vec![0, 1], vec![2, 3]));
    assert_eq!(asg0.world_size, 4);
    assert_eq!(asg0.master_addr, "127.0.0.1");
    assert_eq!(asg0.master_port, 29500);
    assert_eq!(asg0.coordinator_url, coord.url);
    let budget = asg0.deadline_unix_ms - now_ms();
    assert!(
        (100_000..=122_000).contains(&budget),
        "1 s stress + 120 s grace, got {budget} ms"
    );
    a0.send(Up::Ack(AssignmentAck {
        job_id: id.clone(),
        attempt: 1,
        ok: true,
        error: String::new(),
        // The agent's preflight when the assignment arrived: a stranger
        // took GPU memory after the node registered.
        checks: vec![PreflightCheck {
            node: "node-0".into(),
            name: "gpu_processes".into(),
            verdict: Verdict::Warn as i32,
            detail: "other processes hold GPU memory: GPU 0: pid 4242 (python3) 20480 MiB".into(),
            fix: "stop them".into(),
        }],
    }))
    .await;

    // Rendezvous: a get waits for the put.
    let mut w = coord.workers().await;
    let mut w2 = coord.workers().await;
    let gid = id.clone();
    let get = as_rank(
        &sec,
        1,
        RendezvousGetRequest {
            job_id: gid,
            attempt: 1,
            key: "nccl/id".into(),
            timeout_ms: 5_000,
        },
    );
    let getter = tokio::spawn(async move { w2.rendezvous_get(get).await.unwrap().into_inner() });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let put = w
        .rendezvous_put(as_rank(
            &sec,
            0,
            RendezvousPutRequest {
                job_id: id.clone(),
                attempt: 1,
                key: "nccl/id".into(),
                value: vec![7; 128],
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(put.ok);
    let got = getter.await.unwrap();
    assert!(got.found && !got.job_over && got.value == vec![7; 128]);

    // Progress shows on the job.
    let ack = w
        .report_progress(as_rank(&sec, 2, progress(&id, 2, "gemm", 0.5)))
        .await
        .unwrap()
        .into_inner();
    assert!(ack.ok, "{ack:?}");
    let j = job(&mut jobs, &id).await;
    assert_eq!(j.progress.len(), 1);
    assert_eq!(j.progress[0].node, "node-1");

    // A GPU's telemetry from a CPU node is refused: the report below,
    // made many calls later, has none (it had this sample before the
    // coordinator held a node's telemetry to its registered GPUs).
    a1.telemetry(gpu::batch("node-1", &id, vec![gpu::healthy(0)]))
        .await;

    // Logs arrive through the session and are stored per rank.
    a1.send(Up::Log(WorkerLog {
        job_id: id.clone(),
        attempt: 1,
        rank: 3,
        lines: vec!["hello".into(), "world".into()],
    }))
    .await;

    // (A GPU node's latest telemetry batch is telemetry_flow.rs's.)

    // Results: a partial report first, then the final one.
    for rank in 0..3 {
        let ack = w
            .report_result(as_rank(&sec, rank, stress_result(&id, rank, "abc")))
            .await
            .unwrap()
            .into_inner();
        assert!(ack.ok, "{ack:?}");
    }
    let partial = jobs
        .get_report(GetReportRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(partial.verdict(), Verdict::Incomplete);
    assert_eq!(partial.nodes.len(), 2);
    assert_eq!(job(&mut jobs, &id).await.results_in, 3);
    let ack = w
        .report_result(as_rank(&sec, 3, stress_result(&id, 3, "abc")))
        .await
        .unwrap()
        .into_inner();
    assert!(ack.ok);
    // The verdict is made off the scheduler's task, just after the ack.
    wait_state(&mut jobs, &id, JobState::Succeeded, Duration::from_secs(10)).await;
    let done = job(&mut jobs, &id).await;
    assert_eq!(done.state(), JobState::Succeeded, "{done:?}");
    let report = jobs
        .get_report(GetReportRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    // Sent encoded, the same report.
    let packed = jobs
        .get_report_packed(GetReportRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner()
        .unpack()
        .unwrap();
    assert_eq!(packed, report);
    let missing = jobs
        .get_report_packed(GetReportRequest {
            job_id: "no-such-job".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound, "{missing:?}");
    // Every rank passed; the check taken at job start warns node-0, and only it.
    assert_eq!(report.verdict(), Verdict::Warn, "{report:?}");
    assert!(
        report.reason.contains("warnings on node-0"),
        "{}",
        report.reason
    );
    assert_eq!(report.nodes[0].verdict(), Verdict::Warn);
    assert_eq!(report.nodes[1].verdict(), Verdict::Pass);
    let held: Vec<&PreflightCheck> = report
        .preflight
        .iter()
        .filter(|c| c.node == "node-0" && c.name == "gpu_processes")
        .collect();
    assert_eq!(
        held.len(),
        1,
        "the start check replaces registration's: {report:?}"
    );
    assert!(held[0].detail.contains("pid 4242"));
    let f = &report.nodes[0].findings;
    assert!(
        f.iter()
            .any(|f| f.metric == "preflight" && f.detail.contains("pid 4242")),
        "{f:?}"
    );
    assert_eq!(report.world_size, 4);
    assert_eq!(
        report.nodes[1].ranks[0].result.as_ref().unwrap().node,
        "node-1"
    );
    assert!(
        report.sdc_note.contains("4 ranks agree"),
        "{}",
        report.sdc_note
    );
    // node-1's GPU 0 is no GPU of node-1's.
    assert!(report.telemetry.is_empty(), "{:?}", report.telemetry);

    // The job is over: workers are told so.
    let ack = w
        .report_progress(as_rank(&sec, 0, progress(&id, 0, "", 0.0)))
        .await
        .unwrap()
        .into_inner();
    assert!(!ack.ok);
    let over = w
        .rendezvous_get(as_rank(
            &sec,
            0,
            RendezvousGetRequest {
                job_id: id.clone(),
                attempt: 1,
                key: "x".into(),
                timeout_ms: 5_000,
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(over.job_over);

    let mut lines = Vec::new();
    for _ in 0..50 {
        lines = jobs
            .get_logs(GetLogsRequest {
                job_id: id.clone(),
                has_rank: true,
                rank: 3,
                tail: 1,
            })
            .await
            .unwrap()
            .into_inner()
            .lines;
        if !lines.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(lines.len(), 1);
    assert_eq!(
        (
            lines[0].line.as_str(),
            lines[0].node.as_str(),
            lines[0].rank
        ),
        ("world", "node-1", 3)
    );
    logs_settle_once_every_worker_end_is_heard(&mut jobs, &id, [&a0, &a1]).await;

    // A worker that dies without a result fails the next job, named.
    let id2 = jobs.submit(spec("nccl", 2)).await.unwrap().into_inner().id;
    assert_eq!(id2, "job-000002");
    a0.assignment().await;
    a1.assignment().await;
    a0.send(Up::WorkerExited(WorkerExited {
        job_id: id2.clone(),
        attempt: 1,
        rank: 1,
        exit_code: 1,
        stderr_tail: "starting\nboom: bad things\n".into(),
        ..Default::default()
    }))
    .await;
    let failed = wait_state(&mut jobs, &id2, JobState::Failed, Duration::from_secs(5)).await;
    assert_eq!(
        failed.message,
        "rank 1 on node node-0 (cpu) exited with code 1: boom: bad things"
    );
    // The other node is told to stop; the node whose worker failed too.
    assert_eq!(a1.cancel().await.job_id, id2);
    assert_eq!(a0.cancel().await.job_id, id2);

    // Busy nodes: the second job waits, then starts when the first is cancelled.
    let first = jobs.submit(spec("stress", 2)).await.unwrap().into_inner();
    let second = jobs.submit(spec("stress", 1)).await.unwrap().into_inner();
    assert_eq!(second.state(), JobState::Pending);
    a0.assignment().await;
    a1.assignment().await;
    let cancelled = jobs
        .cancel_job(CancelJobRequest {
            job_id: first.id.clone(),
            reason: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cancelled.state(), JobState::Cancelled);
    assert_eq!(cancelled.message, "cancelled by user");
    assert_eq!(a0.cancel().await.job_id, first.id);
    assert_eq!(
        a0.assignment().await.job_id,
        second.id,
        "node-0 comes first by name"
    );
    let r = jobs
        .get_report(GetReportRequest {
            job_id: first.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.state(), JobState::Cancelled);
    assert_ne!(r.verdict(), Verdict::Pass);

    let err = jobs
        .get_job(GetJobRequest {
            job_id: "job-999".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    drop(a1);
    coord.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_node_fails_its_job_and_unadopted_jobs_fail_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let coord = start(dir.path(), Duration::from_secs(1)).await;
    let mut a0 = agent(&coord.url, "node-0", 1).await;
    let mut a1 = agent(&coord.url, "node-1", 1).await;
    let mut a2 = agent(&coord.url, "node-2", 1).await;
    let mut jobs = coord.jobs().await;

    let id = jobs
        .submit(spec("stress", 3))
        .await
        .unwrap()
        .into_inner()
        .id;
    a0.assignment().await;
    a1.assignment().await;
    a2.assignment().await;
    a2.stop_heartbeats();
    let failed = wait_state(&mut jobs, &id, JobState::Failed, Duration::from_secs(4)).await;
    assert_eq!(failed.message, "node node-2 lost: no heartbeat for 1s");
    assert_eq!(a0.cancel().await.reason, failed.message);
    assert_eq!(a1.cancel().await.job_id, id);
    let nodes = list_nodes(&mut jobs).await;
    let states: Vec<(&str, NodeState)> =
        nodes.iter().map(|n| (n.name.as_str(), n.state())).collect();
    assert_eq!(
        states,
        vec![
            ("node-0", NodeState::Ready),
            ("node-1", NodeState::Ready),
            ("node-2", NodeState::Lost)
        ]
    );

    // Protocol mismatch: refused naming both versions.
    let mut client = AgentServiceClient::connect(coord.url.clone())
        .await
        .unwrap();
    let err = client
        .register(RegisterRequest {
            protocol_version: PROTOCOL_VERSION + 1,
            name: "old".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message()
            .contains(&format!("protocol {}", PROTOCOL_VERSION + 1)),
        "{}",
        err.message()
    );
    assert!(
        err.message()
            .contains(&format!("protocol {PROTOCOL_VERSION}")),
        "{}",
        err.message()
    );

    // A session for a node that never registered is refused on the stream.
    let (up, rx) = mpsc::channel(4);
    up.send(heartbeat("ghost")).await.unwrap();
    let mut down = client
        .session(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let err = down.message().await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("`ghost` is not registered"),
        "{}",
        err.message()
    );

    // A running job, a result in, then the coordinator goes away.
    let running = jobs
        .submit(spec("stress", 2))
        .await
        .unwrap()
        .into_inner()
        .id;
    let sec = secrets(&[&a0.assignment().await]);
    a1.assignment().await;
    let mut w = coord.workers().await;
    assert!(
        w.report_result(as_rank(&sec, 0, stress_result(&running, 0, "d")))
            .await
            .unwrap()
            .into_inner()
            .ok
    );
    drop((a0, a1, a2, jobs, w, client));
    coord.shutdown().await;

    // The job waits for its agents to hand their workers back; these
    // stand-ins never come back, so it fails when the adopt grace ends.
    let mut cfg = gpuctl_coordinator::Config::for_dir(dir.path());
    cfg.node_timeout = Duration::from_secs(1);
    cfg.adopt_grace = Duration::from_secs(1);
    let coord = start_cfg(cfg).await;
    let mut jobs = coord.jobs().await;
    let j = wait_state(
        &mut jobs,
        &running,
        JobState::Failed,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(
        j.message,
        "nodes node-0, node-1 did not come back within 1s of the coordinator restart"
    );
    let report = jobs
        .get_report(GetReportRequest {
            job_id: running.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        report.nodes[0].ranks[0].result.is_some(),
        "the stored result survived: {report:?}"
    );
    assert_eq!(report.verdict(), Verdict::Fail);
    let nodes = list_nodes(&mut jobs).await;
    assert!(
        nodes.iter().all(|n| n.state() == NodeState::Lost),
        "{nodes:?}"
    );
    let err = jobs.submit(spec("stress", 1)).await.unwrap_err();
    assert!(err.message().contains("lost"), "{}", err.message());

    // Agents register again by themselves; job numbers continue.
    let mut a0 = agent(&coord.url, "node-0", 1).await;
    let next = jobs.submit(spec("stress", 1)).await.unwrap().into_inner();
    assert_eq!(next.id, "job-000003");
    // It may wait a moment for the session to open.
    assert_eq!(a0.assignment().await.job_id, next.id);
    wait_state(
        &mut jobs,
        &next.id,
        JobState::Running,
        Duration::from_secs(2),
    )
    .await;
    coord.shutdown().await;
}

/// A progress report of one rank of attempt 1.
/// Ended jobs past the newest few keep nothing per rank in the
/// coordinator's memory (`JobEntry::let_go`); `GetJob` and `GetReport`
/// answer them as before, from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_jobs_are_answered_alike_from_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let coord = start(dir.path(), Duration::from_secs(5)).await;
    let mut a = agent(&coord.url, "node-0", 2).await;
    let mut jobs = coord.jobs().await;
    let mut w = coord.workers().await;
    let mut first = None;
    for i in 0..=gpuctl_coordinator::scheduler::state::KEEP_ENDED {
        let id = stress_to_end(&mut jobs, &mut w, &mut a, 2).await;
        if i == 0 {
            let report = report_of(&mut jobs, &id).await;
            first = Some((id.clone(), job(&mut jobs, &id).await, report));
        }
    }
    let (id, then, report) = first.unwrap();
    let now = job(&mut jobs, &id).await;
    assert_eq!(now.plan.as_ref().unwrap().ranks.len(), 2, "{now:?}");
    assert_eq!(now, then);
    assert_eq!(report_of(&mut jobs, &id).await, report);
    coord.shutdown().await;
}

/// An ended job whose workers' ends were not heard may have lines still to
/// come (an agent sends a worker's last lines before its end, after the
/// worker sent its result itself): its logs are not settled. Each end after
/// its last lines: the first settled answer has every line.
async fn logs_settle_once_every_worker_end_is_heard(
    jobs: &mut job_service_client::JobServiceClient<tonic::transport::Channel>,
    id: &str,
    agents: [&FakeAgent; 2],
) {
    let all = GetLogsRequest {
        job_id: id.into(),
        ..Default::default()
    };
    let ranks = job(jobs, id).await.plan.unwrap().ranks;
    let first = jobs.get_logs(all.clone()).await.unwrap().into_inner();
    assert!(!first.settled, "no worker's end heard yet: {first:?}");
    for p in &ranks {
        let agent = agents[usize::from(p.node == "node-1")];
        let lines = vec![format!("rank {} done", p.rank)];
        agent
            .send(Up::Log(WorkerLog {
                job_id: id.into(),
                attempt: 1,
                rank: p.rank,
                lines,
            }))
            .await;
        agent
            .send(Up::WorkerExited(WorkerExited {
                job_id: id.into(),
                attempt: 1,
                rank: p.rank,
                ..Default::default()
            }))
            .await;
    }
    let mut settled = first;
    for _ in 0..100 {
        settled = jobs.get_logs(all.clone()).await.unwrap().into_inner();
        if settled.settled {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(settled.settled, "every worker's end sent: {settled:?}");
    for p in &ranks {
        let last = format!("rank {} done", p.rank);
        assert!(
            settled
                .lines
                .iter()
                .any(|l| l.rank == p.rank && l.line == last),
            "{last} in the first settled answer: {:?}",
            settled.lines
        );
    }
}

async fn report_of(
    c: &mut job_service_client::JobServiceClient<tonic::transport::Channel>,
    id: &str,
) -> Report {
    c.get_report(GetReportRequest { job_id: id.into() })
        .await
        .unwrap()
        .into_inner()
}

fn progress(id: &str, rank: u32, phase: &str, fraction: f64) -> RankProgressReport {
    RankProgressReport {
        job_id: id.to_string(),
        attempt: 1,
        progress: Some(RankProgress {
            rank,
            phase: phase.into(),
            fraction,
            ..Default::default()
        }),
    }
}

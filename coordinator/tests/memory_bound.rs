//! What the coordinator holds in memory for its jobs does not grow job after
//! job, failed jobs with late results included (issue 51: at 16,384 nodes a
//! coordinator grew by gigabytes over two failed jobs). Counted through a
//! real coordinator's `/metrics` (`gpuctl_jobs_held_ranks`: per-rank
//! entries over every job), not timed.

mod common;

use std::time::Duration;

use common::{as_rank, secrets, spec, stress_result, wait_state};
use gpuctl_coordinator::config::MetricsListen;
use gpuctl_coordinator::Config;
use gpuctl_proto::pb::agent_message::Msg as Up;
use gpuctl_proto::pb::*;
use gpuctl_testkit::{host, FakeAgent};

/// Ended jobs the scheduler keeps whole (`scheduler::state::KEEP_ENDED`).
const KEEP_ENDED: usize = 8;

async fn gauge(coord: &common::Coord, name: &str) -> f64 {
    let body = coord.get("/metrics").await.body;
    gpuctl_core::metrics_http::value(&body, name).unwrap_or_else(|| panic!("no {name}:\n{body}"))
}

fn has_result(report: &Report, rank: u32) -> bool {
    (report.nodes.iter().flat_map(|n| &n.ranks)).any(|r| r.rank == rank && r.result.is_some())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_rank_state_stays_flat_over_failed_jobs_with_late_results() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::for_dir(dir.path());
    cfg.metrics_listen = Some(MetricsListen::At("127.0.0.1:0".parse().unwrap()));
    let coord = common::start_with_metrics(cfg).await;
    let mut agent = FakeAgent::start(&coord.url, "node-0", host::cpu("node-0", 2), vec![]).await;
    let (mut jobs, mut workers) = (coord.jobs().await, coord.workers().await);
    let mut held = Vec::new();
    for _ in 0..KEEP_ENDED + 3 {
        let id = jobs
            .submit(spec("stress", 1))
            .await
            .unwrap()
            .into_inner()
            .id;
        let a = agent.assignment_after_cancels().await;
        let sec = secrets(&[&a]);
        let ack = workers
            .report_result(as_rank(&sec, 0, stress_result(&id, 0, "d")))
            .await
            .unwrap()
            .into_inner();
        assert!(ack.ok, "{ack:?}");
        // Rank 1's worker dies: the job fails with one result of two…
        agent
            .send(Up::WorkerExited(WorkerExited {
                job_id: id.clone(),
                attempt: a.attempt,
                rank: 1,
                exit_code: 1,
                ..Default::default()
            }))
            .await;
        wait_state(&mut jobs, &id, JobState::Failed, Duration::from_secs(5)).await;
        // …and its result comes after all, late: stored, folded in.
        let ack = workers
            .report_result(as_rank(&sec, 1, stress_result(&id, 1, "d")))
            .await
            .unwrap()
            .into_inner();
        // "is ending" while its report is being made, "had already ended" after.
        assert!(
            ack.ok && ack.message.starts_with(&format!("stored; job {id} ")),
            "{ack:?}"
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let report = jobs
                .get_report(GetReportRequest { job_id: id.clone() })
                .await;
            if report.is_ok_and(|r| has_result(&r.into_inner(), 1)) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{id}: the late result never folded in"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        held.push(gauge(&coord, "gpuctl_jobs_held_ranks").await);
    }
    // Growing while jobs are kept whole, then flat: each job past the newest
    // few is let go of once it ended, however it ended.
    assert!(held[0] > 0.0, "{held:?}");
    let full = held[KEEP_ENDED];
    assert!(full >= held[KEEP_ENDED - 1], "{held:?}");
    assert!(held[KEEP_ENDED..].iter().all(|h| *h == full), "{held:?}");
    coord.shutdown().await;
}

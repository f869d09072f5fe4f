//! Results that arrive after their job ended, over real gRPC: each is stored
//! and acknowledged at once, a result sent again is answered without a
//! second write, and the report takes them in together once they stop
//! coming (at 32,768 ranks one rebuild per late result held the scheduler
//! for seconds each, and made a fleet's calls time out).

mod common;

use std::time::{Duration, Instant};

use common::{as_rank, running_stress, stress_result, wait_state, RunningJob};
use gpuctl_proto::pb::*;

/// Whether `rank`'s result is in the report.
fn has_result(report: &Report, rank: u32) -> bool {
    report
        .nodes
        .iter()
        .flat_map(|n| &n.ranks)
        .any(|r| r.rank == rank && r.result.is_some())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_results_are_stored_once_and_folded_in_together() {
    let dir = tempfile::tempdir().unwrap();
    let RunningJob {
        coord,
        mut agents,
        mut jobs,
        workers: mut w,
        id,
        secrets: sec,
    } = running_stress(dir.path(), Duration::from_secs(1), 4).await;
    let ack = w
        .report_result(as_rank(&sec, 0, stress_result(&id, 0, "d")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((ack.ok, ack.message.as_str()), (true, "stored"));
    // node-3 goes silent: the job fails with one result of four.
    agents[3].stop_heartbeats();
    let failed = wait_state(&mut jobs, &id, JobState::Failed, Duration::from_secs(5)).await;
    assert_eq!(failed.message, "node node-3 lost: no heartbeat for 1s");
    let report = jobs
        .get_report(GetReportRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert!(has_result(&report, 0) && !has_result(&report, 1));

    // Two late results, each sent again and again (calls that timed out).
    for rank in [1, 2] {
        let ack = w
            .report_result(as_rank(&sec, rank, stress_result(&id, rank, "d")))
            .await
            .unwrap()
            .into_inner();
        assert!(ack.ok, "{ack:?}");
        assert_eq!(ack.message, format!("stored; job {id} had already ended"));
    }
    for _ in 0..20 {
        for rank in [0, 1, 2] {
            let ack = w
                .report_result(as_rank(&sec, rank, stress_result(&id, rank, "d")))
                .await
                .unwrap()
                .into_inner();
            assert_eq!((ack.ok, ack.message.as_str()), (true, "stored already"));
        }
    }

    // Folded in once they stop coming: 2 s of quiet, then the next tick.
    let began = Instant::now();
    let report = loop {
        let report = jobs
            .get_report(GetReportRequest { job_id: id.clone() })
            .await
            .unwrap()
            .into_inner();
        if has_result(&report, 1) && has_result(&report, 2) {
            break report;
        }
        assert!(
            began.elapsed() < Duration::from_secs(15),
            "the late results never reached the report: {report:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(has_result(&report, 0) && !has_result(&report, 3));
    assert_eq!(report.state(), JobState::Failed);
    let ranks: Vec<u32> = report
        .nodes
        .iter()
        .flat_map(|n| &n.ranks)
        .map(|r| r.rank)
        .collect();
    assert_eq!(ranks.len(), 4, "each rank once: {ranks:?}");
    coord.shutdown().await;
}

/// Issue 35: with a rank's secret, results posted after `gpuctl cancel` were
/// stored and the cancelled job's ranks showed pass. They are refused, and
/// the report keeps none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_after_a_cancel_are_refused_and_not_kept() {
    let dir = tempfile::tempdir().unwrap();
    let RunningJob {
        coord,
        mut jobs,
        workers: mut w,
        id,
        secrets: sec,
        ..
    } = running_stress(dir.path(), Duration::from_secs(15), 2).await;
    jobs.cancel_job(CancelJobRequest {
        job_id: id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    wait_state(&mut jobs, &id, JobState::Cancelled, Duration::from_secs(5)).await;
    // Posted again, it is refused again: nothing was stored the first time
    // (it once answered "stored already").
    for _ in 0..2 {
        let ack = w
            .report_result(as_rank(&sec, 0, stress_result(&id, 0, "d")))
            .await
            .unwrap()
            .into_inner();
        assert!(!ack.ok, "{ack:?}");
        assert!(ack.message.contains("was cancelled"), "{}", ack.message);
    }
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let report = jobs
        .get_report(GetReportRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert!(!has_result(&report, 0), "a refused result is not kept");
    assert_eq!(report.state(), JobState::Cancelled);
    // The fleet view still answers, through the real CLI.
    common::fleet_view_answers(&coord.url, 2);
    coord.shutdown().await;
}

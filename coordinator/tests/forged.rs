//! A result no device can make, sent with a rank's real secret over real
//! gRPC: 999 TFLOP/s from a CPU rank once passed (issue 35). The rank fails
//! as corrupt, named, and its peers keep their verdicts.

mod common;

use std::time::Duration;

use common::{as_rank, running_stress, stress_result, wait_state, RunningJob};
use gpuctl_proto::pb::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impossible_figure_fails_its_rank_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let RunningJob {
        coord,
        mut jobs,
        workers: mut w,
        id,
        secrets: sec,
        ..
    } = running_stress(dir.path(), Duration::from_secs(15), 2).await;
    let mut forged = stress_result(&id, 1, "d");
    if let Some(rank_result::Detail::Stress(s)) = &mut forged.detail {
        s.tflops_median = 999.0;
        s.tflops_max = 999.0;
        s.tflops_per_interval = vec![999.0; 5];
    }
    for (rank, r) in [(0, stress_result(&id, 0, "d")), (1, forged)] {
        let ack = w
            .report_result(as_rank(&sec, rank, r))
            .await
            .unwrap()
            .into_inner();
        assert!(ack.ok, "{ack:?}");
    }
    wait_state(&mut jobs, &id, JobState::Failed, Duration::from_secs(10)).await;
    let report = jobs
        .get_report(GetReportRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    let ranks: Vec<&RankReport> = report.nodes.iter().flat_map(|n| &n.ranks).collect();
    let one = ranks.iter().find(|r| r.rank == 1).unwrap();
    assert_eq!(one.verdict(), Verdict::Fail);
    assert!(
        one.reason.contains("impossible figure: 999 TFLOP/s"),
        "{}",
        one.reason
    );
    let zero = ranks.iter().find(|r| r.rank == 0).unwrap();
    assert_ne!(zero.verdict(), Verdict::Fail, "{}", zero.reason);
    // The fleet view still answers, through the real CLI.
    common::fleet_view_answers(&coord.url, 2);
    coord.shutdown().await;
}

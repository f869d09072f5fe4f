//! A job's fleet history is committed after its report, in a transaction
//! of its own. A crash between the two commits leaves the report and a mark
//! (`history-due/{job}`); the next start writes the runs from the stored
//! report, so `gpuctl fleet` loses no finished job.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{as_rank, running_stress, start, stress_result, wait_state, RunningJob};
use gpuctl_coordinator::server::STORE_FILE;
use gpuctl_coordinator::store::{Batch, RedbStore, StateStore};
use gpuctl_proto::pb::*;
use tonic::transport::Channel;

/// Each node's last job and verdict, as `gpuctl fleet` lists them.
async fn fleet(
    c: &mut job_service_client::JobServiceClient<Channel>,
) -> Vec<(String, String, i32)> {
    let rows = c
        .get_fleet(GetFleetRequest::default())
        .await
        .unwrap()
        .into_inner()
        .rows;
    rows.into_iter()
        .map(|r| (r.node, r.last_job, r.last_verdict))
        .collect()
}

fn open(dir: &std::path::Path) -> StateStore {
    StateStore::new(Arc::new(RedbStore::open(&dir.join(STORE_FILE)).unwrap()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_lost_between_the_two_commits_are_written_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let RunningJob {
        coord,
        agents,
        mut jobs,
        workers: mut w,
        id,
        secrets: sec,
    } = running_stress(dir.path(), Duration::from_secs(5), 2).await;
    for rank in 0..2 {
        let ack = w
            .report_result(as_rank(&sec, rank, stress_result(&id, rank, "d")))
            .await
            .unwrap()
            .into_inner();
        assert!(ack.ok, "{ack:?}");
    }
    wait_state(&mut jobs, &id, JobState::Succeeded, Duration::from_secs(10)).await;
    let pass = Verdict::Pass as i32;
    let want = vec![
        ("node-0".to_string(), id.clone(), pass),
        ("node-1".to_string(), id.clone(), pass),
    ];
    assert_eq!(fleet(&mut jobs).await, want, "the runs are read at once");
    // The mark goes right after the runs' commit (milliseconds here).
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop((agents, jobs, w));
    coord.shutdown().await;

    let store = open(dir.path());
    assert!(
        store.history_due().await.unwrap().is_empty(),
        "the mark goes once the runs are stored"
    );
    let runs = store.history(None).await.unwrap();
    assert_eq!(runs.len(), 2, "{runs:?}");
    // What a crash between the two commits leaves: the report, its mark, no runs.
    for run in &runs {
        assert!(store.delete_run(run).await.unwrap());
    }
    store
        .write(Batch::default().history_due(&id))
        .await
        .unwrap();
    store.close().await.unwrap();
    drop(store);

    let coord = start(dir.path(), Duration::from_secs(5)).await;
    let mut jobs = coord.jobs().await;
    assert_eq!(fleet(&mut jobs).await, want, "made again from the report");
    drop(jobs);
    coord.shutdown().await;
    let store = open(dir.path());
    assert!(store.history_due().await.unwrap().is_empty());
    let again = store.history(None).await.unwrap();
    assert_eq!(again, runs, "the same runs as the judge made");
}

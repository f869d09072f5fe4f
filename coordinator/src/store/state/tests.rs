//! The typed layer against a real redb file: what is written reads back the
//! same after a reopen, and the history version moves only with what the
//! fleet history reads.

use super::*;
use crate::store::RedbStore;
use gpuctl_proto::pb::{Job, JobState, Plan, RankReport};

fn open(dir: &std::path::Path) -> StateStore {
    StateStore::new(Arc::new(RedbStore::open(&dir.join("state.redb")).unwrap()))
}

/// What the fleet history reads changes the version; nothing else does.
#[tokio::test]
async fn the_history_version_moves_with_runs_acceptances_and_nodes_only() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    let v0 = s.history_version();
    let mut job = Job {
        id: "job-000001".into(),
        ..Default::default()
    };
    s.write(Batch::default().job(&mut job).history_due(&job.id))
        .await
        .unwrap();
    assert_eq!(
        s.history_version(),
        v0,
        "a job and its mark are not history"
    );
    let run = NodeRun {
        node: "a".into(),
        job_id: job.id.clone(),
        finished_unix_ms: 5,
        ..Default::default()
    };
    drop(s.queue_later(Batch::default().run(&run)));
    let v1 = s.history_version();
    assert!(v1 > v0, "a queued run");
    s.write(Batch::default().node(&Node {
        name: "a".into(),
        ..Default::default()
    }))
    .await
    .unwrap();
    let v2 = s.history_version();
    assert!(v2 > v1, "a node");
    assert!(s.delete_run(&run).await.unwrap());
    let v3 = s.history_version();
    assert!(v3 > v2, "a deleted run");
    s.history_done(&job.id).await.unwrap();
    assert_eq!(s.history_version(), v3, "the mark's deletion");
}

#[tokio::test]
async fn round_trip_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = open(dir.path());
        let mut job = Job {
            id: "job-000001".into(),
            state: JobState::Running as i32,
            attempt: 1,
            ..Default::default()
        };
        let node = Node {
            name: "node-0".into(),
            slots: 2,
            ..Default::default()
        };
        s.write(Batch::default().job(&mut job).node(&node).job_seq(1))
            .await
            .unwrap();
        for rank in [1, 0, 10] {
            s.put_result(&RankResult {
                job_id: "job-000001".into(),
                attempt: 1,
                rank,
                ok: true,
                ..Default::default()
            })
            .await
            .unwrap();
        }
        // A neighbour whose id shares a prefix must not leak into scans.
        s.put_result(&RankResult {
            job_id: "job-0000010".into(),
            attempt: 1,
            rank: 0,
            ..Default::default()
        })
        .await
        .unwrap();
        s.put_logs(vec![
            (
                "job-000001".into(),
                0,
                1,
                vec![LogLine {
                    rank: 0,
                    node: "node-0".into(),
                    line: "a".into(),
                }],
            ),
            (
                "job-000001".into(),
                0,
                2,
                vec![LogLine {
                    rank: 0,
                    node: "node-0".into(),
                    line: "b".into(),
                }],
            ),
        ])
        .await
        .unwrap();
        // Releases the file now (the writer task would, once it ends).
        s.close().await.unwrap();
    }
    // Reopen: everything written before is there.
    let s = open(dir.path());
    assert_eq!(s.job_seq().await.unwrap(), 1);
    let jobs = s.jobs().await.unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].state(), JobState::Running);
    assert_eq!(s.nodes().await.unwrap()[0].slots, 2);
    let ranks: Vec<u32> = s
        .results("job-000001", 1)
        .await
        .unwrap()
        .iter()
        .map(|r| r.rank)
        .collect();
    assert_eq!(ranks, vec![0, 1, 10], "results in rank order, no neighbour");
    let lines: Vec<String> = s
        .logs("job-000001", Some(0))
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.line)
        .collect();
    assert_eq!(lines, vec!["a", "b"]);
    assert_eq!(s.last_log_seq("job-000001", 0).await.unwrap(), Some(2));
    assert_eq!(s.last_log_seq("job-000001", 1).await.unwrap(), None);
    assert!(s.report("job-000001").await.unwrap().is_none());
    assert!(s.raw().delete(keys::job("job-000001")).await.unwrap());
    assert!(!s.raw().delete(keys::job("job-000001")).await.unwrap());
    assert!(s.job("job-000001").await.unwrap().is_none());
}

/// The plan is stored once, apart from the record; every read puts it
/// back, a record written later (the job's end) leaves it as it was, a
/// record stored with its plan inside reads as it is, and a deleted job
/// takes its plan with it.
#[tokio::test]
async fn a_jobs_plan_is_stored_apart_once_and_read_back_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    let plan = Plan {
        world_size: 3,
        nodes: vec!["node-0".into()],
        ranks: (0..3)
            .map(|rank| gpuctl_proto::pb::RankPlacement {
                rank,
                node: "node-0".into(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let mut job = Job {
        id: "job-000003".into(),
        state: JobState::Running as i32,
        plan: Some(plan.clone()),
        progress: vec![Default::default()],
        ..Default::default()
    };
    s.write(Batch::default().job(&mut job).plan(&job))
        .await
        .unwrap();
    assert_eq!(
        job.plan.as_ref(),
        Some(&plan),
        "the caller's job is as it was"
    );
    assert_eq!(job.progress.len(), 1);
    let record = stored_record(&s, "job-000003").await;
    assert!(record.plan.is_none() && record.progress.is_empty());

    // The end: the record again, its plan cut in memory as a retired job's is.
    job.set_state(JobState::Succeeded);
    job.plan.as_mut().unwrap().ranks.clear();
    s.write(Batch::default().job(&mut job)).await.unwrap();
    // Read raw: `job` puts the stored plan back over whatever the record holds.
    let record = stored_record(&s, "job-000003").await;
    assert!(record.plan.is_none(), "the end's record carries no plan");
    let read = s.job("job-000003").await.unwrap().unwrap();
    assert_eq!(read.state(), JobState::Succeeded);
    assert_eq!(
        read.plan,
        Some(plan.clone()),
        "the plan as the start wrote it"
    );
    assert!(read.progress.is_empty());

    // A record from before the split, its plan inside.
    let old = Job {
        id: "job-000002".into(),
        plan: Some(plan.clone()),
        ..Default::default()
    };
    s.raw()
        .put(keys::job("job-000002"), old.encode_to_vec())
        .await
        .unwrap();
    let jobs = s.jobs().await.unwrap();
    let ids: Vec<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(ids, ["job-000002", "job-000003"]);
    assert_eq!(jobs[0], old);
    assert_eq!(jobs[1], read);

    assert_eq!(s.delete_job("job-000003").await.unwrap(), 2);
    assert!(s
        .raw()
        .get(keys::plan("job-000003"))
        .await
        .unwrap()
        .is_none());
    assert_eq!(s.jobs().await.unwrap(), vec![old]);
}

/// Job `id`'s record as stored, without the plan reads put back.
async fn stored_record(s: &StateStore, id: &str) -> Job {
    let bytes = s.raw().get(keys::job(id)).await.unwrap().unwrap();
    Job::decode(bytes.as_slice()).unwrap()
}

#[tokio::test]
async fn a_report_is_stored_without_its_results_and_read_with_them() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    let result = |rank| RankResult {
        job_id: "job-000007".into(),
        attempt: 2,
        rank,
        node: "node-0".into(),
        ..Default::default()
    };
    for rank in [0, 1] {
        s.put_result(&result(rank)).await.unwrap();
    }
    // Attempt 1's result of rank 1 is not attempt 2's.
    s.put_result(&RankResult {
        attempt: 1,
        device: "old".into(),
        ..result(1)
    })
    .await
    .unwrap();
    let rank = |rank| RankReport {
        rank,
        result: Some(Box::new(result(rank))),
        ..Default::default()
    };
    let mut report = Report {
        job_id: "job-000007".into(),
        attempt: 2,
        nodes: vec![gpuctl_proto::pb::NodeReport {
            name: "node-0".into(),
            ranks: vec![
                rank(0),
                rank(1),
                RankReport {
                    rank: 2,
                    ..Default::default()
                },
            ],
            ..Default::default()
        }],
        ..Default::default()
    };
    let want = report.clone();
    s.queue(Batch::default().report(&mut report)).await.unwrap();
    assert_eq!(report, want, "the caller's report keeps its results");
    let raw = s
        .get_raw(keys::report("job-000007"))
        .await
        .unwrap()
        .unwrap();
    let stored = Report::decode(raw.as_slice()).unwrap();
    let carried = stored.nodes[0].ranks.iter().filter(|r| r.result.is_some());
    assert_eq!(carried.count(), 0, "the stored value has no results");
    assert_eq!(s.report("job-000007").await.unwrap().unwrap(), want);
}

#[tokio::test]
async fn garbage_values_are_reported_with_their_key() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    s.raw()
        .put(keys::job("bad"), vec![0xff, 0xff, 0xff])
        .await
        .unwrap();
    let err = s.jobs().await.unwrap_err().to_string();
    assert!(err.contains("jobs/bad"), "{err}");
}

/// The fleet view's reads: every node's runs in one read, whether they are
/// committed or still queued, each node's alone (`a` is not `a-1`), and
/// the inventory's names without its nodes.
#[tokio::test]
async fn histories_and_node_names_read_committed_and_queued_writes_alike() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    let run = |node: &str, job: &str, at: u64| NodeRun {
        node: node.into(),
        job_id: job.into(),
        finished_unix_ms: at,
        ..Default::default()
    };
    let node = |name: &str| Node {
        name: name.into(),
        ..Default::default()
    };
    let committed = Batch::default()
        .run(&run("a", "job-1", 10))
        .run(&run("a-1", "job-1", 10))
        .node(&node("a"))
        .node(&node("a-1"));
    s.write(committed).await.unwrap();
    let queued = Batch::default()
        .run(&run("a", "job-2", 20))
        .run(&run("c", "job-2", 20))
        .node(&node("c"));
    let durable = s.queue_later(queued);
    let names = ["a", "b", "a-1", "c"].map(String::from);
    let read = s.histories(&names).await.unwrap();
    let jobs: Vec<Vec<&str>> = (read.iter())
        .map(|runs| runs.iter().map(|r| r.job_id.as_str()).collect())
        .collect();
    assert_eq!(
        jobs,
        vec![vec!["job-1", "job-2"], vec![], vec!["job-1"], vec!["job-2"]]
    );
    assert_eq!(s.node_names().await.unwrap(), ["a", "a-1", "c"]);
    durable.wait().await.unwrap();
    assert_eq!(s.histories(&names).await.unwrap(), read, "once committed");
    assert_eq!(s.node_names().await.unwrap(), ["a", "a-1", "c"]);
}

//! The fleet history's writing, reading and upkeep. Finished jobs leave one
//! run per node in the store, committed right after the job's report (see
//! [`store_runs`]); this module answers `gpuctl fleet` from them and, in a
//! task of its own, deletes runs beyond the retention (per node a count, and
//! an age) so the history stays bounded without the scheduler doing store
//! scans.

use std::time::Duration;

use futures::StreamExt as _;

use gpuctl_core::shutdown::Shutdown;
use gpuctl_proto::pb::{GetFleetRequest, GetFleetResponse, NodeRun};
use tracing::{debug, info, warn};

use crate::error::CoordinatorError;
use crate::judge::fleet::{self, FleetFold};
use crate::store::{Batch, Durable, StateStore, StoreError};
use gpuctl_core::clock::Clock;

/// How long runs are kept, and how many per node.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    pub keep: usize,
    pub max_age: Duration,
}

/// How often the retention is applied.
const PRUNE_EVERY: Duration = Duration::from_secs(600);

/// Queues `runs`, job `job`'s history, to be committed after its report,
/// which was queued just before and marked them due
/// ([`Batch::history_due`]), in the store's second lane: at 4,096 nodes
/// they are 4,096 scattered inserts, 0.2-0.6 s and once 8.9 s, which
/// neither the report nor the next job's `Submit` waits for. Readers see
/// them at once; once they are durable the mark goes. A crash in between
/// leaves the mark, and [`catch_up`] makes them again from the stored report
/// at the next start.
/// [`crate::fleet_view::FleetView::store_runs`] folds them into the kept
/// answer first.
pub fn store_runs(store: &StateStore, job: &str, runs: Batch) {
    if runs.is_empty() {
        return;
    }
    done_when_stored(store, job, store.queue_later(runs));
}

/// Once `runs` (job `job`'s, queued) are durable, the mark goes.
pub fn done_when_stored(store: &StateStore, job: &str, runs: Durable) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let (store, job) = (store.clone(), job.to_string());
    rt.spawn(async move {
        // The writer commits in order: the report (and the mark) first.
        let done = match runs.wait().await {
            Ok(()) => store.history_done(&job).await.map(drop),
            Err(e) => Err(e),
        };
        // The writer logs a failed commit itself; the mark stays for the next start.
        if let Err(e) = done {
            warn!(job = %job, "the fleet history of the job is not stored yet: {e}");
        }
    });
}

/// Writes the runs of every job whose report was stored and whose runs
/// were not (a crash between the two commits), made again from the report;
/// returns how many jobs had runs due.
pub async fn catch_up(store: &StateStore) -> Result<usize, StoreError> {
    let due = store.history_due().await?;
    for job in &due {
        match store.report(job).await? {
            Some(report) => {
                let runs = fleet::runs_of(&report);
                store
                    .write(runs.iter().fold(Batch::default(), Batch::run))
                    .await?;
                info!(job = %job, "fleet history written from the stored report");
            }
            None => warn!(job = %job, "history due without a stored report; nothing to write"),
        }
        store.history_done(job).await?;
    }
    Ok(due.len())
}

/// The nodes whose history is read, [`READ_NODES`] at a time: the
/// inventory's. Read whole, the history is every node's runs at once: at
/// 4,096 nodes after 28 jobs the coordinator's live heap rose ~300 MB while
/// it was, and `--history-keep` (200 runs a node) makes that ~2 GB. A node
/// removed from the inventory keeps its runs (`gpuctl fleet --node` reads
/// them); they are neither listed nor pruned. Names only: decoding 16,384
/// nodes (GPUs, checks) to take their names took 0.45-0.7 s a build.
async fn inventory(store: &StateStore) -> Result<Vec<String>, CoordinatorError> {
    store
        .node_names()
        .await
        .map_err(|e| CoordinatorError::store("could not read the node inventory", e))
}

/// Nodes whose runs one read brings: bounds what is held to twice that many
/// nodes' runs (each at most `--history-keep`), one read folded while the
/// next is made. A read a node was a trip to the store's thread each: at
/// 16,384 nodes the fleet view took 2-3 s to build after a job, and 67 s
/// while the next job started.
pub const READ_NODES: usize = 64;

/// The runs of each of `nodes`, in one read.
pub async fn runs_of(
    store: &StateStore,
    nodes: &[String],
) -> Result<Vec<Vec<NodeRun>>, CoordinatorError> {
    (store.histories(nodes).await)
        .map_err(|e| CoordinatorError::store("could not read the fleet history", e))
}

/// As [`fold`], driven on a blocking thread of its own: folding 16,384
/// nodes' runs is 0.5-0.7 s of CPU, which on the runtime held a worker that
/// serves every connection and people's calls. (It was not what made a
/// build after a big job take 51-67 s: that was the store's reads, see
/// `store::redb::sweep`.)
pub async fn fold_apart(
    store: &StateStore,
    req: GetFleetRequest,
    drift_tolerance: f64,
) -> Result<(FleetFold, Vec<NodeRun>), CoordinatorError> {
    let store = store.clone();
    crate::runtime::apart(move || async move { fold(&store, &req, drift_tolerance).await }).await
}

/// `gpuctl fleet`: one row per node, with drift against its own history
/// (`drift_tolerance`: a last figure under that share of the previous median
/// is flagged); with `node`, that node's runs, newest first.
pub async fn fleet(
    store: &StateStore,
    req: GetFleetRequest,
    drift_tolerance: f64,
) -> Result<GetFleetResponse, CoordinatorError> {
    let (mut folded, runs) = fold_apart(store, req, drift_tolerance).await?;
    let (rows, links) = (folded.rows(), folded.links());
    // The fold's own hold on the rows goes with it: they are moved out, not copied.
    drop(folded);
    Ok(GetFleetResponse {
        rows: std::sync::Arc::unwrap_or_clone(rows),
        runs,
        links,
        ..Default::default()
    })
}

/// What `gpuctl fleet` answers from, read [`READ_NODES`] nodes at a time
/// (see [`inventory`]): every node's runs from `req.since_unix_ms` on, or
/// `req.node`'s alone, with those runs newest first.
pub async fn fold(
    store: &StateStore,
    req: &GetFleetRequest,
    drift_tolerance: f64,
) -> Result<(FleetFold, Vec<NodeRun>), CoordinatorError> {
    let node = req.node.trim();
    let t0 = std::time::Instant::now();
    // Each node's last acceptance suite, whenever it was.
    let mut accepted = store
        .acceptances()
        .await
        .map_err(|e| CoordinatorError::store("could not read the acceptance states", e))?;
    // The inventory comes in key order, one entry a node.
    let names = if node.is_empty() {
        inventory(store).await?
    } else {
        accepted.retain(|a| a.node == node);
        vec![node.to_string()]
    };
    let read_names_ms = t0.elapsed().as_millis() as u64;
    let mut folded = FleetFold::new(drift_tolerance, Vec::new(), accepted);
    let mut last = Vec::new();
    let mut reads = futures::stream::iter(names.chunks(READ_NODES))
        .map(|chunk| runs_of(store, chunk))
        .buffered(2);
    // The reads come back in order.
    let mut chunks = names.chunks(READ_NODES);
    while let Some(runs) = reads.next().await {
        let chunk = chunks.next().unwrap_or_default();
        for (name, mut runs) in chunk.iter().zip(runs?) {
            runs.retain(|r| r.finished_unix_ms >= req.since_unix_ms);
            folded.add_node(name, &runs);
            last = runs;
        }
    }
    debug!(
        nodes = names.len(),
        read_names_ms,
        read_runs_ms = t0.elapsed().as_millis() as u64 - read_names_ms,
        "fleet history read"
    );
    if node.is_empty() {
        return Ok((folded, Vec::new()));
    }
    last.sort_by_key(|r| std::cmp::Reverse(r.finished_unix_ms));
    Ok((folded, last))
}

/// Deletes runs beyond the retention, a node at a time (see
/// [`inventory`]); returns how many went.
pub async fn prune(
    store: &StateStore,
    r: Retention,
    clock: &Clock,
) -> Result<usize, CoordinatorError> {
    let now = clock.now_ms();
    let max_age = r.max_age.as_millis().min(u64::MAX as u128) as u64;
    let mut gone = 0;
    for nodes in inventory(store).await?.chunks(READ_NODES) {
        for mut runs in runs_of(store, nodes).await? {
            runs.sort_by_key(|x| std::cmp::Reverse(x.finished_unix_ms));
            for i in fleet::expired(&runs, r.keep, max_age, now) {
                store
                    .delete_run(&runs[i])
                    .await
                    .map_err(|e| CoordinatorError::store("could not prune the fleet history", e))?;
                gone += 1;
            }
        }
    }
    Ok(gone)
}

/// Applies the retention now and every ten minutes until shutdown.
pub async fn keep_bounded(store: StateStore, r: Retention, clock: Clock, shutdown: Shutdown) {
    let mut tick = tokio::time::interval(PRUNE_EVERY);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => match prune(&store, r, &clock).await {
                Ok(0) => {}
                Ok(n) => info!(runs = n, "fleet history pruned"),
                Err(e) => warn!("{e}"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use gpuctl_proto::pb::{NodeReport, Report, Verdict};

    use super::*;
    use crate::store::RedbStore;

    /// What a crash between a job's two commits leaves: the report and the
    /// mark, no runs.
    #[tokio::test]
    async fn runs_left_due_by_a_crash_are_made_from_the_stored_report() {
        let dir = tempfile::tempdir().unwrap();
        let raw = RedbStore::open(&dir.path().join("s.redb")).unwrap();
        let store = StateStore::new(Arc::new(raw));
        let node = |name: &str, verdict: Verdict| NodeReport {
            name: name.into(),
            verdict: verdict as i32,
            ..Default::default()
        };
        let mut report = Report {
            job_id: "job-000007".into(),
            workload: "stress".into(),
            finished_unix_ms: 1_700_000_000_000,
            nodes: vec![node("a", Verdict::Pass), node("b", Verdict::Fail)],
            ..Default::default()
        };
        let batch = Batch::default()
            .report(&mut report)
            .history_due(&report.job_id);
        store.write(batch).await.unwrap();
        assert_eq!(store.history_due().await.unwrap(), ["job-000007"]);
        assert!(store.history(None).await.unwrap().is_empty());

        assert_eq!(catch_up(&store).await.unwrap(), 1);
        let runs = store.history(None).await.unwrap();
        let seen: Vec<(&str, &str, i32)> = runs
            .iter()
            .map(|r| (r.node.as_str(), r.job_id.as_str(), r.verdict))
            .collect();
        assert_eq!(
            seen,
            [
                ("a", "job-000007", Verdict::Pass as i32),
                ("b", "job-000007", Verdict::Fail as i32)
            ]
        );
        assert!(store.history_due().await.unwrap().is_empty());
        // Nothing due: nothing written again.
        assert_eq!(catch_up(&store).await.unwrap(), 0);
    }

    /// The runs' mark goes once they are committed, and only then.
    #[tokio::test]
    async fn stored_runs_clear_their_mark() {
        let dir = tempfile::tempdir().unwrap();
        let raw = RedbStore::open(&dir.path().join("s.redb")).unwrap();
        let store = StateStore::new(Arc::new(raw));
        let run = NodeRun {
            node: "a".into(),
            job_id: "job-000001".into(),
            finished_unix_ms: 5,
            ..Default::default()
        };
        drop(store.queue(Batch::default().history_due("job-000001")));
        store_runs(&store, "job-000001", Batch::default().run(&run));
        for _ in 0..200 {
            if store.history_due().await.unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(store.history_due().await.unwrap().is_empty());
        assert_eq!(store.history(Some("a")).await.unwrap(), [run]);
    }

    /// Runs past `--history-keep` or `--history-max-age` go, node by node;
    /// a node no longer in the inventory keeps its runs, and `gpuctl fleet`
    /// lists the inventory's nodes, or the one asked for.
    #[tokio::test]
    async fn the_retention_applies_per_node_of_the_inventory() {
        let dir = tempfile::tempdir().unwrap();
        let raw = RedbStore::open(&dir.path().join("s.redb")).unwrap();
        let store = StateStore::new(Arc::new(raw));
        let clock = Clock::manual(1_700_000_000_000);
        let now = clock.now_ms();
        let day = 86_400_000;
        let run = |node: &str, job: u64, age_ms: u64| NodeRun {
            node: node.into(),
            job_id: format!("job-{job:06}"),
            finished_unix_ms: now - age_ms,
            verdict: Verdict::Pass as i32,
            ..Default::default()
        };
        let mut batch = Batch::default();
        for name in ["a", "b"] {
            batch = batch.node(&gpuctl_proto::pb::Node {
                name: name.into(),
                ..Default::default()
            });
        }
        let runs = [
            run("a", 1, 10 * day),
            run("a", 2, 4_000),
            run("a", 3, 3_000),
            run("a", 4, 2_000),
            run("a", 5, 1_000),
            run("b", 6, 10 * day),
            run("c", 1, 3_000),
            run("c", 2, 2_000),
            run("c", 3, 1_000),
        ];
        store
            .write(runs.iter().fold(batch, Batch::run))
            .await
            .unwrap();
        let r = Retention {
            keep: 2,
            max_age: Duration::from_secs(86_400),
        };
        // a: two past the newest two, one of them also too old; b: too old.
        assert_eq!(prune(&store, r, &clock).await.unwrap(), 4);
        let jobs = |node: &str| {
            let store = store.clone();
            let node = node.to_string();
            async move {
                let mut j: Vec<String> = store
                    .history(Some(&node))
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|r| r.job_id)
                    .collect();
                j.sort();
                j
            }
        };
        assert_eq!(jobs("a").await, ["job-000004", "job-000005"]);
        assert!(jobs("b").await.is_empty());
        assert_eq!(jobs("c").await.len(), 3, "not in the inventory: kept");

        let all = fleet(&store, GetFleetRequest::default(), 0.9)
            .await
            .unwrap();
        let rows: Vec<(&str, u32)> = all.rows.iter().map(|r| (r.node.as_str(), r.runs)).collect();
        assert_eq!(
            rows,
            [("a", 2)],
            "b has no runs left; c is not in the inventory"
        );
        let c = fleet(
            &store,
            GetFleetRequest {
                node: "c".into(),
                ..Default::default()
            },
            0.9,
        )
        .await
        .unwrap();
        let newest_first: Vec<&str> = c.runs.iter().map(|r| r.job_id.as_str()).collect();
        assert_eq!(newest_first, ["job-000003", "job-000002", "job-000001"]);
    }
}

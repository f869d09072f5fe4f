//! The fleet history's reading and upkeep. Finished jobs leave one run per
//! node in the store (written by the scheduler with the job's report); this
//! module answers `gpuctl fleet` from them and, in a task of its own, deletes
//! runs beyond the retention (per node a count, and an age) so the history
//! stays bounded without the scheduler doing store scans.

use std::time::Duration;

use gpuctl_proto::pb::{FleetRow, GetFleetRequest, GetFleetResponse, NodeRun};
use gpuctl_proto::shutdown::Shutdown;
use tracing::{info, warn};

use crate::error::CoordinatorError;
use crate::judge::fleet;
use crate::store::StateStore;

/// How long runs are kept, and how many per node.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    pub keep: usize,
    pub max_age: Duration,
}

/// How often the retention is applied.
const PRUNE_EVERY: Duration = Duration::from_secs(600);

/// `gpuctl fleet`: one row per node, with drift against its own history
/// (`drift_tolerance`: a last figure under that share of the previous median
/// is flagged); with `node`, that node's runs, newest first.
pub async fn fleet(
    store: &StateStore,
    req: GetFleetRequest,
    drift_tolerance: f64,
) -> Result<GetFleetResponse, CoordinatorError> {
    let node = req.node.trim();
    let mut runs: Vec<NodeRun> = store
        .history((!node.is_empty()).then_some(node))
        .await
        .map_err(|e| CoordinatorError::store("could not read the fleet history", e))?;
    runs.retain(|r| r.finished_unix_ms >= req.since_unix_ms);
    let mut rows = fleet::rows(&runs, drift_tolerance);
    // Each node's last acceptance suite, whenever it was.
    let accepted = store
        .acceptances()
        .await
        .map_err(|e| CoordinatorError::store("could not read the acceptance states", e))?;
    for a in accepted {
        if !node.is_empty() && a.node != node {
            continue;
        }
        match rows.iter_mut().find(|r| r.node == a.node) {
            Some(row) => row.acceptance = Some(a),
            None => rows.push(FleetRow {
                node: a.node.clone(),
                acceptance: Some(a),
                ..Default::default()
            }),
        }
    }
    rows.sort_by(|a, b| a.node.cmp(&b.node));
    let links = fleet::latest_links(&runs);
    if node.is_empty() {
        return Ok(GetFleetResponse {
            rows,
            runs: Vec::new(),
            links,
        });
    }
    runs.sort_by_key(|r| std::cmp::Reverse(r.finished_unix_ms));
    Ok(GetFleetResponse { rows, runs, links })
}

/// Deletes runs beyond the retention; returns how many went.
pub async fn prune(store: &StateStore, r: Retention) -> Result<usize, CoordinatorError> {
    let all = store
        .history(None)
        .await
        .map_err(|e| CoordinatorError::store("could not read the fleet history", e))?;
    let mut by_node: std::collections::BTreeMap<String, Vec<NodeRun>> = Default::default();
    for run in all {
        by_node.entry(run.node.clone()).or_default().push(run);
    }
    let now = gpuctl_proto::now_ms();
    let max_age = r.max_age.as_millis().min(u64::MAX as u128) as u64;
    let mut gone = 0;
    for (_, mut runs) in by_node {
        runs.sort_by_key(|x| std::cmp::Reverse(x.finished_unix_ms));
        for i in fleet::expired(&runs, r.keep, max_age, now) {
            store
                .delete_run(&runs[i])
                .await
                .map_err(|e| CoordinatorError::store("could not prune the fleet history", e))?;
            gone += 1;
        }
    }
    Ok(gone)
}

/// Applies the retention now and every ten minutes until shutdown.
pub async fn keep_bounded(store: StateStore, r: Retention, shutdown: Shutdown) {
    let mut tick = tokio::time::interval(PRUNE_EVERY);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => match prune(&store, r).await {
                Ok(0) => {}
                Ok(n) => info!(runs = n, "fleet history pruned"),
                Err(e) => warn!("{e}"),
            },
        }
    }
}

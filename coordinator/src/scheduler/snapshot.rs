//! What `/metrics` shows, taken from the scheduler's state in one event so the
//! numbers agree with each other. Rendering it is the metrics server's job.

use std::collections::BTreeMap;

use super::Scheduler;

/// What one scrape shows.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Snapshot {
    /// Nodes by state label; every state is listed, zero or not.
    pub nodes: BTreeMap<&'static str, u64>,
    /// Each registered node's state label, by name (`gpuctl_node_state`).
    pub node_states: Vec<(String, &'static str)>,
    pub jobs: BTreeMap<&'static str, u64>,
    pub submitted: u64,
    pub results: u64,
    pub samples: u64,
    pub log_lines: u64,
    /// Ended jobs deleted from the store past `--keep-jobs`.
    pub jobs_deleted: u64,
    pub rendezvous_keys: u64,
    /// Bytes the ended jobs kept hold in the store, as measured
    /// (`--keep-jobs-bytes`).
    pub jobs_stored_bytes: u64,
    /// Per-rank entries held in memory over every job (`JobEntry::held_ranks`).
    pub held_ranks: u64,
    /// Messages refused by kind (`crate::refusals`), every kind listed.
    pub refused: Vec<(&'static str, u64)>,
    /// Each node's last verdict and figures from the fleet history (filled
    /// by the metrics server, not the scheduler, which holds no history).
    pub fleet: std::sync::Arc<Vec<gpuctl_proto::pb::FleetRow>>,
}

/// Counters since this coordinator started.
#[derive(Debug, Default, Clone)]
pub(super) struct Counts {
    pub submitted: u64,
    pub results: u64,
    pub samples: u64,
    pub log_lines: u64,
    /// Counted by the tasks that delete them, off the scheduler's task.
    pub jobs_deleted: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Scheduler {
    pub(super) fn snapshot(&self) -> Snapshot {
        let mut snap = Snapshot {
            submitted: self.counts.submitted,
            results: self.counts.results,
            samples: self.counts.samples,
            log_lines: self.counts.log_lines,
            jobs_deleted: self
                .counts
                .jobs_deleted
                .load(std::sync::atomic::Ordering::Relaxed),
            rendezvous_keys: self.rdv.key_count() as u64,
            refused: self.cfg.refusals.counts(),
            ..Default::default()
        };
        for (name, e) in &self.nodes {
            let state = e.node.state().label();
            *snap.nodes.entry(state).or_default() += 1;
            snap.node_states.push((name.clone(), state));
        }
        for e in self.jobs.values() {
            *snap.jobs.entry(e.state().label()).or_default() += 1;
            snap.held_ranks += e.held_ranks();
            if e.state().is_terminal() {
                snap.jobs_stored_bytes += self.store.job_size(&e.job.id).unwrap_or(0);
            }
        }
        snap
    }
}

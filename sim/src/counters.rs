//! The counts the bench reads while the fleet runs: agents count
//! registrations, sessions and assignments, fake workers count their calls
//! and results. Apart from `fleet.rs` because both the fleet's agents and
//! the ranks they start ([`crate::ranks`]) write here: in the fleet, the
//! ranks reached back into the module that starts them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Counts the bench reads while the fleet runs.
#[derive(Default)]
pub struct Stats {
    pub registered: AtomicU64,
    pub ranks_started: AtomicU64,
    pub results_sent: AtomicU64,
    pub results_refused: AtomicU64,
    pub rpc_errors: AtomicU64,
    /// The same, by call and gRPC code ("ReportProgress: Cancelled"): a
    /// call the simulator gave up on reads apart from one refused.
    rpc_error_kinds: Mutex<std::collections::BTreeMap<String, u64>>,
    /// Sessions that ended while the fleet ran, and sessions opened again.
    pub sessions_lost: AtomicU64,
    pub reconnects: AtomicU64,
    /// Tries to reach a coordinator that failed for want of a descriptor
    /// in this process: the simulator's limit, not the coordinator's doing.
    pub descriptors_short: AtomicU64,
    jobs: Mutex<HashMap<String, JobTimes>>,
}

/// When a job's assignments and results arrived at the fleet.
#[derive(Debug, Clone, Copy)]
pub struct JobTimes {
    pub first_assignment: Instant,
    pub last_assignment: Instant,
    pub assignments: u64,
    pub last_result: Option<Instant>,
    pub results: u64,
}

impl Stats {
    /// Counts `error` when a socket could not be made (hyper's "tcp open
    /// error" is `socket(2)` failing; EMFILE here).
    pub(crate) fn out_of_descriptors(&self, error: &str) {
        if error.contains("tcp open error") || error.contains("Too many open files") {
            self.descriptors_short.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a rank call of `call` that failed with `status`.
    pub(crate) fn rpc_error(&self, call: &str, status: &tonic::Status) {
        self.rpc_errors.fetch_add(1, Ordering::Relaxed);
        let kind = format!("{call}: {:?}", status.code());
        *self
            .rpc_error_kinds
            .lock()
            .unwrap()
            .entry(kind)
            .or_default() += 1;
    }

    /// Failed rank calls by call and code, most first.
    pub fn rpc_error_kinds(&self) -> Vec<(String, u64)> {
        let mut kinds: Vec<_> = self
            .rpc_error_kinds
            .lock()
            .unwrap()
            .clone()
            .into_iter()
            .collect();
        kinds.sort_by_key(|k| std::cmp::Reverse(k.1));
        kinds
    }

    pub fn job(&self, id: &str) -> Option<JobTimes> {
        self.jobs.lock().unwrap().get(id).copied()
    }

    /// Assignments taken so far, by job.
    pub fn assignments(&self) -> Vec<(String, u64)> {
        let jobs = self.jobs.lock().unwrap();
        jobs.iter()
            .map(|(id, t)| (id.clone(), t.assignments))
            .collect()
    }

    /// Forgets finished jobs' times (the bench keeps what it needs).
    pub fn forget(&self, id: &str) {
        self.jobs.lock().unwrap().remove(id);
    }

    pub(crate) fn assigned(&self, id: &str) {
        let now = Instant::now();
        let mut jobs = self.jobs.lock().unwrap();
        let t = jobs.entry(id.to_string()).or_insert(JobTimes {
            first_assignment: now,
            last_assignment: now,
            assignments: 0,
            last_result: None,
            results: 0,
        });
        t.last_assignment = now;
        t.assignments += 1;
    }

    pub(crate) fn result_sent(&self, id: &str) {
        self.results_sent.fetch_add(1, Ordering::Relaxed);
        if let Some(t) = self.jobs.lock().unwrap().get_mut(id) {
            t.last_result = Some(Instant::now());
            t.results += 1;
        }
    }
}

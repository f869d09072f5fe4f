//! Messages refused because their sender may not say them: a node speaking
//! for a rank it does not hold, a rank writing another's rendezvous key, a
//! result whose device disagrees with the plan. A node under test is not
//! trusted, so each refusal is logged with its sender and counted by kind
//! for `/metrics` (`gpuctl_refused_messages_total`): an operator sees a node
//! that tries, not only that nothing happened.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tracing::warn;

/// What was refused, one label each on `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Refused {
    /// `WorkerExited` for a rank the sending node does not hold.
    WorkerExit,
    /// `AssignmentAck` for a job the sending node is not in.
    Ack,
    /// `WorkerLog` lines for a rank the sending node does not hold.
    Log,
    /// Telemetry for a job the sending node is not in, or of a GPU it did
    /// not register.
    Telemetry,
    /// A result whose device facts disagree with the plan.
    Result,
    /// A rendezvous write to a key another rank owns.
    Rendezvous,
    /// A trace piece or trace request that does not match the plan.
    Trace,
    /// A registration past a budget, or one that changed what the node is.
    Registration,
    /// A session that never said who it is in time, or stopped talking.
    Session,
}

impl Refused {
    pub const ALL: [Refused; 9] = [
        Refused::WorkerExit,
        Refused::Ack,
        Refused::Log,
        Refused::Telemetry,
        Refused::Result,
        Refused::Rendezvous,
        Refused::Trace,
        Refused::Registration,
        Refused::Session,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Refused::WorkerExit => "worker_exit",
            Refused::Ack => "ack",
            Refused::Log => "log",
            Refused::Telemetry => "telemetry",
            Refused::Result => "result",
            Refused::Rendezvous => "rendezvous",
            Refused::Trace => "trace",
            Refused::Registration => "registration",
            Refused::Session => "session",
        }
    }
}

/// The counts, shared by every service and the scheduler of one coordinator.
#[derive(Debug, Clone, Default)]
pub struct Refusals(Arc<Mutex<BTreeMap<Refused, u64>>>);

/// At most this many warnings a second: a node that floods refused
/// messages must not flood the log as well; the count keeps every one.
const WARNINGS_PER_SECOND: u64 = 20;

impl Refusals {
    /// Counts one refusal and logs it, naming `sender` (a node, or
    /// `rank N` of a job) and why.
    pub fn refuse(&self, kind: Refused, sender: &str, why: &str) {
        let n = {
            let mut counts = self.0.lock().expect("refusals");
            let n = counts.entry(kind).or_default();
            *n += 1;
            *n
        };
        if n <= WARNINGS_PER_SECOND || rate_ok() {
            warn!(kind = kind.label(), sender, total = n, "refused: {why}");
        }
    }

    /// Every kind with its count, zero or not.
    pub fn counts(&self) -> Vec<(&'static str, u64)> {
        let counts = self.0.lock().expect("refusals");
        Refused::ALL
            .iter()
            .map(|k| (k.label(), counts.get(k).copied().unwrap_or(0)))
            .collect()
    }

    pub fn get(&self, kind: Refused) -> u64 {
        self.0
            .lock()
            .expect("refusals")
            .get(&kind)
            .copied()
            .unwrap_or(0)
    }
}

/// Whether another warning fits in this second's share.
fn rate_ok() -> bool {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SECOND: AtomicU64 = AtomicU64::new(0);
    static IN_SECOND: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if SECOND.swap(now, Ordering::Relaxed) != now {
        IN_SECOND.store(0, Ordering::Relaxed);
    }
    IN_SECOND.fetch_add(1, Ordering::Relaxed) < WARNINGS_PER_SECOND
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_listed_and_counted_on_its_own() {
        let r = Refusals::default();
        r.refuse(Refused::Log, "node c", "rank 0 is node a's");
        r.refuse(Refused::Log, "node c", "rank 1 is node b's");
        r.refuse(Refused::Ack, "node c", "not in the job");
        let counts = r.counts();
        assert_eq!(counts.len(), Refused::ALL.len());
        assert!(counts.contains(&("log", 2)));
        assert!(counts.contains(&("ack", 1)));
        assert!(counts.contains(&("worker_exit", 0)));
    }
}

//! `gpuctl nodes`' table, kept built beside the scheduler so that a person's
//! listing does not wait for it. At 16,384 nodes × 8 GPUs in a job, the
//! scheduler shares the fleet's thread with 16,384 sessions: a listing that
//! waited in its lane and had its table built there answered in 205 ms at
//! p99, against 69 ms for `gpuctl jobs`.
//!
//! The table is current while no node changed what it lists (a state, a
//! reason, a job, a registration, a removal): every such change counts here
//! ([`NodeListing::changed`]), from the scheduler's one thread, before the
//! change is answered, so a caller told of a change lists it. Heartbeats
//! are not counted (thousands a second); their column may lag by at most
//! [`FRESH_MS`], after which the next caller asks the scheduler again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use gpuctl_proto::pb::NodeTable;

/// How old the heartbeats a kept table shows may be.
pub const FRESH_MS: u64 = 1_000;

/// One build of the table.
struct Kept {
    /// [`NodeListing::changes`] when it was built.
    changes: u64,
    /// The scheduler's clock (Unix ms) when it was built.
    built_ms: u64,
    table: Arc<NodeTable>,
}

/// The kept table and the count of listed changes; the scheduler and its
/// handles share it.
#[derive(Default)]
pub struct NodeListing {
    changes: AtomicU64,
    kept: Mutex<Option<Kept>>,
}

impl NodeListing {
    /// A node changed what the listing shows of it: the kept table is not
    /// current any more.
    pub fn changed(&self) {
        self.changes.fetch_add(1, Ordering::AcqRel);
    }

    /// Counts a change when `listed`, as [`NodeListing::changed`].
    pub fn changed_if(&self, listed: bool) {
        if listed {
            self.changed();
        }
    }

    /// Keeps `table`, built from the nodes as they are now (by the
    /// scheduler, which alone counts changes) at `now_ms`.
    pub fn keep(&self, table: Arc<NodeTable>, now_ms: u64) {
        let changes = self.changes.load(Ordering::Acquire);
        *self.kept.lock().expect("never held across a panic") = Some(Kept {
            changes,
            built_ms: now_ms,
            table,
        });
    }

    /// The kept table, when no listed change came since its build and it is
    /// younger than [`FRESH_MS`] at `now_ms`.
    pub fn current(&self, now_ms: u64) -> Option<Arc<NodeTable>> {
        let changes = self.changes.load(Ordering::Acquire);
        let kept = self.kept.lock().expect("never held across a panic");
        kept.as_ref()
            .filter(|k| k.changes == changes && now_ms.saturating_sub(k.built_ms) < FRESH_MS)
            .map(|k| k.table.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(rows: usize) -> Arc<NodeTable> {
        Arc::new(NodeTable {
            name_len: vec![1; rows],
            ..Default::default()
        })
    }

    #[test]
    fn a_kept_table_is_current_until_a_listed_change_or_its_age() {
        let l = NodeListing::default();
        assert!(l.current(0).is_none(), "nothing built yet");
        l.keep(table(3), 10_000);
        assert_eq!(l.current(10_000).map(|t| t.len()), Some(3));
        assert!(l.current(10_000 + FRESH_MS - 1).is_some());
        assert!(l.current(10_000 + FRESH_MS).is_none(), "heartbeats too old");
        l.changed_if(false);
        assert!(l.current(10_001).is_some(), "a heartbeat alone");
        l.changed();
        assert!(l.current(10_001).is_none(), "a node changed state");
        l.keep(table(4), 10_002);
        assert_eq!(l.current(10_003).map(|t| t.len()), Some(4));
    }
}

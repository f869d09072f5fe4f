//! `gpuctl nodes`' table and `gpuctl jobs`' list, kept built beside the
//! scheduler so that a person's listing does not wait for it. At 16,384
//! nodes × 8 GPUs in a job, the scheduler shares the fleet's thread with
//! 16,384 sessions: a node listing that waited in its lane and had its
//! table built there answered in 205 ms at p99, and a job listing
//! 283-353 ms in the short jobs (each of its slowest at a job's end, the
//! task busy with 131,072 results).
//!
//! A kept listing is current while nothing it lists changed: every such
//! change counts here ([`Listing::changed`]), from the scheduler's one
//! thread, before the change is answered, so a caller told of a change
//! lists it (it finds the count moved, and asks the scheduler). What moves
//! all the time is not counted (nodes' heartbeats, a running job's count of
//! results); a kept listing shows it at most its freshness old, after which
//! the next caller asks the scheduler again.
//!
//! Both are made again by the scheduler at the end of an event that
//! changed them, and while what they list moves ([`Listing::due`]), as long
//! as someone asked for them within [`WANTED_MS`], so a caller finds them
//! current even at a job's end.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use gpuctl_proto::pb::{Job, NodeTable};

/// How a listing is kept (ms).
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    /// How old what moves uncounted in it may be when it is answered.
    pub fresh_ms: u64,
    /// How often the scheduler makes it again while part of it moves, so
    /// that it is fresh whenever the task gets to it.
    pub redo_ms: u64,
    /// Least time between two builds for listed changes: a fleet
    /// registering changes the node table a thousand times a second.
    pub gap_ms: u64,
}

/// The node table: heartbeats up to a second old; ~5 ms to build at
/// 16,384 nodes, so not more than five times a second.
pub const NODES: Pace = Pace {
    fresh_ms: 1_000,
    redo_ms: 500,
    gap_ms: 200,
};

/// The job list: counts of results up to 2 s old; a few hundred summaries,
/// made again after every change.
pub const JOBS: Pace = Pace {
    fresh_ms: 2_000,
    redo_ms: 500,
    gap_ms: 0,
};

/// A listing asked for within this long is made by the scheduler as it
/// changes; one no one reads is not.
pub const WANTED_MS: u64 = 60_000;

/// One build of a listing.
struct Kept<T> {
    /// [`Listing::changes`] when it was built.
    changes: u64,
    /// The scheduler's clock (Unix ms) when it was built.
    built_ms: u64,
    /// Whether what it lists was moving uncounted (heartbeats, a job running).
    moving: bool,
    table: Arc<T>,
}

/// A kept listing and the count of listed changes; the scheduler and its
/// handles share it.
pub struct Listing<T> {
    pace: Pace,
    changes: AtomicU64,
    /// When a caller last asked for it (the scheduler's clock).
    asked_ms: AtomicU64,
    kept: Mutex<Option<Kept<T>>>,
}

/// `gpuctl nodes`' brief table.
pub type NodeListing = Listing<NodeTable>;
/// `gpuctl jobs`' list: every kept job's summary, oldest first.
pub type JobListing = Listing<Vec<Job>>;

impl<T> Listing<T> {
    pub fn new(pace: Pace) -> Self {
        Listing {
            pace,
            changes: AtomicU64::new(0),
            asked_ms: AtomicU64::new(0),
            kept: Mutex::new(None),
        }
    }

    /// Something listed changed: the kept listing is not current any more.
    pub fn changed(&self) {
        self.changes.fetch_add(1, Ordering::AcqRel);
    }

    /// Listed changes counted so far.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Counts a change when `listed`, as [`Listing::changed`].
    pub fn changed_if(&self, listed: bool) {
        if listed {
            self.changed();
        }
    }

    /// Keeps `table`, built from what is listed as it is now (by the
    /// scheduler, which alone counts changes) at `now_ms`; `moving`: part
    /// of it moves uncounted.
    pub fn keep(&self, table: Arc<T>, now_ms: u64, moving: bool) {
        let changes = self.changes.load(Ordering::Acquire);
        *self.kept.lock().unwrap_or_else(|e| e.into_inner()) = Some(Kept {
            changes,
            built_ms: now_ms,
            moving,
            table,
        });
    }

    /// The kept listing for a caller at `now_ms`, when no listed change came
    /// since its build and, if part of it moves, it is fresh.
    pub fn current(&self, now_ms: u64) -> Option<Arc<T>> {
        self.asked_ms.fetch_max(now_ms, Ordering::AcqRel);
        let changes = self.changes.load(Ordering::Acquire);
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.as_ref()
            .filter(|k| k.changes == changes)
            .filter(|k| !k.moving || now_ms.saturating_sub(k.built_ms) < self.pace.fresh_ms)
            .map(|k| k.table.clone())
    }

    /// Whether the scheduler should make it again at `now_ms`: someone
    /// reads it, and none is kept, or a listed change came (and the last
    /// build is [`Pace::gap_ms`] old), or its moving part is
    /// [`Pace::redo_ms`] old.
    pub fn due(&self, now_ms: u64) -> bool {
        let asked = self.asked_ms.load(Ordering::Acquire);
        if asked == 0 || now_ms.saturating_sub(asked) >= WANTED_MS {
            return false;
        }
        let changes = self.changes.load(Ordering::Acquire);
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.as_ref().is_none_or(|k| {
            let age = now_ms.saturating_sub(k.built_ms);
            (k.changes != changes && age >= self.pace.gap_ms)
                || (k.moving && age >= self.pace.redo_ms)
        })
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
        let l = NodeListing::new(NODES);
        assert!(l.current(10_000).is_none(), "nothing built yet");
        l.keep(table(3), 10_000, true);
        assert_eq!(l.current(10_000).map(|t| t.len()), Some(3));
        assert!(l.current(10_000 + NODES.fresh_ms - 1).is_some());
        assert!(
            l.current(10_000 + NODES.fresh_ms).is_none(),
            "heartbeats too old"
        );
        l.changed_if(false);
        assert!(l.current(10_001).is_some(), "a heartbeat alone");
        l.changed();
        assert!(l.current(10_001).is_none(), "a node changed state");
        l.keep(table(4), 10_002, true);
        assert_eq!(l.current(10_003).map(|t| t.len()), Some(4));
    }

    #[test]
    fn a_listing_is_due_once_read_and_changed_or_its_moving_part_aged() {
        let l = JobListing::new(JOBS);
        assert!(!l.due(1_000), "no one asked");
        assert!(l.current(1_000).is_none());
        assert!(l.due(1_000), "asked, none kept");
        l.keep(Arc::new(Vec::new()), 1_000, false);
        assert!(!l.due(50_000), "nothing moves in it");
        assert!(l.current(50_000).is_some(), "nor ages");
        l.changed();
        assert!(l.due(50_000), "a job changed");
        l.keep(Arc::new(Vec::new()), 50_000, true);
        assert!(!l.due(50_000 + JOBS.redo_ms - 1));
        assert!(l.due(50_000 + JOBS.redo_ms), "a job ran on");
        assert!(!l.due(50_000 + WANTED_MS), "no one asked for a minute");
    }

    #[test]
    fn a_change_is_built_no_sooner_than_the_gap_after_the_last_build() {
        let l = NodeListing::new(NODES);
        l.current(1_000);
        l.keep(table(1), 1_000, true);
        l.changed();
        assert!(!l.due(1_000 + NODES.gap_ms - 1), "a registration storm");
        assert!(l.due(1_000 + NODES.gap_ms));
    }
}

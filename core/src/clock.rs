//! The one source of wall-clock time (Unix ms) of every gpuctl process.
//! Everything that decides by time (the coordinator's lost nodes, hang
//! clocks, deadlines, late results, retention; an agent's or worker's
//! deadlines; the ages a CLI table shows) reads it here, so that a test can
//! hold time still and move it on by hand instead of sleeping past a
//! timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The system clock in production; a [`Clock::manual`] one in tests. Cheap
/// to clone: clones of a manual clock share its time.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    /// None: the system clock.
    manual: Option<Arc<AtomicU64>>,
}

impl Clock {
    pub fn system() -> Clock {
        Clock::default()
    }

    /// A clock that stands at `unix_ms` until [`Clock::advance`] or
    /// [`Clock::set`] moves it.
    pub fn manual(unix_ms: u64) -> Clock {
        Clock {
            manual: Some(Arc::new(AtomicU64::new(unix_ms))),
        }
    }

    /// Now, in Unix ms.
    pub fn now_ms(&self) -> u64 {
        match &self.manual {
            Some(t) => t.load(Ordering::SeqCst),
            None => crate::now_ms(),
        }
    }

    /// Moves a manual clock on; the system clock cannot be moved, so a
    /// test that forgot to make its clock manual fails here, loudly.
    pub fn advance(&self, by: Duration) {
        let t = self.manual.as_ref().expect("only a manual clock moves");
        t.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }

    /// Sets a manual clock to `unix_ms`.
    pub fn set(&self, unix_ms: u64) {
        let t = self.manual.as_ref().expect("only a manual clock moves");
        t.store(unix_ms, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told_and_its_clones_follow() {
        let clock = Clock::manual(1_000);
        let seen_by_other = clock.clone();
        assert_eq!(clock.now_ms(), 1_000);
        clock.advance(Duration::from_millis(250));
        assert_eq!(seen_by_other.now_ms(), 1_250);
        seen_by_other.set(5);
        assert_eq!(clock.now_ms(), 5);
        let system = Clock::system().now_ms();
        assert!(system > 1_600_000_000_000, "the system clock is wall time");
    }
}

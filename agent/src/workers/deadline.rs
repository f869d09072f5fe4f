//! Turns an assignment's deadline (wall-clock Unix ms, as the coordinator
//! sets it) into the monotonic instant a supervisor sleeps until.
//!
//! Its own file because it is the one place the workers read the time of
//! day: it takes the manager's `Clock`, so a test can hold that time still
//! instead of sleeping past a real deadline.

use std::time::Duration;

use gpuctl_core::clock::Clock;
use tokio::time::Instant;

/// `None` for no deadline (0). The wall clock is read once, at start: a
/// clock stepped later does not move a running job's deadline.
pub(super) fn deadline_instant(clock: &Clock, deadline_unix_ms: u64) -> Option<Instant> {
    if deadline_unix_ms == 0 {
        return None;
    }
    let left = deadline_unix_ms.saturating_sub(clock.now_ms());
    Some(Instant::now() + Duration::from_millis(left))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_counts_from_the_clock_it_is_given() {
        let clock = Clock::manual(1_000_000);
        assert_eq!(deadline_instant(&clock, 0), None);
        let before = Instant::now();
        let at = deadline_instant(&clock, 1_000_000 + 60_000).unwrap();
        let left = at - before;
        assert!(
            left >= Duration::from_secs(60) && left < Duration::from_secs(61),
            "{left:?}"
        );
        // A deadline already behind the clock is now.
        clock.advance(Duration::from_secs(120));
        let past = deadline_instant(&clock, 1_000_000 + 60_000).unwrap();
        assert!(past <= Instant::now());
    }
}

//! How long the coordinator could not hear its ranks. A rank's silence is
//! evidence of a hang only while its reports could have been read: when
//! they wait seconds for the scheduler (a loaded coordinator at 131,072
//! ranks, a job's end with every result in flight), a rank whose report is
//! still in line is not silent, it is unheard, and what cannot be read is
//! unknown, never a failure. [`Hearing`] keeps the spans during which rank
//! reports waited, and turns a wall time into a *heard* time that stands
//! still during them; the hang rule ([`super::hang`]) counts silence on it.

use std::collections::VecDeque;

/// A report read this long after it arrived waited for the scheduler:
/// reports on time are read within milliseconds, and ranks report about
/// once a second.
pub const LATE_MS: u64 = 2_000;

/// Spans kept; an older one is forgotten, and time before the oldest kept
/// counts as heard only as far as it must ([`Hearing::deaf_before`]).
const KEPT: usize = 1_024;

/// A span (ms) during which reports waited, and the deaf time before it.
#[derive(Debug, Clone, Copy)]
struct Span {
    from: u64,
    until: u64,
    before: u64,
}

/// The spans, in order and apart, during which rank reports waited at
/// least [`LATE_MS`] for the scheduler.
#[derive(Debug, Default, Clone)]
pub struct Hearing {
    spans: VecDeque<Span>,
    /// The last report read was late: the lane is taken to lag still, so
    /// the time since it was read counts as deaf until a report on time
    /// says otherwise.
    lagging: bool,
    /// When a lag's start was last told ([`Hearing::read`]).
    told_ms: Option<u64>,
}

/// A lag's start is told at most this often: at 131,072 ranks reports
/// can swing between late and on time many times a second.
const TELL_EVERY_MS: u64 = 60_000;

impl Hearing {
    /// A rank report that arrived at `arrived_ms` was read at `read_ms`;
    /// how long it waited when that starts a lag worth a line in the log.
    pub fn read(&mut self, arrived_ms: u64, read_ms: u64) -> Option<u64> {
        let waited = read_ms.saturating_sub(arrived_ms);
        let began = waited >= LATE_MS && !self.lagging;
        self.lagging = waited >= LATE_MS;
        if !self.lagging {
            return None;
        }
        match self.spans.back_mut() {
            // Reports are read in about the order they arrived: one that
            // arrived inside the last span extends it.
            Some(last) if arrived_ms <= last.until => last.until = last.until.max(read_ms),
            last => {
                let before = last.map_or(0, |s| s.before + (s.until - s.from));
                if self.spans.len() == KEPT {
                    self.spans.pop_front();
                }
                self.spans.push_back(Span {
                    from: arrived_ms,
                    until: read_ms,
                    before,
                });
            }
        }
        let tell = began && self.told_ms.is_none_or(|t| read_ms >= t + TELL_EVERY_MS);
        tell.then(|| {
            self.told_ms = Some(read_ms);
            waited
        })
    }

    /// Deaf time (ms) before `t`, at `now_ms` (a lane still lagging is deaf
    /// since its last late report was read).
    fn deaf_before(&self, t: u64, now_ms: u64) -> u64 {
        if self.spans.is_empty() {
            return 0;
        }
        let i = self.spans.partition_point(|s| s.from <= t);
        let Some(s) = i.checked_sub(1).map(|i| self.spans[i]) else {
            // Before the oldest span kept: as little as the oldest allows,
            // which counts the forgotten time as deaf rather than silent.
            let first = self.spans[0];
            return first.before.saturating_sub(first.from - t);
        };
        let mut deaf = s.before + t.min(s.until) - s.from;
        // Past the newest span while still lagging: deaf since it.
        if self.lagging && i == self.spans.len() && t > s.until {
            deaf += t.min(now_ms).saturating_sub(s.until);
        }
        deaf
    }

    /// `t` (wall ms; a later one is taken as `now_ms`) on the heard clock:
    /// wall time less the deaf time before it. A rank's silence is the
    /// heard time between its last progress and now.
    pub fn heard(&self, t: u64, now_ms: u64) -> u64 {
        let t = t.min(now_ms);
        t - self.deaf_before(t, now_ms)
    }

    /// Deaf time (ms) between `from` and `now_ms`: what a hang's message
    /// says was not counted.
    pub fn deaf_between(&self, from: u64, now_ms: u64) -> u64 {
        let from = from.min(now_ms);
        self.deaf_before(now_ms, now_ms) - self.deaf_before(from, now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_on_time_leave_the_heard_clock_at_the_wall_clock() {
        let mut h = Hearing::default();
        for t in (0..100_000).step_by(1_000) {
            h.read(t, t + LATE_MS - 1);
        }
        assert_eq!(h.heard(50_000, 100_000), 50_000);
        assert_eq!(h.heard(100_000, 100_000), 100_000);
        assert_eq!(h.deaf_between(0, 100_000), 0);
    }

    #[test]
    fn time_reports_waited_does_not_count_and_overlapping_waits_count_once() {
        let mut h = Hearing::default();
        h.read(10_000, 10_010);
        // Two reports in line together: 20-50 s and 30-55 s waited.
        h.read(20_000, 50_000);
        h.read(30_000, 55_000);
        // On time again.
        h.read(60_000, 60_001);
        h.read(70_000, 73_000);
        h.read(80_000, 80_001);
        assert_eq!(h.deaf_between(0, 100_000), 35_000 + 3_000);
        assert_eq!(h.heard(15_000, 100_000), 15_000);
        assert_eq!(h.heard(40_000, 100_000), 20_000);
        assert_eq!(h.heard(60_000, 100_000), 25_000);
        assert_eq!(h.heard(100_000, 100_000), 100_000 - 38_000);
        // Silence of a rank last heard at 15 s: 85 s of wall time, 47 s heard.
        assert_eq!(h.heard(100_000, 100_000) - h.heard(15_000, 100_000), 47_000);
    }

    #[test]
    fn a_lane_still_lagging_is_deaf_until_a_report_comes_on_time() {
        let mut h = Hearing::default();
        assert_eq!(h.read(0, 30_000), Some(30_000));
        assert_eq!(h.read(1_000, 30_000), None, "told once");
        // Nothing read since: the lane may still hold every report.
        assert_eq!(h.deaf_between(0, 90_000), 90_000);
        assert_eq!(h.heard(90_000, 90_000), 0);
        h.read(89_000, 89_100);
        assert_eq!(h.deaf_between(0, 90_000), 30_000);
        assert_eq!(h.heard(90_000, 90_000), 60_000);
        // Lags that start again are told once a minute at most.
        assert_eq!(h.read(89_500, 92_000), Some(2_500));
        assert_eq!(h.read(100_000, 100_001), None);
        assert_eq!(h.read(100_000, 102_000), None, "told 10 s ago");
        assert_eq!(h.read(150_000, 150_001), None);
        assert_eq!(h.read(160_000, 162_000), Some(2_000));
    }

    #[test]
    fn the_heard_clock_never_runs_backwards() {
        let mut h = Hearing::default();
        // The last report (4,000 s) is on time.
        for i in 0..=4_000u64 {
            let t = i * 1_000;
            h.read(t, t + if i % 3 == 0 { 2_500 } else { 10 });
        }
        assert_eq!(h.spans.len(), KEPT);
        let now = 4_000_000;
        let mut last = 0;
        for t in (0..=now).step_by(250) {
            let heard = h.heard(t, now);
            assert!(heard >= last, "heard({t}) = {heard} < {last}");
            last = heard;
        }
        // 333 whole waits of 2.5 s from 3,000 s, and 1 s of the one at 3,999 s.
        assert_eq!(h.deaf_between(3_000_000, now), 333 * 2_500 + 1_000);
    }
}

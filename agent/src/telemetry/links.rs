//! What one GPU's NVLinks did across readings. NVML answers link by link, and
//! a call can fail for one link in one reading while the others answer; a
//! reading alone cannot tell "down" from "not read". This keeps, per GPU,
//! which links have answered and which were ever active, and each link's
//! last counters, so that a sample says: links active, links down (seen
//! active, now answering inactive), links unknown (known, not read now), and
//! counters that grow only by each link's own growth between two reads.

use super::nvml::{LinkReading, NvLinks, NVLINK_MAX_LINKS};
use super::GpuReading;

const LINKS: usize = NVLINK_MAX_LINKS as usize;

/// One GPU's links since the agent started.
#[derive(Debug, Default)]
pub struct LinkHistory {
    /// Bit per link: answered at least once / answered active at least once.
    known: u32,
    ever_active: u32,
    /// Each link's counters at its last successful read of each.
    last: [LinkReading; LINKS],
    totals: Totals,
    /// State reads that failed on known links (for the log's back-off).
    failed_reads: u64,
}

/// Counter growth summed over links; `None` until some link's counter was
/// read twice.
#[derive(Debug, Default, Clone, Copy)]
struct Totals {
    crc_flit: Option<u64>,
    crc_data: Option<u64>,
    replay: Option<u64>,
    recovery: Option<u64>,
}

/// `total` grown by the change from `before` to `now` of one link's counter.
/// A counter that went backwards (the driver reset it) starts over from its
/// new value; a read that failed adds nothing and keeps the old base.
fn grow(total: &mut Option<u64>, before: &mut Option<u64>, now: Option<u64>) {
    let Some(now) = now else {
        return;
    };
    if let Some(b) = *before {
        let add = now.saturating_sub(b);
        *total = Some(total.unwrap_or(0).saturating_add(add));
    } else if total.is_none() {
        *total = Some(0);
    }
    *before = Some(now);
}

impl LinkHistory {
    /// Fills `r`'s link counts and counters from its raw `nvlinks`.
    pub fn apply(&mut self, r: &mut GpuReading) {
        let Some(links) = r.nvlinks.take() else {
            return;
        };
        self.update(&links, r);
        if !links.errors.is_empty() {
            self.failed_reads += links.errors.len() as u64;
            // The first failure, then every power of two: seen, not a flood.
            if self.failed_reads.is_power_of_two() {
                tracing::warn!(
                    gpu = r.index,
                    failed_reads = self.failed_reads,
                    first = ?links.errors.first(),
                    "NVLink state could not be read for {} link(s) in this sample; counted as unknown, not down",
                    links.errors.len()
                );
            }
        }
        r.nvlinks = Some(links);
    }

    fn update(&mut self, links: &NvLinks, r: &mut GpuReading) {
        let (mut active, mut down, mut unknown) = (0, 0, 0);
        for (l, now) in links.links.iter().enumerate() {
            let bit = 1u32 << l;
            match now.active {
                Some(true) => {
                    self.known |= bit;
                    self.ever_active |= bit;
                    active += 1;
                }
                Some(false) => {
                    self.known |= bit;
                    if self.ever_active & bit != 0 {
                        down += 1;
                    }
                }
                None if self.known & bit != 0 => unknown += 1,
                None => {}
            }
            let last = &mut self.last[l];
            let t = &mut self.totals;
            grow(&mut t.crc_flit, &mut last.crc_flit, now.crc_flit);
            grow(&mut t.crc_data, &mut last.crc_data, now.crc_data);
            grow(&mut t.replay, &mut last.replay, now.replay);
            grow(&mut t.recovery, &mut last.recovery, now.recovery);
        }
        r.nvlinks_active = active;
        r.nvlinks_down = down;
        r.nvlinks_unknown = unknown;
        r.nvlinks_expected = self.known.count_ones();
        r.nvlink_crc_flit = self.totals.crc_flit;
        r.nvlink_crc_data = self.totals.crc_data;
        r.nvlink_replay = self.totals.replay;
        r.nvlink_recovery = self.totals.recovery;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(states: &[Option<bool>], flit: &[Option<u64>]) -> GpuReading {
        let mut n = NvLinks::default();
        for (l, s) in states.iter().enumerate() {
            n.links[l].active = *s;
            n.links[l].crc_flit = flit.get(l).copied().flatten();
            if s.is_none() {
                n.errors.push((l as u32, "Unknown".into()));
            }
        }
        GpuReading {
            nvlinks: Some(n),
            ..Default::default()
        }
    }

    fn apply(h: &mut LinkHistory, r: GpuReading) -> GpuReading {
        let mut r = r;
        h.apply(&mut r);
        r
    }

    #[test]
    fn a_failed_read_is_unknown_never_down() {
        let mut h = LinkHistory::default();
        let all = [Some(true); 18];
        let r = apply(&mut h, reading(&all, &[]));
        assert_eq!((r.nvlinks_active, r.nvlinks_expected), (18, 18));
        // 15 of 18 reads fail: 3 answer, none is down.
        let mut partial = [None; 18];
        partial[..3].copy_from_slice(&[Some(true); 3]);
        let r = apply(&mut h, reading(&partial, &[]));
        assert_eq!(
            (
                r.nvlinks_active,
                r.nvlinks_down,
                r.nvlinks_unknown,
                r.nvlinks_expected
            ),
            (3, 0, 15, 18)
        );
        // A link that answers inactive after being active is down.
        let mut one_down = all;
        one_down[7] = Some(false);
        let r = apply(&mut h, reading(&one_down, &[]));
        assert_eq!(
            (r.nvlinks_active, r.nvlinks_down, r.nvlinks_unknown),
            (17, 1, 0)
        );
    }

    #[test]
    fn a_link_inactive_from_the_start_is_not_down() {
        let mut h = LinkHistory::default();
        let mut s = [Some(true); 18];
        s[17] = Some(false);
        for _ in 0..3 {
            let r = apply(&mut h, reading(&s, &[]));
            assert_eq!(
                (r.nvlinks_active, r.nvlinks_down, r.nvlinks_expected),
                (17, 0, 18)
            );
        }
    }

    #[test]
    fn counters_grow_link_by_link_whatever_is_read() {
        let mut h = LinkHistory::default();
        let on = [Some(true); 2];
        let r = apply(&mut h, reading(&on, &[Some(100), Some(5000)]));
        assert_eq!(r.nvlink_crc_flit, Some(0), "a first read is the base");
        // Link 1 not read: nothing added for it, not a drop of 5000.
        let r = apply(&mut h, reading(&on, &[Some(103), None]));
        assert_eq!(r.nvlink_crc_flit, Some(3));
        // Link 1 back: its growth since its own last read.
        let r = apply(&mut h, reading(&on, &[Some(103), Some(5010)]));
        assert_eq!(r.nvlink_crc_flit, Some(13));
        // A counter reset (driver reload) starts over instead of wrapping.
        let r = apply(&mut h, reading(&on, &[Some(2), Some(5011)]));
        assert_eq!(r.nvlink_crc_flit, Some(14));
        assert_eq!(r.nvlink_replay, None, "never read");
    }
}

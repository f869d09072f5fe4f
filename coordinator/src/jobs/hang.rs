//! Hung ranks. A running rank counts units of work (`RankProgress.iterations`);
//! one whose count has not grown for the job's hang timeout fails the job.
//! [`find`] names the rank to blame: one whose process its agent reads as
//! stopped, traced, a zombie or in uninterruptible sleep (the others only wait
//! on it), else the rank whose progress stopped first. The report then fails
//! that rank alone, and shows where every rank was. When
//! every rank stopped at once and no process says why, they all wait on one
//! another (a transfer too slow to finish, a peer outside the job): the job
//! fails as hung and no rank is blamed. A rank that says it waits for others
//! (at the rendezvous, a round's barrier while other pairs measure; in a
//! collective, for a slower peer) is never blamed, nor hung while a rank it
//! may wait for still progresses; when every rank waits and none progresses,
//! the job hung and no rank is blamed. Silence is counted on the heard
//! clock ([`super::hearing`]): time during which rank reports waited for the
//! coordinator is not a rank's silence.

use std::collections::BTreeMap;

use gpuctl_proto::pb::RankProcess;

use super::hearing::Hearing;

/// What the coordinator follows of a running job's ranks, besides their last
/// progress report.
#[derive(Debug, Clone, Default)]
pub struct Watch {
    /// When the coordinator began to watch the job (ms): the clock of a rank
    /// that never made progress starts here.
    pub since_ms: u64,
    /// Rank → when its iteration count last grew (ms).
    pub grew_ms: BTreeMap<u32, u64>,
    /// Rank → its worker process as its agent last read it.
    pub processes: BTreeMap<u32, RankProcess>,
    /// Set when the job failed because this rank hung.
    pub hung: Option<Hung>,
}

impl Watch {
    /// Notes a progress report: the rank progressed when its count grew.
    pub fn progress(&mut self, rank: u32, before: u64, now: u64, now_ms: u64) {
        if now > before {
            self.grew_ms.insert(rank, now_ms);
        }
    }

    /// When the rank last progressed (the watch's start if it never did).
    pub fn last_growth(&self, rank: u32) -> u64 {
        self.grew_ms.get(&rank).copied().unwrap_or(self.since_ms)
    }

    /// Whether any of `ranks` ranks (numbered from 0) may have gone
    /// `timeout_ms` heard (`hearing`) without progress; false only when
    /// none can have. It looks at no rank when the watch began less than a
    /// timeout ago, and at the clocks alone when every rank has one, so
    /// that the scan that names a culprit ([`find`]) runs only when one may
    /// exist: at 32,768 ranks it held the scheduler 15-35 ms on every tick.
    pub fn may_have_hung(
        &self,
        ranks: u32,
        hearing: &Hearing,
        now_ms: u64,
        timeout_ms: u64,
    ) -> bool {
        let heard_now = hearing.heard(now_ms, now_ms);
        let silent = |since: u64| heard_now - hearing.heard(since, now_ms);
        if silent(self.since_ms) < timeout_ms {
            return false;
        }
        let (grew, oldest) = self
            .grew_ms
            .range(..ranks)
            .fold((0usize, u64::MAX), |(n, oldest), (_, ms)| {
                (n + 1, oldest.min(*ms))
            });
        grew < ranks as usize || silent(oldest) >= timeout_ms
    }
}

/// The rank blamed for a hang (`None`: every rank waits on the others).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hung {
    pub rank: Option<u32>,
    pub node: String,
    /// Why this rank, for its row of the report.
    pub why: String,
    /// The job's failure message.
    pub message: String,
}

/// A rank still expected to make progress (no result, worker not exited).
#[derive(Debug, Clone)]
pub struct RankClock<'a> {
    pub rank: u32,
    pub node: &'a str,
    /// On the heard clock ([`Hearing::heard`]), as `find`'s `now_ms` is.
    pub last_growth_ms: u64,
    pub process: Option<&'a RankProcess>,
    /// Its last report said it waits at the rendezvous for another rank.
    pub waiting: bool,
}

/// What a process state says about a rank that made no progress, most
/// telling first; `None` for states that only wait (sleeping, running).
fn state_blame(state: &str) -> Option<(u8, &'static str)> {
    Some(match state {
        "T" => (0, "its process is stopped (SIGSTOP?)"),
        "t" => (0, "its process is being traced (a debugger?)"),
        "D" => (
            1,
            "its process is in uninterruptible sleep (stuck in the kernel: a driver or I/O call)",
        ),
        "Z" => (2, "its process is a zombie (it exited but was not reaped)"),
        _ => return None,
    })
}

/// A rank that progressed this recently still makes progress (ranks report
/// about once a second); one quiet for longer is taken as blocked.
const RECENT_MS: u64 = 5_000;

/// Ranks whose last progress lies within this of one another stopped
/// together: none of them is behind the others (ranks report progress about
/// once a second).
const TOGETHER_MS: u64 = 3_000;

fn secs(ms: u64) -> String {
    format!("{}s", (ms + 500) / 1000)
}

/// The hung rank of a job, if some rank of `ranks` has made no progress for
/// `timeout_ms` at `now_ms`.
pub fn find(ranks: &[RankClock], now_ms: u64, timeout_ms: u64) -> Option<Hung> {
    let age = |c: &RankClock| now_ms.saturating_sub(c.last_growth_ms);
    let stalled: Vec<&RankClock> = ranks.iter().filter(|c| age(c) >= timeout_ms).collect();
    if stalled.is_empty() {
        return None;
    }
    let by_state = stalled
        .iter()
        .filter_map(|c| {
            let (order, text) = state_blame(&c.process?.state)?;
            Some((order, c.last_growth_ms, c.rank, *c, text))
        })
        .min_by_key(|(order, grew, rank, _, _)| (*order, *grew, *rank));
    // A rank waiting at the rendezvous for another is never the culprit: the
    // rank it waits for is, or nobody while that one still progresses.
    let stalled: Vec<&RankClock> = if by_state.is_some() {
        stalled
    } else {
        stalled.into_iter().filter(|c| !c.waiting).collect()
    };
    if stalled.is_empty() {
        // Every rank waits on another and none moves: nobody is left to
        // blame, but waiting on the deadline would hide the hang.
        let waited = ranks.iter().map(age).min().unwrap_or(0);
        if !ranks.is_empty() && ranks.iter().all(|c| c.waiting) && waited >= timeout_ms {
            let message = format!(
                "every rank ({}) waits on another (at the rendezvous or in a collective) and none made progress for {}: no rank is blamed",
                ranks.len(),
                secs(waited)
            );
            return Some(Hung {
                rank: None,
                node: String::new(),
                why: format!("hung: {message}"),
                message: format!("the job hung: {message}"),
            });
        }
        return None;
    }
    let working = ranks.iter().filter(|c| !c.waiting).count();
    if by_state.is_none() && stalled.len() == working && working > 1 {
        let first = stalled.iter().map(|c| c.last_growth_ms).min().unwrap_or(0);
        let last = stalled.iter().map(|c| c.last_growth_ms).max().unwrap_or(0);
        if last - first <= TOGETHER_MS {
            let message = format!(
                "every rank ({}) stopped within {} of the others {} ago, and no process is stopped or stuck in the kernel: they wait on one another (a transfer too slow to finish, or a peer outside the job); no rank is blamed",
                ranks.len(),
                secs(last - first),
                secs(now_ms.saturating_sub(last))
            );
            return Some(Hung {
                rank: None,
                node: String::new(),
                why: format!("hung: {message}"),
                message: format!("the job hung: {message}"),
            });
        }
    }
    let (culprit, because) = match by_state {
        Some((_, _, _, c, text)) => (c, text.to_string()),
        None => {
            let c = stalled
                .iter()
                .min_by_key(|c| (c.last_growth_ms, c.rank))
                .copied()
                .expect("stalled is not empty");
            let because = if stalled.len() > 1 {
                "its progress stopped first and no process is stopped or stuck in the kernel"
            } else {
                "no process is stopped or stuck in the kernel"
            };
            (c, because.to_string())
        }
    };
    let why = format!("no progress for {}, {because}", secs(age(culprit)));
    // The others stopped a little after the culprit (once they needed it), so
    // they are judged on a shorter window than the timeout.
    let others = ranks.len() - 1;
    let others_stalled = ranks
        .iter()
        .filter(|c| c.rank != culprit.rank && age(c) >= RECENT_MS.min(timeout_ms))
        .count();
    let rest = if others == 0 {
        String::new()
    } else if others_stalled == others {
        let word = if others == 1 { "rank is" } else { "ranks are" };
        format!("; the other {others} {word} blocked waiting on it")
    } else if others_stalled == 0 {
        let word = if others == 1 {
            "rank still makes"
        } else {
            "ranks still make"
        };
        format!("; the other {others} {word} progress")
    } else {
        format!(
            "; {others_stalled} of the other {others} ranks made no progress in the last {} either",
            secs(RECENT_MS.min(timeout_ms))
        )
    };
    Some(Hung {
        rank: Some(culprit.rank),
        node: culprit.node.to_string(),
        message: format!(
            "rank {} on {} hung: {why}{rest}",
            culprit.rank, culprit.node
        ),
        why: format!("hung: {why}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc(rank: u32, state: &str) -> RankProcess {
        RankProcess {
            rank,
            pid: 100 + rank,
            state: state.into(),
            state_name: String::new(),
            cpu_ms: 0,
        }
    }

    fn clock<'a>(rank: u32, grew: u64, p: Option<&'a RankProcess>) -> RankClock<'a> {
        RankClock {
            rank,
            node: if rank < 2 { "node-a" } else { "node-b" },
            last_growth_ms: grew,
            process: p,
            waiting: false,
        }
    }

    fn waiting(rank: u32, grew: u64) -> RankClock<'static> {
        RankClock {
            waiting: true,
            ..clock(rank, grew, None)
        }
    }

    /// Issue 36: in a pairs round, the ranks of the other pairs waited at
    /// the round's barrier while one slow pair measured; the first of them
    /// to arrive was blamed as hung.
    #[test]
    fn a_rank_waiting_for_another_is_never_blamed() {
        // Ranks 0 and 1 wait at the barrier; 2 and 3 still measure.
        let ranks = [
            waiting(0, 1_000),
            waiting(1, 1_200),
            clock(2, 59_000, None),
            clock(3, 59_500, None),
        ];
        assert_eq!(find(&ranks, 60_000, 30_000), None);
        // The measuring pair stalls: one of it is blamed, never a waiter.
        let ranks = [
            waiting(0, 1_000),
            waiting(1, 1_200),
            clock(2, 20_000, None),
            clock(3, 25_000, None),
        ];
        assert_eq!(find(&ranks, 60_000, 30_000).unwrap().rank, Some(2));
        // The two stalled together: the job hung, nobody is blamed.
        let ranks = [
            waiting(0, 1_000),
            clock(2, 20_000, None),
            clock(3, 20_500, None),
        ];
        assert_eq!(find(&ranks, 60_000, 30_000).unwrap().rank, None);
        // Everyone waits and nobody moves: the job hung, nobody is blamed.
        let h = find(&[waiting(0, 1), waiting(1, 2)], 60_000, 30_000).unwrap();
        assert_eq!((h.rank, h.node.as_str()), (None, ""));
        assert!(h.message.contains("every rank (2) waits"), "{}", h.message);
        // ... but not while one of them still moves.
        assert_eq!(
            find(&[waiting(0, 1), waiting(1, 59_000)], 60_000, 30_000),
            None
        );
        // A stopped process is blamed even while it said it waits.
        let t = proc(1, "T");
        let ranks = [
            waiting(0, 1_000),
            RankClock {
                waiting: true,
                ..clock(1, 1_000, Some(&t))
            },
        ];
        assert_eq!(find(&ranks, 60_000, 30_000).unwrap().rank, Some(1));
    }

    /// A full CI run (2026-11-30): healthy ranks blocked in a collective on
    /// a throttled peer that still progressed; the first to block was
    /// blamed as hung. Marked waiting, they are looked past.
    #[test]
    fn ranks_blocked_in_a_collective_on_a_slow_peer_are_not_blamed() {
        let ranks = [
            waiting(0, 1_000),
            waiting(1, 1_000),
            clock(2, 150_000, None),
        ];
        assert_eq!(find(&ranks, 200_000, 120_000), None);
        // The slow peer stops too: it is the one blamed.
        let ranks = [waiting(0, 1_000), waiting(1, 1_000), clock(2, 5_000, None)];
        let h = find(&ranks, 200_000, 120_000).unwrap();
        assert_eq!(h.rank, Some(2));
        assert!(
            h.message
                .ends_with("the other 2 ranks are blocked waiting on it"),
            "{}",
            h.message
        );
    }

    #[test]
    fn a_hang_is_looked_for_only_once_one_may_exist() {
        let heard = Hearing::default();
        let mut w = Watch {
            since_ms: 10_000,
            ..Default::default()
        };
        // Within a timeout of the watch's start nothing can have hung.
        assert!(!w.may_have_hung(2, &heard, 39_999, 30_000));
        // Past it, a rank that never progressed may have.
        w.progress(0, 0, 1, 20_000);
        assert!(w.may_have_hung(2, &heard, 40_000, 30_000));
        // Both progressed lately: none can have.
        w.progress(1, 0, 1, 25_000);
        assert!(!w.may_have_hung(2, &heard, 49_999, 30_000));
        // Rank 0's last growth is a timeout old.
        assert!(w.may_have_hung(2, &heard, 50_000, 30_000));
        // Reports waited 30-45 s for the scheduler: those 15 s are not
        // silence, so rank 0 has been heard silent 15 s of its 30.
        let mut late = Hearing::default();
        late.read(30_000, 45_000);
        late.read(46_000, 46_001);
        assert!(!w.may_have_hung(2, &late, 50_000, 30_000));
        assert!(!w.may_have_hung(2, &late, 64_999, 30_000));
        assert!(w.may_have_hung(2, &late, 65_000, 30_000));
        // A rank outside the job does not stand in for one inside it.
        let mut w = Watch::default();
        w.progress(0, 0, 1, 100_000);
        w.progress(7, 0, 1, 100_000);
        assert!(w.may_have_hung(2, &heard, 100_000, 30_000));
    }

    #[test]
    fn nothing_hangs_before_the_timeout() {
        let s = proc(0, "S");
        let ranks = [clock(0, 1_000, Some(&s)), clock(1, 5_000, None)];
        assert_eq!(find(&ranks, 30_999, 30_000), None);
        assert!(find(&ranks, 31_000, 30_000).is_some());
        assert_eq!(find(&[], 1_000_000, 30_000), None);
    }

    #[test]
    fn a_stopped_process_is_blamed_over_the_oldest_progress() {
        let (s, t) = (proc(0, "S"), proc(3, "T"));
        // Rank 0 stopped progressing first (blocked early), rank 3 is stopped.
        let ranks = [
            clock(0, 1_000, Some(&s)),
            clock(1, 2_000, None),
            clock(2, 2_000, None),
            clock(3, 3_000, Some(&t)),
        ];
        let h = find(&ranks, 60_000, 30_000).unwrap();
        assert_eq!((h.rank, h.node.as_str()), (Some(3), "node-b"));
        assert_eq!(
            h.message,
            "rank 3 on node-b hung: no progress for 57s, its process is stopped (SIGSTOP?); \
             the other 3 ranks are blocked waiting on it"
        );
        assert!(h.why.starts_with("hung: no progress for 57s"), "{}", h.why);
    }

    #[test]
    fn a_stopped_rank_beats_an_uninterruptible_one_which_beats_a_zombie() {
        let (z, d, t) = (proc(0, "Z"), proc(1, "D"), proc(2, "t"));
        let all = [
            clock(0, 1_000, Some(&z)),
            clock(1, 1_000, Some(&d)),
            clock(2, 9_000, Some(&t)),
        ];
        assert_eq!(find(&all, 60_000, 30_000).unwrap().rank, Some(2));
        assert!(find(&all, 60_000, 30_000).unwrap().why.contains("traced"));
        assert_eq!(find(&all[..2], 60_000, 30_000).unwrap().rank, Some(1));
        assert!(find(&all[..1], 60_000, 30_000)
            .unwrap()
            .why
            .contains("zombie"));
    }

    #[test]
    fn a_stopped_process_that_still_progressed_lately_is_not_blamed() {
        // Only stalled ranks are suspects: rank 1 was read as stopped, but it
        // progressed 1 s ago (a debugger's breakpoint, say), so rank 0 is it.
        let (s, t) = (proc(0, "S"), proc(1, "T"));
        let ranks = [clock(0, 1_000, Some(&s)), clock(1, 59_000, Some(&t))];
        let h = find(&ranks, 60_000, 30_000).unwrap();
        assert_eq!(h.rank, Some(0));
        assert!(
            h.message.ends_with("the other 1 rank still makes progress"),
            "{}",
            h.message
        );
    }

    #[test]
    fn without_a_telling_state_the_first_to_stop_is_blamed() {
        let ranks = [
            clock(0, 5_000, None),
            clock(1, 2_000, None),
            clock(2, 2_000, None),
            clock(3, 57_000, None),
        ];
        let h = find(&ranks, 60_000, 30_000).unwrap();
        assert_eq!((h.rank, h.node.as_str()), (Some(1), "node-a"));
        assert!(
            h.message.contains("its progress stopped first"),
            "{}",
            h.message
        );
        assert!(
            h.message
                .ends_with("2 of the other 3 ranks made no progress in the last 5s either"),
            "{}",
            h.message
        );
        // A rank that never reported runs on the job's clock, and is caught.
        let never = [clock(0, 0, None)];
        let h = find(&never, 40_000, 30_000).unwrap();
        // Peers that stopped a moment after the culprit are blocked on it.
        let ranks = [clock(0, 1_000, None), clock(1, 3_000, None)];
        let h2 = find(&ranks, 31_000, 30_000).unwrap();
        assert!(
            h2.message
                .ends_with("the other 1 rank is blocked waiting on it"),
            "{}",
            h2.message
        );
        assert_eq!(h.message, "rank 0 on node-a hung: no progress for 40s, no process is stopped or stuck in the kernel");
    }

    /// Issue 36: every rank standing in the same slow transfer stopped at
    /// once; the first of them to stop by a moment was blamed as hung.
    #[test]
    fn ranks_that_stopped_together_blame_nobody() {
        let s = proc(0, "S");
        let ranks = [
            clock(0, 10_000, Some(&s)),
            clock(1, 10_400, None),
            clock(2, 11_900, None),
        ];
        let h = find(&ranks, 60_000, 30_000).unwrap();
        assert_eq!((h.rank, h.node.as_str()), (None, ""));
        assert!(h.message.contains("no rank is blamed"), "{}", h.message);
        // One of them 10 s behind the others is blamed, as before.
        let ranks = [
            clock(0, 1_000, None),
            clock(1, 11_000, None),
            clock(2, 11_500, None),
        ];
        assert_eq!(find(&ranks, 60_000, 30_000).unwrap().rank, Some(0));
        // A stopped process is blamed however close the clocks are.
        let t = proc(2, "T");
        let ranks = [
            clock(0, 10_000, None),
            clock(1, 10_000, None),
            clock(2, 10_000, Some(&t)),
        ];
        assert_eq!(find(&ranks, 60_000, 30_000).unwrap().rank, Some(2));
    }

    #[test]
    fn growth_moves_the_clock_and_only_growth() {
        let mut w = Watch {
            since_ms: 1_000,
            ..Default::default()
        };
        assert_eq!(w.last_growth(4), 1_000);
        w.progress(4, 0, 0, 2_000);
        assert_eq!(w.last_growth(4), 1_000);
        w.progress(4, 0, 7, 3_000);
        w.progress(4, 7, 7, 9_000);
        assert_eq!(w.last_growth(4), 3_000);
    }
}

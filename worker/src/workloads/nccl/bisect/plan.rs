//! The decisions of `--pattern bisect`, apart from any measuring: which groups of
//! nodes a round measures, and what their busbw says. Every rank runs its own
//! [`Search`] on the same numbers (read from the rendezvous), so all reach the
//! same next step without a leader.
//!
//! The search, for one slow node among N ≥ 3:
//! * round 0: every node, one group (no reference here: always go on);
//! * while 4 or more nodes are suspect: both halves at the same time (sorted
//!   node ranks, the first half takes the odd node); the half below `slow_ratio`
//!   × the other stays suspect, the other becomes the reference;
//! * 2 or 3 suspects: a node cannot be measured alone across nodes, so each is
//!   paired with a cleared node (at the same time while cleared nodes last); a
//!   suspect whose pair is below `slow_ratio` × the best seen is slow. With no
//!   cleared node (N = 3) the suspects meet each other, one pair a round, and a
//!   node is slow when every pair it is in is;
//! * a pair found slow is measured again before any node is blamed, and its
//!   best figure counts: on shared or busy hosts a healthy pair can measure
//!   slow once, while a slow node or link is slow every time.
//!
//! A node's group busbw is compared only with groups of the search, never with
//! a figure from elsewhere.

use gpuctl_core::pairs::round_robin;

/// Why the search stopped without a culprit, word for word in the report.
pub const NO_SLOW_HALF: &str = "no half is slower than the other: no single slow node";
pub const BOTH_HALVES_SLOW: &str = "both halves are slow: two slow nodes or more, not certain";
pub const NO_SLOW_PAIR: &str = "no pair is slower than another: no single slow node";

/// Where the search ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The node isolated, when exactly one is.
    pub culprit: Option<usize>,
    pub note: String,
}

#[derive(Debug, Clone)]
enum Stage {
    Whole,
    Halves,
    /// Pairs to measure, round by round: (suspect or lower node, partner).
    Pairs {
        schedule: Vec<Vec<(usize, usize)>>,
        at: usize,
        measured: Vec<Pair>,
        /// Partners are cleared nodes (else the suspects meet each other).
        cleared: bool,
        /// While the slow pairs are measured again: the first pass's
        /// figures and the best figure they were judged against.
        first: Option<(Vec<Pair>, f64)>,
    },
    Done(Verdict),
}

/// A pair of nodes (suspect or lower node, partner) and its busbw.
type Pair = ((usize, usize), f64);

/// The state of one search; [`Search::groups`] says what to measure next,
/// [`Search::decide`] takes the busbw of those groups.
#[derive(Debug, Clone)]
pub struct Search {
    nodes: usize,
    slow: f64,
    round: usize,
    suspects: Vec<usize>,
    /// Busbw of the last half found healthy: what a healthy group reaches.
    reference: Option<f64>,
    stage: Stage,
}

/// "0", "0 and 1", "0, 1 and 2".
fn list(nodes: &[usize]) -> String {
    let words: Vec<String> = nodes.iter().map(usize::to_string).collect();
    list_words(&words)
}

fn list_words(words: &[String]) -> String {
    match words.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
    }
}

fn nodes_word(nodes: &[usize]) -> String {
    let n = if nodes.len() == 1 { "node" } else { "nodes" };
    format!("{n} {}", list(nodes))
}

impl Search {
    /// A search over nodes `0..nodes`; a group is slow below `slow_ratio` × its
    /// comparison (the worker uses 0.8).
    pub fn new(nodes: usize, slow_ratio: f64) -> Search {
        Search {
            nodes,
            slow: slow_ratio,
            round: 0,
            suspects: (0..nodes).collect(),
            reference: None,
            stage: Stage::Whole,
        }
    }

    /// The round that [`Search::groups`] describes (0-based).
    pub fn round(&self) -> usize {
        self.round
    }

    /// The groups of node ranks (each sorted) to measure at the same time this
    /// round; `None` once the search is done.
    pub fn groups(&self) -> Option<Vec<Vec<usize>>> {
        match &self.stage {
            Stage::Whole => Some(vec![(0..self.nodes).collect()]),
            Stage::Halves => {
                let (a, b) = self.halves();
                Some(vec![a.to_vec(), b.to_vec()])
            }
            Stage::Pairs { schedule, at, .. } => Some(
                schedule[*at]
                    .iter()
                    .map(|&(x, y)| vec![x.min(y), x.max(y)])
                    .collect(),
            ),
            Stage::Done(_) => None,
        }
    }

    /// Where the search ended, once it has.
    pub fn verdict(&self) -> Option<&Verdict> {
        match &self.stage {
            Stage::Done(v) => Some(v),
            _ => None,
        }
    }

    fn halves(&self) -> (&[usize], &[usize]) {
        self.suspects.split_at(self.suspects.len().div_ceil(2))
    }

    /// Takes the busbw of this round's groups (in [`Search::groups`]' order) and
    /// says, in words, what the round concluded; moves to the next round.
    ///
    /// # Panics
    /// When the search is done or `busbw` does not hold one figure per group.
    pub fn decide(&mut self, busbw: &[f64]) -> String {
        let groups = self.groups().expect("the search is done");
        assert_eq!(busbw.len(), groups.len(), "one busbw per group");
        self.round += 1;
        match &mut self.stage {
            Stage::Whole => {
                let next = self.narrow();
                format!(
                    "all {} nodes: {:.2} GB/s; no reference for the whole set: {next}",
                    self.nodes, busbw[0]
                )
            }
            Stage::Halves => self.split(busbw),
            Stage::Pairs {
                schedule,
                at,
                measured,
                cleared,
                first,
            } => {
                measured.extend(schedule[*at].iter().copied().zip(busbw.iter().copied()));
                *at += 1;
                if *at < schedule.len() {
                    return "pairs measured; more pairs next".into();
                }
                let (measured, cleared) = (std::mem::take(measured), *cleared);
                let (schedule, first) = (std::mem::take(schedule), first.take());
                match first {
                    None => self.measure_again(schedule, measured, cleared),
                    Some((first, best)) => {
                        // Each pair at its best of the two passes.
                        let merged: Vec<Pair> = first
                            .iter()
                            .map(|&(p, b)| {
                                let again = measured.iter().filter(|(q, _)| *q == p);
                                (p, again.map(|&(_, c)| c).fold(b, f64::max))
                            })
                            .collect();
                        self.judge_pairs(&merged, cleared, best)
                    }
                }
            }
            Stage::Done(_) => unreachable!("groups() is None when done"),
        }
    }

    /// The next stage for the current suspects, in words.
    fn narrow(&mut self) -> String {
        let s = self.suspects.clone();
        if let [x] = s[..] {
            return self.stop(Some(x), format!("node {x} isolated"));
        }
        if s.len() >= 4 {
            self.stage = Stage::Halves;
            let (a, b) = self.halves();
            return format!("{} against {} next", nodes_word(a), nodes_word(b));
        }
        let cleared: Vec<usize> = (0..self.nodes).filter(|k| !s.contains(k)).collect();
        let schedule: Vec<Vec<(usize, usize)>> = if cleared.is_empty() {
            // The suspects meet each other, every pair once.
            round_robin(s.len())
                .into_iter()
                .flatten()
                .map(|(i, j)| vec![(s[i], s[j])])
                .collect()
        } else {
            // Suspect i with cleared node i mod |cleared|; a cleared node
            // takes one suspect per round.
            s.chunks(cleared.len())
                .map(|c| c.iter().zip(&cleared).map(|(&x, &g)| (x, g)).collect())
                .collect()
        };
        let how = if cleared.is_empty() {
            "each other"
        } else {
            "a healthy node"
        };
        self.stage = Stage::Pairs {
            schedule,
            at: 0,
            measured: Vec::new(),
            cleared: !cleared.is_empty(),
            first: None,
        };
        format!("{} each paired with {how} next", nodes_word(&s))
    }

    fn stop(&mut self, culprit: Option<usize>, note: String) -> String {
        self.stage = Stage::Done(Verdict {
            culprit,
            note: note.clone(),
        });
        note
    }

    fn split(&mut self, busbw: &[f64]) -> String {
        let (b1, b2) = (busbw[0], busbw[1]);
        let (a, b) = self.halves();
        let (a, b) = (a.to_vec(), b.to_vec());
        let (slow, fast, bs, bf) = if b1 < self.slow * b2 {
            (a, b, b1, b2)
        } else if b2 < self.slow * b1 {
            (b, a, b2, b1)
        } else if self.reference.is_some_and(|r| b1.max(b2) < self.slow * r) {
            return self.stop(None, BOTH_HALVES_SLOW.into());
        } else {
            return self.stop(None, NO_SLOW_HALF.into());
        };
        self.suspects = slow.clone();
        self.reference = Some(self.reference.map_or(bf, |r| r.max(bf)));
        let next = self.narrow();
        format!(
            "{} slower ({bs:.2} GB/s against {bf:.2} GB/s for {}): {next}",
            nodes_word(&slow),
            nodes_word(&fast)
        )
    }

    /// After the first pass over the pairs: the slow ones are measured
    /// again, in the rounds they had (so no node is in two groups at once);
    /// with none slow, the search ends here.
    fn measure_again(
        &mut self,
        schedule: Vec<Vec<(usize, usize)>>,
        measured: Vec<Pair>,
        cleared: bool,
    ) -> String {
        let best = measured
            .iter()
            .map(|&(_, b)| b)
            .chain(self.reference)
            .fold(0.0, f64::max);
        let slow: Vec<(usize, usize)> = measured
            .iter()
            .filter(|&&(_, b)| b < self.slow * best)
            .map(|&(p, _)| p)
            .collect();
        if slow.is_empty() {
            return self.judge_pairs(&measured, cleared, best);
        }
        let again: Vec<Vec<(usize, usize)>> = schedule
            .into_iter()
            .map(|r| r.into_iter().filter(|p| slow.contains(p)).collect())
            .filter(|r: &Vec<_>| !r.is_empty())
            .collect();
        let words: Vec<String> = slow.iter().map(|(x, y)| format!("{x}-{y}")).collect();
        self.stage = Stage::Pairs {
            schedule: again,
            at: 0,
            measured: Vec::new(),
            cleared,
            first: Some((measured, best)),
        };
        format!(
            "{} below {}x the best ({best:.2} GB/s): measured again before a node is blamed",
            if slow.len() == 1 {
                format!("pair {}", words[0])
            } else {
                format!("pairs {}", list_words(&words))
            },
            self.slow
        )
    }

    /// The last pair round: which suspects every pair of theirs calls slow,
    /// against `best`, the best figure of the first pass (a pair measured
    /// again can only rise, and must not make a pair measured once slow).
    fn judge_pairs(&mut self, measured: &[Pair], cleared: bool, best: f64) -> String {
        let is_slow = |b: f64| b < self.slow * best;
        let slow_nodes: Vec<usize> = self
            .suspects
            .iter()
            .copied()
            .filter(|&s| {
                let mine: Vec<f64> = measured
                    .iter()
                    .filter(|((x, y), _)| *x == s || (!cleared && *y == s))
                    .map(|&(_, b)| b)
                    .collect();
                !mine.is_empty() && mine.iter().all(|&b| is_slow(b))
            })
            .collect();
        match slow_nodes.as_slice() {
            [x] => self.stop(Some(*x), format!("node {x} isolated")),
            [] => {
                let slow_pairs: Vec<(usize, usize)> = measured
                    .iter()
                    .filter(|&&(_, b)| is_slow(b))
                    .map(|&(p, _)| p)
                    .collect();
                let note = match slow_pairs.as_slice() {
                    [(x, y)] => format!("{x} and {y}: not certain (the link between them?)"),
                    [] if cleared => format!(
                        "{}: not certain (the {} between them?)",
                        list(&self.suspects),
                        if self.suspects.len() == 2 {
                            "link"
                        } else {
                            "links"
                        }
                    ),
                    [] => NO_SLOW_PAIR.into(),
                    _ => format!(
                        "{} slow pairs and no node in all of its: not certain",
                        slow_pairs.len()
                    ),
                };
                self.stop(None, note)
            }
            many => self.stop(
                None,
                format!("two slow nodes: not certain ({})", nodes_word(many)),
            ),
        }
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;

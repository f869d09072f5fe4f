//! Every slow node and every slow link among N, by adaptive group testing,
//! with nothing blamed before a second measurement agrees. Pure: it names the
//! tests of each round and decides from their figures, so the same code runs
//! in the workers (every rank on the same numbers, read from the rendezvous)
//! and against a model (the tests below, `gpuctl-sim`).
//!
//! A test measures a group of nodes together (a ring all_reduce: the group is
//! as fast as its slowest node and slowest link between neighbours in the
//! ring, which is the group's nodes in the order given). Tests of one round
//! are disjoint and run at the same time. The search:
//!
//! 1. **Groups.** All nodes in groups of about √N (at least 8) and never of
//!    one node, which has no link to measure: a fast group clears its nodes
//!    and its ring's links in bulk. Three nodes are measured as their three
//!    pairs, one a round: fewer than two groups leave nothing to compare.
//! 2. **Halves.** A slow group of 4 or more is measured as two halves at once;
//!    a slow half goes on the same way, a fast half is cleared. The ring's two
//!    links that cross the halves are measured as pairs once their ends are
//!    cleared (both halves fast: the slowness was there).
//! 3. **Suspects.** A slow group of 1 to 3: each node meets a cleared node. A
//!    fast pair clears it. A slow pair is measured again with a *different*
//!    cleared node: slow again and the node is blamed (both figures are the
//!    evidence); fast, and the first pair's link is measured once more, blamed
//!    only if it is slow again. When every node of the group is cleared so,
//!    the group's own links are measured pair by pair, each blamed only when
//!    a second measurement agrees.
//! 4. A suspect with no cleared node to meet is said to be undecided, never
//!    blamed.
//!
//! "Slow" is below `slow ×` the reference: a baseline or floor when given,
//! else the fastest test of the same round, or half the fastest test of the
//! search where that is higher ([`Search::reference`]). The tests of a round
//! run at the same time under the same load, and a bandwidth has a ceiling
//! no healthy test passes while any number may fall under it: the fastest of
//! a round is what a healthy test read then, however many of the others are
//! slow. The upper quartile of all figures, used before, fell to the slow
//! groups' level once half of a round was slow and cleared a node 20 times
//! slower than the healthy group; the fastest of all rounds alone failed
//! healthy pairs of a busy round against a quiet one's (CPU ranks sharing
//! cores read 0.27 GB/s three pairs at a time, 0.61 beside a starved one).
//! Half the fastest judges a round of slow tests only: a node under a third
//! of the healthy (sockets; under 0.4 over NVLink) is slow however it is
//! measured, a milder one when measured beside a healthy test. The ratio
//! goes down (to half at most) for the fabric's healthy spread
//! ([`Search::line`]). A node is cleared only by a test that would have
//! shown it slow: a clearing slow against the reference as it stands (a
//! faster test raised it) clears nothing any more, and its nodes are looked
//! at again as a slow group; a suspect's slow pair counts only while its
//! partner is cleared.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// What was blamed, with the figure that raised it and the one that confirmed it.
#[derive(Debug, Clone, PartialEq)]
pub enum Blame {
    Node {
        node: usize,
        first: f64,
        confirm: f64,
        partners: (usize, usize),
    },
    Link {
        a: usize,
        b: usize,
        first: f64,
        confirm: f64,
    },
}

/// How the search ended.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    pub blamed: Vec<Blame>,
    /// Suspects whose second look cleared them: (node, the slow figure).
    pub cleared_on_second_look: Vec<(usize, f64)>,
    /// Nodes the search could not decide (no cleared node to meet).
    pub undecided: Vec<usize>,
    pub rounds: usize,
    pub tests: usize,
}

#[derive(Debug, Clone)]
enum Work {
    /// Measure a group; recurse when slow.
    Group(Vec<usize>),
    /// Both halves of a slow group at once.
    Split(Vec<usize>, Vec<usize>),
    /// A node of a slow small group meets cleared nodes.
    Suspect {
        node: usize,
        /// The first slow pair (partner, figure), once measured.
        first: Option<(usize, f64)>,
        /// The small group it came from, whose links are measured when all
        /// its nodes clear.
        leaf: usize,
    },
    /// A link measured directly; `first` once it was slow once.
    Link {
        a: usize,
        b: usize,
        first: Option<f64>,
    },
}

/// One test of a round: the nodes measured together, and what it is for.
#[derive(Debug, Clone)]
struct Test {
    nodes: Vec<usize>,
    work: usize,
}

/// A fast test: its figure, its nodes in ring order, and the fastest test
/// of its round.
#[derive(Debug, Clone)]
struct Clearing {
    figure: f64,
    nodes: Vec<usize>,
    round_max: f64,
}

/// A slow group of 1 to 3 whose nodes are being looked at one by one.
#[derive(Debug, Clone)]
struct Leaf {
    nodes: Vec<usize>,
    open: usize,
    blamed: bool,
}

/// The search's state; [`Search::tests`] says what a round measures,
/// [`Search::decide`] takes their figures in the same order.
#[derive(Debug, Clone)]
pub struct Search {
    n: usize,
    slow: f64,
    reference: Option<f64>,
    spread: f64,
    cleared: Vec<bool>,
    /// Every test that cleared nodes and still does, looked at again as
    /// the fastest test rises.
    clearings: Vec<Clearing>,
    /// The fastest test so far.
    fastest: f64,
    blamed_node: Vec<bool>,
    queue: VecDeque<Work>,
    round_tests: Vec<Test>,
    round_work: Vec<Work>,
    leaves: Vec<Leaf>,
    out: Outcome,
}

/// Whether a rank's result carries the rounds of a search or bisect (every
/// group of every round): the first rank of the first two nodes. Every rank
/// runs the same search and carries its verdict, but the coordinator reads
/// one copy of the rounds, and 131,072 copies at ~35 KB each (16,384 nodes)
/// were 4.6 GB of results. Two nodes, so that one lost node does not lose
/// them.
pub fn carries_rounds(node: usize, local_rank: usize) -> bool {
    local_rank == 0 && node < 2
}

/// Group size of the first round: about √N, at least 8 (fewer tests when
/// all is well; each halving costs one round), but at most N/4 and at least
/// 2: the more groups, the likelier some of them are healthy to make the
/// reference when several nodes are slow.
pub fn group_size(n: usize) -> usize {
    ((n as f64).sqrt().ceil() as usize).max(8).min(n / 4).max(2)
}

/// The first round's groups, as `Search::new` cuts them: `N / group_size`
/// groups of even size (the remainder spread, so no group of one), node
/// ranks in order; three nodes as their three pairs.
pub fn first_groups(n: usize) -> Vec<Vec<usize>> {
    match n {
        0 | 1 => Vec::new(),
        3 => vec![vec![0, 1], vec![1, 2], vec![0, 2]],
        _ => {
            let count = (n / group_size(n)).max(1);
            (0..count)
                .map(|k| (k * n / count..(k + 1) * n / count).collect())
                .collect()
        }
    }
}

impl Search {
    /// `slow`: the share of the reference under which a test is slow;
    /// `reference`: a baseline or floor of the figure, if there is one.
    pub fn new(n: usize, slow: f64, reference: Option<f64>) -> Search {
        let mut s = Search {
            n,
            slow,
            reference,
            spread: 0.05,
            cleared: vec![false; n],
            clearings: Vec::new(),
            fastest: 0.0,
            blamed_node: vec![false; n],
            queue: VecDeque::new(),
            round_tests: Vec::new(),
            round_work: Vec::new(),
            leaves: Vec::new(),
            out: Outcome::default(),
        };
        for g in first_groups(n) {
            s.queue.push_back(Work::Group(g));
        }
        s
    }

    /// The groups to measure this round (each a list of nodes, disjoint), or
    /// `None` when the search is over.
    pub fn tests(&mut self) -> Option<Vec<Vec<usize>>> {
        if self.round_tests.is_empty() {
            self.plan_round();
        }
        if self.round_tests.is_empty() {
            return None;
        }
        Some(self.round_tests.iter().map(|t| t.nodes.clone()).collect())
    }

    /// A cleared node not busy this round and not `avoid`.
    fn partner(&self, busy: &BTreeSet<usize>, avoid: &[usize]) -> Option<usize> {
        (0..self.n).find(|p| self.cleared[*p] && !busy.contains(p) && !avoid.contains(p))
    }

    fn plan_round(&mut self) {
        let mut busy: BTreeSet<usize> = BTreeSet::new();
        let mut later = VecDeque::new();
        let mut progress_possible = false;
        while let Some(w) = self.queue.pop_front() {
            // A link to a blamed node is slow because of the node; a link
            // is measured once both its ends are cleared.
            if let Work::Link { a, b, .. } = &w {
                if self.blamed_node[*a] || self.blamed_node[*b] {
                    continue;
                }
                if !(self.cleared[*a] && self.cleared[*b]) {
                    later.push_back(w);
                    continue;
                }
            }
            let nodes: Vec<Vec<usize>> = match &w {
                Work::Group(g) => vec![g.clone()],
                Work::Split(a, b) => vec![a.clone(), b.clone()],
                Work::Link { a, b, .. } => vec![vec![*a, *b]],
                Work::Suspect { node, first, .. } => {
                    let avoid: Vec<usize> = first.iter().map(|(p, _)| *p).collect();
                    if busy.contains(node) {
                        later.push_back(w);
                        continue;
                    }
                    match self.partner(&busy, &avoid) {
                        Some(p) => vec![vec![*node, p]],
                        None => {
                            later.push_back(w);
                            continue;
                        }
                    }
                }
            };
            if nodes.iter().flatten().any(|x| busy.contains(x)) {
                later.push_back(w);
                continue;
            }
            progress_possible = true;
            let idx = self.round_work.len();
            for g in nodes {
                busy.extend(g.iter().copied());
                self.round_tests.push(Test {
                    nodes: g,
                    work: idx,
                });
            }
            self.round_work.push(w);
        }
        if !progress_possible && !later.is_empty() {
            // Only suspects with no cleared node to meet, and links waiting
            // for them, are left.
            for w in later.drain(..) {
                if let Work::Suspect { node, leaf, .. } = w {
                    self.out.undecided.push(node);
                    self.leaves[leaf].open -= 1;
                }
            }
            self.out.undecided.sort_unstable();
        }
        self.queue = later;
        if !self.round_tests.is_empty() {
            self.out.rounds += 1;
            self.out.tests += self.round_tests.len();
        }
    }

    /// The healthy spread of one measurement on this fabric (±0.05 over
    /// NVLink or InfiniBand, ±0.2 over sockets, as measured runs show).
    pub fn with_spread(mut self, spread: f64) -> Search {
        self.spread = spread.clamp(0.0, 0.5);
        self
    }

    /// The share of the reference under which a test is slow: `slow`, or
    /// lower where the fabric's healthy spread would put its slowest test
    /// under that against its fastest, but not below half, so a test at a
    /// third of the others is slow on any fabric; a lower `slow` is kept.
    fn line(&self) -> f64 {
        let w = self.spread;
        // The slowest healthy test against the fastest, less a margin.
        let healthy_low = (1.0 - w) / (1.0 + w) - 0.05;
        self.slow.min(healthy_low.max(0.5))
    }

    /// What a healthy test reads, for a test of a round whose fastest test
    /// read `round_max`: the baseline or floor when given, else that
    /// fastest test, or half the fastest of the whole search where that is
    /// higher (a round of slow tests only). Half: a healthy test of a busy
    /// round may read half of a quiet round's, and a round's tests are
    /// compared with each other first.
    fn reference(&self, round_max: f64) -> f64 {
        self.reference.unwrap_or(round_max.max(0.5 * self.fastest))
    }

    /// Takes the figures of this round's tests, in the order [`Search::tests`]
    /// gave them; says in words what the round found.
    pub fn decide(&mut self, figures: &[f64]) -> String {
        let tests = std::mem::take(&mut self.round_tests);
        let work = std::mem::take(&mut self.round_work);
        let round_max = figures
            .iter()
            .copied()
            .filter(|f| f.is_finite())
            .fold(0.0, f64::max);
        self.fastest = self.fastest.max(round_max);
        let threshold = self.line() * self.reference(round_max);
        // A figure that is not a number (a failed test) is slow too.
        let slow = move |f: f64| f.is_nan() || f < threshold;
        let blamed_before = self.out.blamed.len();
        let slow_tests = figures.iter().filter(|f| slow(**f)).count();
        let mut words = format!(
            "{slow_tests} of {} tests slow (below {threshold:.2})",
            figures.len()
        );
        // A fast test clears every node in it: none of them is slow.
        for (t, f) in tests.iter().zip(figures) {
            if !slow(*f) {
                self.clear_by(&t.nodes, *f, round_max);
            }
        }
        // Then the clearings under the line now, before the steps: a slow
        // pair with a partner whose clearing no longer holds is no evidence.
        for (nodes, f) in self.reopen() {
            words.push_str(&format!(
                "; {nodes:?} cleared at {f:.2}, slow against a faster test since: looked at again"
            ));
        }
        let mut by_work: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
        for (t, f) in tests.iter().zip(figures) {
            by_work.entry(t.work).or_default().push(*f);
        }
        for (i, w) in work.into_iter().enumerate() {
            let f = by_work.remove(&i).unwrap_or_default();
            let partner = tests.iter().find(|t| t.work == i).map(|t| t.nodes.clone());
            self.step(w, &f, partner.as_deref(), &slow);
        }
        for b in &self.out.blamed[blamed_before..] {
            words.push_str(&match b {
                Blame::Node {
                    node,
                    first,
                    confirm,
                    ..
                } => {
                    format!("; node {node} blamed ({first:.2}, then {confirm:.2})")
                }
                Blame::Link {
                    a,
                    b,
                    first,
                    confirm,
                } => {
                    format!("; link {a}-{b} blamed ({first:.2}, then {confirm:.2})")
                }
            });
        }
        words
    }

    /// Clearings that are slow against the reference as it stands now (a
    /// faster test since raised it past them): their nodes that no standing
    /// clearing holds are uncleared and looked at again as a slow group, in
    /// the order of the test's ring. Returns each such group with its figure.
    fn reopen(&mut self) -> Vec<(Vec<usize>, f64)> {
        let line = self.line();
        let (stale, kept): (Vec<Clearing>, Vec<Clearing>) = std::mem::take(&mut self.clearings)
            .into_iter()
            .partition(|c| c.figure < line * self.reference(c.round_max));
        self.clearings = kept;
        let mut out = Vec::new();
        for c in stale {
            let again: Vec<usize> = c
                .nodes
                .into_iter()
                .filter(|n| self.cleared[*n] && !self.clearings.iter().any(|k| k.nodes.contains(n)))
                .collect();
            for n in &again {
                self.cleared[*n] = false;
            }
            if !again.is_empty() {
                out.push((again.clone(), c.figure));
                self.slow_group(again);
            }
        }
        out
    }

    /// A fast test's nodes (but a blamed one) are cleared, and the test
    /// kept as a clearing.
    fn clear_by(&mut self, nodes: &[usize], figure: f64, round_max: f64) {
        for n in nodes.iter().filter(|n| !self.blamed_node[**n]) {
            self.cleared[*n] = true;
        }
        self.clearings.push(Clearing {
            figure,
            nodes: nodes.to_vec(),
            round_max,
        });
    }

    fn step(&mut self, w: Work, f: &[f64], measured: Option<&[usize]>, slow: &dyn Fn(f64) -> bool) {
        match w {
            // A fast test's nodes are cleared already (`decide`).
            Work::Group(g) => {
                if slow(f[0]) {
                    self.slow_group(g);
                }
            }
            Work::Split(a, b) => {
                let (sa, sb) = (slow(f[0]), slow(f[1]));
                // The parent ring was slow: besides the halves, one of the
                // ring's two links between them may be. They are measured
                // once their ends are decided (a link to a slow node is
                // slow because of the node).
                let (fa, la) = (a[0], a[a.len() - 1]);
                let (fb, lb) = (b[0], b[b.len() - 1]);
                self.queue.push_back(Work::Link {
                    a: la,
                    b: fb,
                    first: None,
                });
                if a.len() + b.len() > 2 {
                    self.queue.push_back(Work::Link {
                        a: lb,
                        b: fa,
                        first: None,
                    });
                }
                if sa {
                    self.slow_group(a);
                }
                if sb {
                    self.slow_group(b);
                }
            }
            Work::Link { a, b, first } => match (slow(f[0]), first) {
                (false, _) => {}
                (true, None) => self.queue.push_back(Work::Link {
                    a,
                    b,
                    first: Some(f[0]),
                }),
                (true, Some(first)) => self.out.blamed.push(Blame::Link {
                    a: a.min(b),
                    b: a.max(b),
                    first,
                    confirm: f[0],
                }),
            },
            Work::Suspect { node, first, leaf } => {
                let p = measured.map_or(node, |m| m[1]);
                // A slow pair is evidence against the node only while its
                // partner is cleared: a partner cleared against a lower
                // reference may be the slow one.
                let first = first.filter(|(p1, _)| self.cleared[*p1]);
                match (slow(f[0]), first) {
                    (false, None) => self.leaf_done(leaf),
                    (true, _) if !self.cleared[p] => {
                        self.queue.push_back(Work::Suspect { node, first, leaf })
                    }
                    (true, None) => self.queue.push_back(Work::Suspect {
                        node,
                        first: Some((p, f[0])),
                        leaf,
                    }),
                    (true, Some((p1, first))) => {
                        self.blamed_node[node] = true;
                        self.cleared[node] = false;
                        self.out.blamed.push(Blame::Node {
                            node,
                            first,
                            confirm: f[0],
                            partners: (p1, p),
                        });
                        self.leaves[leaf].blamed = true;
                        self.leaf_done(leaf);
                    }
                    (false, Some((p1, first))) => {
                        // Fast with another partner: the first pair's link,
                        // or a noisy first look.
                        self.out.cleared_on_second_look.push((node, first));
                        self.queue.push_back(Work::Link {
                            a: node,
                            b: p1,
                            first: None,
                        });
                        self.leaf_done(leaf);
                    }
                }
            }
        }
    }

    fn slow_group(&mut self, g: Vec<usize>) {
        match g.len() {
            0 => {}
            1..=3 => {
                let leaf = self.leaves.len();
                self.leaves.push(Leaf {
                    nodes: g.clone(),
                    open: g.len(),
                    blamed: false,
                });
                for node in g {
                    self.queue.push_back(Work::Suspect {
                        node,
                        first: None,
                        leaf,
                    });
                }
            }
            n => {
                let (a, b) = g.split_at(n / 2);
                self.queue.push_back(Work::Split(a.to_vec(), b.to_vec()));
            }
        }
    }

    /// Once every node of a small slow group is decided and none was
    /// blamed, the slowness was on the group's own links.
    fn leaf_done(&mut self, leaf: usize) {
        let l = &mut self.leaves[leaf];
        l.open = l.open.saturating_sub(1);
        if l.open > 0 || l.blamed {
            return;
        }
        let nodes = l.nodes.clone();
        for i in 0..nodes.len() {
            for j in i + 1..nodes.len() {
                self.queue.push_back(Work::Link {
                    a: nodes[i],
                    b: nodes[j],
                    first: None,
                });
            }
        }
    }

    /// The outcome so far (final once [`Search::tests`] returned `None`).
    pub fn outcome(&self) -> &Outcome {
        &self.out
    }
}

pub mod model;
#[cfg(test)]
mod tests;
pub mod wire;

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
//! 1. **Groups.** All nodes in groups of about √N (at least 8): a fast group
//!    clears its nodes and its ring's links in bulk.
//! 2. **Halves.** A slow group of 4 or more is measured as two halves at once;
//!    a slow half goes on the same way, a fast half is cleared. The ring's two
//!    links that cross the halves are measured as pairs once their ends are
//!    cleared (both halves fast: the slowness was there).
//! 3. **Suspects.** A slow group of 2 or 3: each node meets a cleared node. A
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
//! else the upper quartile of every figure of the search so far, which holds
//! while fewer than a quarter of the tests are slow; the ratio goes down
//! (to half at most) where healthy tests spread wider ([`Search::threshold`]).

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

/// A slow group of 2 or 3 whose nodes are being looked at one by one.
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
    blamed_node: Vec<bool>,
    figures: Vec<f64>,
    queue: VecDeque<Work>,
    round_tests: Vec<Test>,
    round_work: Vec<Work>,
    leaves: Vec<Leaf>,
    out: Outcome,
}

/// Group size of the first round: about √N, at least 8 (fewer tests when
/// all is well; each halving costs one round), but at most N/4, so that the
/// first round has four figures or more to take a reference from.
pub fn group_size(n: usize) -> usize {
    ((n as f64).sqrt().ceil() as usize).max(8).min(n / 4).max(2)
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
            blamed_node: vec![false; n],
            figures: Vec::new(),
            queue: VecDeque::new(),
            round_tests: Vec::new(),
            round_work: Vec::new(),
            leaves: Vec::new(),
            out: Outcome::default(),
        };
        if n >= 2 {
            let g = group_size(n);
            let count = n.div_ceil(g);
            // Even groups: no group of one left over.
            for k in 0..count {
                let (from, to) = (k * n / count, (k + 1) * n / count);
                s.queue.push_back(Work::Group((from..to).collect()));
            }
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
    /// NVLink or InfiniBand, ±0.2 over sockets, as measured runs show); the
    /// search widens it where its own figures spread wider.
    pub fn with_spread(mut self, spread: f64) -> Search {
        self.spread = spread.clamp(0.0, 0.5);
        self
    }

    /// The figure under which a test is slow: `slow ×` the reference, or
    /// lower where healthy tests spread so wide that the slowest of them
    /// would fall under it (the spread told, or read from the search's own
    /// figures: twice the gap between upper quartile and median), but not
    /// below half the reference for the spread's sake, so a test at a third
    /// of the others is slow on any fabric; a lower `slow` is kept.
    fn threshold(&self) -> f64 {
        let mut v = self.figures.clone();
        v.sort_by(f64::total_cmp);
        let at = |q: f64| crate::stats::quantile_sorted(&v, q).unwrap_or(0.0);
        let (upper, median) = (at(0.75), at(0.5));
        let reference = self.reference.unwrap_or(upper);
        let seen = if upper > 0.0 {
            2.0 * (upper - median) / upper
        } else {
            0.0
        };
        let w = self.spread.max(seen);
        // The slowest healthy test against the upper quartile, less a margin.
        let healthy_low = (1.0 - w) / (1.0 + w / 2.0) - 0.05;
        reference * self.slow.min(healthy_low.max(0.5))
    }

    /// Takes the figures of this round's tests, in the order [`Search::tests`]
    /// gave them; says in words what the round found.
    pub fn decide(&mut self, figures: &[f64]) -> String {
        let tests = std::mem::take(&mut self.round_tests);
        let work = std::mem::take(&mut self.round_work);
        self.figures
            .extend(figures.iter().copied().filter(|f| f.is_finite()));
        let threshold = self.threshold();
        // A figure that is not a number (a failed test) is slow too.
        let slow = move |f: f64| f.is_nan() || f < threshold;
        let blamed_before = self.out.blamed.len();
        let slow_tests = figures.iter().filter(|f| slow(**f)).count();
        let mut by_work: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
        for (t, f) in tests.iter().zip(figures) {
            by_work.entry(t.work).or_default().push(*f);
        }
        for (i, w) in work.into_iter().enumerate() {
            let f = by_work.remove(&i).unwrap_or_default();
            let partner = tests.iter().find(|t| t.work == i).map(|t| t.nodes.clone());
            self.step(w, &f, partner.as_deref(), &slow);
        }
        let mut words = format!(
            "{slow_tests} of {} tests slow (below {threshold:.2})",
            figures.len()
        );
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

    fn clear(&mut self, nodes: &[usize]) {
        for n in nodes {
            if !self.blamed_node[*n] {
                self.cleared[*n] = true;
            }
        }
    }

    fn step(&mut self, w: Work, f: &[f64], measured: Option<&[usize]>, slow: &dyn Fn(f64) -> bool) {
        match w {
            Work::Group(g) => {
                if !slow(f[0]) {
                    self.clear(&g);
                } else {
                    self.slow_group(g);
                }
            }
            Work::Split(a, b) => {
                let (sa, sb) = (slow(f[0]), slow(f[1]));
                if !sa {
                    self.clear(&a);
                }
                if !sb {
                    self.clear(&b);
                }
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
                match (slow(f[0]), first) {
                    (false, None) => self.leaf_node_cleared(node, leaf),
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
                        self.leaf_node_cleared(node, leaf);
                    }
                }
            }
        }
    }

    fn slow_group(&mut self, g: Vec<usize>) {
        match g.len() {
            0 | 1 => {}
            2 | 3 => {
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

    fn leaf_node_cleared(&mut self, node: usize, leaf: usize) {
        self.clear(&[node]);
        self.leaf_done(leaf);
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

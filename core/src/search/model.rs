//! A model fleet for the search: node and link speeds, a spread per
//! measurement, bad nodes and links. The search's tests and `gpuctl-sim
//! search` drive the real [`super::Search`] against it.

use std::collections::{BTreeMap, BTreeSet};

use super::{group_size, Outcome, Search};

/// A modelled fleet: a test's figure is its slowest node or ring link,
/// times the measurement's noise.
pub struct Model {
    node: Vec<f64>,
    links: BTreeMap<(usize, usize), f64>,
    noise: f64,
    rng: fastrand_lite::Rng,
}

/// A tiny xorshift, so the core crate needs no random crate.
pub mod fastrand_lite {
    pub struct Rng(u64);
    impl Rng {
        pub fn new(seed: u64) -> Rng {
            Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
        }
        pub fn u64(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        pub fn f64(&mut self) -> f64 {
            (self.u64() >> 11) as f64 / (1u64 << 53) as f64
        }
        pub fn below(&mut self, n: usize) -> usize {
            (self.u64() % n as u64) as usize
        }
    }
}

impl Model {
    pub fn link(&self, a: usize, b: usize) -> f64 {
        *self.links.get(&(a.min(b), a.max(b))).unwrap_or(&1.0)
    }

    pub fn measure(&mut self, g: &[usize]) -> f64 {
        let mut v = g
            .iter()
            .map(|n| self.node[*n])
            .fold(f64::INFINITY, f64::min);
        for i in 0..g.len() {
            let (a, b) = (g[i], g[(i + 1) % g.len()]);
            if a != b {
                v = v.min(self.link(a, b));
            }
        }
        v * (1.0 + self.noise * (2.0 * self.rng.f64() - 1.0))
    }
}

/// Runs a search to its end against `m` (slow below 0.8 of the reference,
/// the search's own upper quartile; told the model's spread, as a worker is
/// told its fabric's).
pub fn run(m: &mut Model) -> Outcome {
    let mut s = Search::new(m.node.len(), 0.8, None).with_spread(m.noise);
    while let Some(tests) = s.tests() {
        for t in &tests {
            let mut seen = BTreeSet::new();
            assert!(t.iter().all(|n| seen.insert(*n)), "a node twice in {t:?}");
        }
        let figures: Vec<f64> = tests.iter().map(|t| m.measure(t)).collect();
        let _ = s.decide(&figures);
        assert!(s.outcome().rounds < 200, "no end");
    }
    s.outcome().clone()
}

/// `k` culprits: bad nodes and bad links alternately, on distinct nodes. A
/// bad link joins two neighbours of a first-round ring: a link is found
/// where the search's tests cross it, and the search measures rings of
/// neighbours, not every pair (that is `--pattern pairs`).
pub fn draw(
    n: usize,
    k: usize,
    noise: f64,
    seed: u64,
) -> (Model, BTreeSet<usize>, BTreeSet<(usize, usize)>) {
    let mut rng = fastrand_lite::Rng::new(seed);
    let mut m = Model {
        node: vec![1.0; n],
        links: BTreeMap::new(),
        noise,
        rng: fastrand_lite::Rng::new(seed ^ 0xABCD),
    };
    let (mut nodes, mut links) = (BTreeSet::new(), BTreeSet::new());
    let mut used = BTreeSet::new();
    for i in 0..k {
        if i % 2 == 0 {
            let x = loop {
                let x = rng.below(n);
                if used.insert(x) {
                    break x;
                }
            };
            m.node[x] = 0.3;
            nodes.insert(x);
        } else {
            let a = loop {
                let a = rng.below(n);
                if a + 1 < n
                    && !used.contains(&a)
                    && !used.contains(&(a + 1))
                    && same_group(n, a, a + 1)
                {
                    used.insert(a);
                    used.insert(a + 1);
                    break a;
                }
            };
            m.links.insert((a, a + 1), 0.3);
            links.insert((a, a + 1));
        }
    }
    (m, nodes, links)
}

/// Whether `a` and `b` share a first-round group (as `Search::new` cuts them).
fn same_group(n: usize, a: usize, b: usize) -> bool {
    let count = n.div_ceil(group_size(n));
    let of = |x: usize| (0..count).find(|k| x < (k + 1) * n / count).unwrap();
    of(a) == of(b)
}

/// How a search did against one draw.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Scored {
    pub rounds: usize,
    pub tests: usize,
    /// Culprits (nodes and links) blamed, of those there were.
    pub found: usize,
    pub culprits: usize,
    /// Blamed where nothing was wrong.
    pub false_blames: usize,
    pub undecided: usize,
}

/// One draw of `k` culprits among `n` nodes, searched and scored.
pub fn score(n: usize, k: usize, noise: f64, seed: u64) -> Scored {
    let (mut m, nodes, links) = draw(n, k, noise, seed);
    let out = run(&mut m);
    let mut s = Scored {
        rounds: out.rounds,
        tests: out.tests,
        culprits: nodes.len() + links.len(),
        undecided: out.undecided.len(),
        ..Default::default()
    };
    for b in &out.blamed {
        let right = match b {
            super::Blame::Node { node, .. } => nodes.contains(node),
            super::Blame::Link { a, b, .. } => links.contains(&(*a, *b)),
        };
        if right {
            s.found += 1;
        } else {
            s.false_blames += 1;
        }
    }
    s
}

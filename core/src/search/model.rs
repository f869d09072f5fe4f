//! A model fleet for the search: node and link speeds, a spread per
//! measurement, bad nodes and links each slow at a rate of its own, anywhere
//! or one to a first-round group. The search's tests and `gpuctl-sim search`
//! drive the real [`super::Search`] against it.

use std::collections::{BTreeMap, BTreeSet};

use super::{first_groups, Outcome, Search};

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
    /// A fleet of these node speeds and bad links (healthy is 1.0), each
    /// measurement within ±`noise`.
    pub fn new(node: Vec<f64>, links: &[((usize, usize), f64)], noise: f64, seed: u64) -> Model {
        Model {
            node,
            links: links
                .iter()
                .map(|((a, b), v)| ((*a.min(b), *a.max(b)), *v))
                .collect(),
            noise,
            rng: fastrand_lite::Rng::new(seed ^ 0xABCD),
        }
    }

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

/// Where a draw puts its culprits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Anywhere: at fleet scale most first-round groups stay healthy.
    Random,
    /// Each in a first-round group of its own, so that with `k` at half
    /// the groups, half of the first round is slow: the case where a
    /// reference taken from the middle of the figures is a culprit's.
    Groups,
}

/// The slowest and the fastest a culprit is drawn at, against a healthy
/// 1.0: 60 Mbit/s against a healthy ~4 Gbit/s socket is 0.015; a quarter is
/// under what [`super::Search`] calls slow however it is measured (a third
/// of the fastest over sockets, with their ±20 %).
pub const CULPRIT_SPEEDS: (f64, f64) = (0.015, 0.25);

/// A culprit's speed: log-uniform over [`CULPRIT_SPEEDS`], so that the
/// culprits of one draw are slow at different rates, as two bad nodes of a
/// new rack are.
fn culprit_speed(rng: &mut fastrand_lite::Rng) -> f64 {
    let (lo, hi) = CULPRIT_SPEEDS;
    lo * (hi / lo).powf(rng.f64())
}

/// `k` culprits: bad nodes and bad links alternately, on distinct nodes,
/// each at a speed of its own. A bad link joins two neighbours of a
/// first-round ring: a link is found where the search's tests cross it, and
/// the search measures rings of neighbours, not every pair (that is
/// `--pattern pairs`).
pub fn draw(
    n: usize,
    k: usize,
    noise: f64,
    seed: u64,
    placement: Placement,
) -> (Model, BTreeSet<usize>, BTreeSet<(usize, usize)>) {
    let mut rng = fastrand_lite::Rng::new(seed);
    let mut m = Model {
        node: vec![1.0; n],
        links: BTreeMap::new(),
        noise,
        rng: fastrand_lite::Rng::new(seed ^ 0xABCD),
    };
    let groups = first_groups(n);
    let group_of = |x: usize| groups.iter().position(|g| g.contains(&x));
    let (mut nodes, mut links) = (BTreeSet::new(), BTreeSet::new());
    let mut used = BTreeSet::new();
    let mut used_groups = BTreeSet::new();
    assert!(
        placement == Placement::Random || k <= groups.len(),
        "{k} culprits in groups of their own among {} groups",
        groups.len()
    );
    // A node (and, for a link, its neighbour) free to take a culprit.
    let free = |x: usize, used: &BTreeSet<usize>, used_groups: &BTreeSet<Option<usize>>| {
        !used.contains(&x)
            && (placement == Placement::Random || !used_groups.contains(&group_of(x)))
    };
    for i in 0..k {
        let speed = culprit_speed(&mut rng);
        if i % 2 == 0 {
            let x = loop {
                let x = rng.below(n);
                if free(x, &used, &used_groups) {
                    break x;
                }
            };
            used.insert(x);
            m.node[x] = speed;
            nodes.insert(x);
            used_groups.insert(group_of(x));
        } else {
            let a = loop {
                let a = rng.below(n);
                if a + 1 < n
                    && free(a, &used, &used_groups)
                    && !used.contains(&(a + 1))
                    && group_of(a) == group_of(a + 1)
                {
                    break a;
                }
            };
            used.extend([a, a + 1]);
            m.links.insert((a, a + 1), speed);
            links.insert((a, a + 1));
            used_groups.insert(group_of(a));
        }
    }
    (m, nodes, links)
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
pub fn score(n: usize, k: usize, noise: f64, seed: u64, placement: Placement) -> Scored {
    let (mut m, nodes, links) = draw(n, k, noise, seed, placement);
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

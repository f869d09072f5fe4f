//! The slow nodes and links a simulated fleet is told to have, by name:
//! given (`--slow-nodes sim-00017`, `--slow-links sim-00040:sim-00041`) or
//! drawn from a seed as `gpuctl-sim search` draws them
//! ([`gpuctl_core::search::model::draw`]), each at a speed of its own
//! against a healthy 1.0. Apart from the ranks that play them
//! ([`crate::search_ranks`]) because the run that scores a report
//! ([`crate::bench::search_fleet`]) needs the same list to compare with.

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use gpuctl_core::search::model::{draw, fastrand_lite::Rng, Placement, CULPRIT_SPEEDS};

use crate::host;

/// The most culprits of each kind a fleet takes: a bound on the input, far
/// past what a search is for (a sixteenth of 16,384 nodes).
pub const MAX_CULPRITS: usize = 4096;

/// Slow nodes and links by node name, each with its speed (healthy: 1.0).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Culprits {
    pub nodes: BTreeMap<String, f64>,
    /// Keyed by the two names in order.
    pub links: BTreeMap<(String, String), f64>,
}

/// A speed as the model draws a culprit's: log-uniform over
/// [`CULPRIT_SPEEDS`], so two culprits of one fleet are slow at different rates.
fn speed(rng: &mut Rng) -> f64 {
    let (lo, hi) = CULPRIT_SPEEDS;
    lo * (hi / lo).powf(rng.f64())
}

impl Culprits {
    /// The culprits named (`--slow-nodes`, `--slow-links` as `a:b`), each at
    /// a speed drawn from `seed`.
    pub fn named(nodes: &[String], links: &[String], seed: u64) -> Result<Culprits> {
        if nodes.len() > MAX_CULPRITS || links.len() > MAX_CULPRITS {
            bail!("--slow-nodes/--slow-links: at most {MAX_CULPRITS} of each");
        }
        let mut rng = Rng::new(seed);
        let mut out = Culprits::default();
        for n in nodes {
            let n = n.trim();
            if n.is_empty() {
                bail!("--slow-nodes: an empty name; give node names, comma-separated (sim-00017,sim-01234)");
            }
            out.nodes.insert(n.to_string(), speed(&mut rng));
        }
        for l in links {
            let Some((a, b)) = l.split_once(':') else {
                bail!("--slow-links {l:?}: give each link as two node names, a:b (sim-00040:sim-00041)");
            };
            let (a, b) = (a.trim(), b.trim());
            if a.is_empty() || b.is_empty() || a == b {
                bail!("--slow-links {l:?}: two different node names, a:b");
            }
            out.links.insert(
                (a.min(b).to_string(), a.max(b).to_string()),
                speed(&mut rng),
            );
        }
        Ok(out)
    }

    /// `k` culprits among a fleet of `nodes` simulated nodes, placed and
    /// slowed as the model draws them (nodes and links alternately, each
    /// link between neighbours of a first-round ring): node index i is the
    /// simulated node `sim-{i:05}`, as in a job on every node, whose plan
    /// sorts the nodes by name.
    pub fn drawn(nodes: usize, k: usize, seed: u64) -> Result<Culprits> {
        if k * 4 > nodes {
            bail!("--culprits {k}: at most a quarter of the {nodes} nodes (distinct nodes for each, links take two)");
        }
        // No noise: a one-node measurement is then the node's speed.
        let (mut m, slow_nodes, slow_links) = draw(nodes, k, 0.0, seed, Placement::Random);
        let name = host::name;
        Ok(Culprits {
            nodes: slow_nodes
                .iter()
                .map(|&i| (name(i), m.measure(&[i])))
                .collect(),
            links: slow_links
                .iter()
                .map(|&(a, b)| ((name(a), name(b)), m.link(a, b)))
                .collect(),
        })
    }

    pub fn len(&self) -> usize {
        self.nodes.len() + self.links.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// One line: each culprit with its speed.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self
            .nodes
            .iter()
            .map(|(n, s)| format!("node {n} at {s:.3}"))
            .collect();
        parts.extend(
            self.links
                .iter()
                .map(|((a, b), s)| format!("link {a}:{b} at {s:.3}")),
        );
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_and_drawn_culprits_and_bad_input() {
        let c = Culprits::named(&["sim-00003".into()], &["sim-00009:sim-00008".into()], 1).unwrap();
        assert!(c.nodes.contains_key("sim-00003"));
        let link = ("sim-00008".to_string(), "sim-00009".to_string());
        assert!(c.links.contains_key(&link), "{c:?}");
        let (lo, hi) = CULPRIT_SPEEDS;
        assert!(c
            .nodes
            .values()
            .chain(c.links.values())
            .all(|s| (lo..=hi).contains(s)));
        assert!(Culprits::named(&[], &["sim-00001".into()], 1).is_err());
        assert!(Culprits::named(&[], &["a:a".into()], 1).is_err());
        assert!(Culprits::named(&[" ".into()], &[], 1).is_err());

        let d = Culprits::drawn(64, 4, 7).unwrap();
        assert_eq!((d.nodes.len(), d.links.len()), (2, 2), "{d:?}");
        assert_eq!(
            d,
            Culprits::drawn(64, 4, 7).unwrap(),
            "a seed draws the same"
        );
        assert!(Culprits::drawn(8, 3, 7).is_err());
    }
}

//! One node, one vote: the fleet reference a rank is judged against is
//! built from per-node figures (each node's median), and only from at least
//! [`MIN_OTHER_NODES`] nodes besides the rank's own. A node under test is
//! not trusted: one that offered 64 fake ranks at 0.5 TFLOP/s once made the
//! median, and the honest nodes failed against it (issue 46). With fewer
//! nodes a rank is compared with its own node's ranks only: a node's word
//! then counts for that node alone.

use std::collections::BTreeMap;

use gpuctl_core::stats::median;

/// Nodes besides the judged one whose figures a fleet reference needs.
pub const MIN_OTHER_NODES: usize = 3;

/// What a reference was made of, for the report's note.
#[derive(Debug, Clone, PartialEq)]
pub enum Basis {
    /// The median of the voting nodes' medians ([`Votes::node_names`]):
    /// named only where a finding quotes them, not once per rank judged.
    Nodes,
    /// The median of the judged rank's own node's ranks (this many).
    OwnNode(usize),
}

/// The reference one rank is judged against.
#[derive(Debug, Clone, PartialEq)]
pub struct Reference {
    pub value: f64,
    pub basis: Basis,
}

/// One figure's values in one device class, grouped by node.
#[derive(Debug, Default)]
pub struct Votes<'a> {
    by_node: BTreeMap<&'a str, Vec<f64>>,
    /// The median of every node's median, when enough nodes voted.
    across: Option<f64>,
}

impl<'a> Votes<'a> {
    /// `values`: (node, value) per rank. `min_ranks`: ranks a node needs for
    /// a reference of its own (the rules' `fleet.min_ranks`).
    pub fn new(values: impl IntoIterator<Item = (&'a str, f64)>) -> Votes<'a> {
        // A node's ranks come one after another: one lookup a node, not a
        // rank (131,072 string comparisons deep in a big job's tree).
        let mut by_node: BTreeMap<&'a str, Vec<f64>> = BTreeMap::new();
        let mut run: Option<(&'a str, Vec<f64>)> = None;
        for (node, v) in values {
            match &mut run {
                Some((n, vs)) if *n == node => vs.push(v),
                _ => {
                    if let Some((n, vs)) = run.replace((node, vec![v])) {
                        by_node.entry(n).or_default().extend(vs);
                    }
                }
            }
        }
        if let Some((n, vs)) = run {
            by_node.entry(n).or_default().extend(vs);
        }
        let across = if by_node.len() > MIN_OTHER_NODES {
            let medians: Vec<f64> = by_node.values().filter_map(|v| median(v.clone())).collect();
            median(medians)
        } else {
            None
        };
        Votes { by_node, across }
    }

    /// The reference for a rank of `node`, if one can be made.
    pub fn reference(&self, node: &str, min_ranks: usize) -> Option<Reference> {
        if let Some(value) = self.across {
            return Some(Reference {
                value,
                basis: Basis::Nodes,
            });
        }
        let own = self.by_node.get(node)?;
        if own.len() < min_ranks.max(2) {
            return None;
        }
        Some(Reference {
            value: median(own.clone())?,
            basis: Basis::OwnNode(own.len()),
        })
    }

    /// The names of the nodes that voted.
    pub fn node_names(&self) -> Vec<String> {
        self.by_node.keys().map(|n| n.to_string()).collect()
    }

    /// The most ranks one node has.
    pub fn largest_node(&self) -> usize {
        self.by_node.values().map(Vec::len).max().unwrap_or(0)
    }

    /// Nodes that voted.
    pub fn nodes(&self) -> usize {
        self.by_node.len()
    }

    /// How a class's fleet references were made, said once in the report: one
    /// vote per node, and which nodes voted.
    pub fn note(&self, class: &str, ranks: usize, min: usize) -> String {
        let nodes = self.nodes();
        let plural = |n: usize| if n == 1 { "" } else { "s" };
        if self.across_nodes() {
            return format!(
                "fleet reference: each rank of `{class}` against the median of {nodes} nodes' medians, one vote per node ({})",
                name_nodes(&self.node_names())
            );
        }
        let why = format!(
            "{nodes} node{} with figures, and a reference across nodes needs {MIN_OTHER_NODES} besides the node judged",
            plural(nodes)
        );
        if self.largest_node() < min {
            return format!(
                "fleet reference not used for `{class}`: {why}; no node has {min} or more of its {ranks} rank{}",
                plural(ranks)
            );
        }
        format!("fleet reference for `{class}`: {why}; each rank against its own node's ranks where that node has {min} or more")
    }

    /// Whether the reference is the fleet's rather than each node's own.
    pub fn across_nodes(&self) -> bool {
        self.across.is_some()
    }
}

/// `nodes` for a sentence: every name up to 8, then how many more.
pub fn name_nodes(nodes: &[String]) -> String {
    gpuctl_core::listing::names(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_whose_ranks_come_apart_is_still_one_vote() {
        let votes = Votes::new([("a", 1.0), ("b", 5.0), ("a", 3.0), ("b", 7.0), ("a", 2.0)]);
        assert_eq!(votes.nodes(), 2);
        assert_eq!(votes.largest_node(), 3);
        let own = votes.reference("a", 2).unwrap();
        assert_eq!((own.value, own.basis), (2.0, Basis::OwnNode(3)));
        assert_eq!(votes.reference("b", 2).unwrap().value, 6.0);
    }

    #[test]
    fn many_fake_ranks_on_one_node_are_one_vote() {
        // Issue 46's probe: c offered 64 ranks at 0.5, a and b are honest.
        let mut values = vec![("a", 0.085), ("b", 0.079)];
        values.extend(std::iter::repeat_n(("c", 0.5), 64));
        let votes = Votes::new(values.clone());
        assert!(!votes.across_nodes(), "3 nodes: 2 others each, not enough");
        // a and b have one rank each: no reference for them at all.
        assert_eq!(votes.reference("a", 3), None);
        // c is judged by its own ranks only.
        assert_eq!(votes.reference("c", 3).unwrap().basis, Basis::OwnNode(64));

        // With a fourth honest node the fleet reference is the median of the
        // four node medians: c moves it no further than one node can.
        values.push(("d", 0.082));
        let votes = Votes::new(values);
        let r = votes.reference("a", 3).unwrap();
        assert!((r.value - (0.082 + 0.085) / 2.0).abs() < 1e-12, "{r:?}");
        assert_eq!(r.basis, Basis::Nodes);
        assert_eq!(votes.node_names(), ["a", "b", "c", "d"]);
    }

    #[test]
    fn a_node_alone_is_compared_with_itself() {
        let votes = Votes::new([("a", 650.0), ("a", 655.0), ("a", 648.0), ("a", 320.0)]);
        let r = votes.reference("a", 3).unwrap();
        assert_eq!(r.basis, Basis::OwnNode(4));
        assert!((r.value - 649.0).abs() < 1e-9);
        assert_eq!(votes.reference("b", 3), None);
    }

    #[test]
    fn long_node_lists_are_cut() {
        let nodes: Vec<String> = (0..10).map(|i| format!("n{i}")).collect();
        assert_eq!(
            name_nodes(&nodes),
            "n0, n1, n2, n3, n4, n5, n6, n7 and 2 more"
        );
    }
}

//! `gpuctl fleet`'s answer as a fold of its inputs: the inventory's nodes
//! and their runs ([`NodeDigest`] each), the latest links, the acceptance
//! states. A build folds every node's runs; the fleet view then folds in
//! what the store says was written since (a job's runs, an acceptance, a
//! node joining) and renders again only the rows that changed. What cannot
//! be folded in so that the answer equals a fresh build (a run before the
//! node's last, a deletion) is refused with [`Rebuild`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use gpuctl_proto::pb::{Acceptance, FleetRow, Link, NodeRun};

use super::{LatestLinks, NodeDigest};

/// A change the fold cannot take in: build again from the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rebuild(pub String);

/// The whole-fleet answer's inputs, folded, and its rows.
#[derive(Debug, Clone)]
pub struct FleetFold {
    tolerance: f64,
    /// The nodes whose runs are listed. Hashed, not ordered: a job's 16,384
    /// runs are each looked up here and in `digests`, and the names'
    /// compares down a tree were a seventh of the fold's CPU (`perf`); the
    /// rows keep the order.
    inventory: HashSet<String>,
    digests: HashMap<String, NodeDigest>,
    links: LatestLinks,
    accepted: BTreeMap<String, Acceptance>,
    /// One per node with a run or an acceptance, by name.
    rows: Arc<Vec<FleetRow>>,
    /// Nodes whose row is not rendered yet, in any order and maybe twice
    /// (sorted when the rows are).
    changed: Vec<String>,
}

impl FleetFold {
    /// Nothing folded yet: `inventory`'s runs will be listed, and every
    /// node's acceptance in `accepted`, whether in the inventory or not.
    pub fn new(tolerance: f64, inventory: Vec<String>, accepted: Vec<Acceptance>) -> Self {
        let accepted: BTreeMap<String, Acceptance> =
            accepted.into_iter().map(|a| (a.node.clone(), a)).collect();
        FleetFold {
            tolerance,
            changed: accepted.keys().cloned().collect(),
            inventory: inventory.into_iter().collect(),
            digests: HashMap::new(),
            links: LatestLinks::default(),
            accepted,
            rows: Arc::default(),
        }
    }

    /// Whether `node`'s runs are listed.
    pub fn lists(&self, node: &str) -> bool {
        self.inventory.contains(node)
    }

    /// `node`'s runs (any order), all of them: in a build, or as the node
    /// joins the inventory.
    pub fn add_node(&mut self, node: &str, runs: &[NodeRun]) {
        self.inventory.insert(node.to_string());
        self.links.add(runs);
        if runs.is_empty() {
            self.digests.remove(node);
        } else {
            let mut rs: Vec<&NodeRun> = runs.iter().collect();
            self.digests
                .insert(node.to_string(), NodeDigest::of(node, &mut rs));
        }
        self.changed.push(node.to_string());
    }

    /// A run just written: folded into its node's digest when it is the
    /// node's newest; nothing when the node is not listed.
    pub fn add_run(&mut self, run: &NodeRun) -> Result<(), Rebuild> {
        if !self.inventory.contains(&run.node) {
            return Ok(());
        }
        if !self.digests.contains_key(&run.node) {
            let digest = NodeDigest::of(&run.node, &mut []);
            self.digests.insert(run.node.clone(), digest);
        }
        let digest = self.digests.get_mut(&run.node).expect("just made");
        if !digest.comes_after(run) {
            return Err(Rebuild(format!(
                "a run of {} ({}) written at or before its last",
                run.node, run.job_id
            )));
        }
        digest.fold(run);
        self.links.add(std::slice::from_ref(run));
        self.changed.push(run.node.clone());
        Ok(())
    }

    /// `node`'s acceptance state, written or deleted (`None`).
    pub fn set_acceptance(&mut self, node: &str, a: Option<Acceptance>) {
        match a {
            Some(a) => self.accepted.insert(node.to_string(), a),
            None => self.accepted.remove(node),
        };
        self.changed.push(node.to_string());
    }

    fn row_of(&self, node: &str) -> Option<FleetRow> {
        let row = self.digests.get(node).and_then(|d| d.row(self.tolerance));
        match (row, self.accepted.get(node)) {
            (row, None) => row,
            (row, Some(a)) => Some(FleetRow {
                acceptance: Some(a.clone()),
                ..row.unwrap_or_else(|| FleetRow {
                    node: node.to_string(),
                    ..Default::default()
                })
            }),
        }
    }

    /// The rows, by name, with the changed ones rendered again. The rows
    /// are shared with earlier answers: while one of those is still held
    /// (a listing going on from it), the rows that did not change are
    /// copied from it, and only those (after a job every row changed, and
    /// copying them all first was ~40 ms of the fold callers wait for).
    pub fn rows(&mut self) -> Arc<Vec<FleetRow>> {
        if !self.changed.is_empty() {
            let mut changed = std::mem::take(&mut self.changed);
            changed.sort_unstable();
            changed.dedup();
            let out = match Arc::try_unwrap(std::mem::take(&mut self.rows)) {
                Ok(old) => self.merged(old.into_iter(), &changed, |r| r),
                Err(shared) => self.merged(shared.iter(), &changed, FleetRow::clone),
            };
            self.rows = Arc::new(out);
        }
        self.rows.clone()
    }

    /// `old` rows (by name) with those of `changed` (sorted) rendered again;
    /// `own` makes a kept row the new answer's.
    fn merged<R: std::borrow::Borrow<FleetRow>>(
        &self,
        old: impl Iterator<Item = R>,
        changed: &[String],
        own: impl Fn(R) -> FleetRow,
    ) -> Vec<FleetRow> {
        let mut out = Vec::with_capacity(old.size_hint().0 + changed.len());
        let mut old = old.peekable();
        for node in changed {
            while let Some(r) = old.next_if(|r| r.borrow().node < *node) {
                out.push(own(r));
            }
            old.next_if(|r| r.borrow().node == *node);
            out.extend(self.row_of(node));
        }
        out.extend(old.map(own));
        out
    }

    /// The latest measurement of every pair of nodes.
    pub fn links(&self) -> Vec<Link> {
        self.links.list()
    }
}

//! What nodes may make the coordinator keep: a node's name, facts, GPUs and
//! checks within [`MAX_NODE_BYTES`], and all nodes' together within the
//! fleet's budget, `--max-nodes` × [`NODE_SHARE_BYTES`] (the figures and
//! why are in `gpuctl_core::limits`). Each field within its own bound, 20
//! registrations of 3.9 MiB made `gpuctl nodes -o json` fail for everyone,
//! and 200 took a gigabyte of memory and 800 MB of store in 5 s. A
//! registration or a heartbeat's checks past a budget are refused, counted
//! (`gpuctl_refused_messages_total{kind="registration"}`) and change
//! nothing.

use gpuctl_core::limits::{MAX_NODE_BYTES, NODE_SHARE_BYTES};
use gpuctl_proto::pb::{GpuInfo, HostFacts, Node, PreflightCheck, RegisterRequest};
use prost::encoding::{encoded_len_varint, key_len, message};

use super::state::NodeEntry;
use super::{Scheduler, SchedulerConfig};
use crate::error::CoordinatorError;
use crate::refusals::Refused;

/// The bytes every node keeps, summed. It follows the inventory: every
/// node added after the load is admitted here first, so a count that
/// differs from the inventory's means nodes were loaded or removed since,
/// and the sum is taken again (once; removals are made by hand).
#[derive(Debug, Default)]
pub struct Budget {
    nodes: usize,
    bytes: usize,
}

/// What a node keeps that it said itself, as its stored record encodes it
/// (`Node` fields 1, 2, 3 and 10); the rest (state, times, job) is the
/// coordinator's and small.
fn kept(
    name: &str,
    facts: Option<&HostFacts>,
    gpus: &[GpuInfo],
    checks: &[PreflightCheck],
) -> usize {
    key_len(1)
        + encoded_len_varint(name.len() as u64)
        + name.len()
        + facts.map_or(0, |f| message::encoded_len(2, f))
        + message::encoded_len_repeated(3, gpus)
        + message::encoded_len_repeated(10, checks)
}

fn kept_of(n: &Node) -> usize {
    kept(&n.name, n.facts.as_ref(), &n.gpus, &n.preflight)
}

/// Which budget a node would pass, and the sentence that says so.
enum Over {
    Node(String),
    Fleet(String),
}

impl Over {
    fn why(&self) -> &str {
        match self {
            Over::Node(w) | Over::Fleet(w) => w,
        }
    }
}

impl Budget {
    /// Takes a node from `was` bytes to `now`, or says which budget it
    /// would pass.
    fn take(&mut self, cfg: &SchedulerConfig, was: usize, now: usize) -> Result<(), Over> {
        if now > MAX_NODE_BYTES {
            return Err(Over::Node(format!(
                "{now} bytes of facts, GPUs and checks; a node's budget is {MAX_NODE_BYTES} (a real 8-GPU host's registration takes about 3 KiB): shorten its labels or checks"
            )));
        }
        let fleet = cfg.max_nodes.saturating_mul(NODE_SHARE_BYTES);
        let total = (self.bytes.saturating_sub(was)).saturating_add(now);
        if total > fleet {
            return Err(Over::Fleet(format!(
                "the fleet's nodes keep {} bytes; {now} more would pass the fleet's budget of {fleet} (--max-nodes {} × {NODE_SHARE_BYTES}): remove nodes that left (`gpuctl nodes remove NAME`) or start the coordinator with a larger --max-nodes",
                self.bytes, cfg.max_nodes
            )));
        }
        self.bytes = total;
        Ok(())
    }

    /// Whether a heartbeat's checks may replace those `e` keeps; counted
    /// and logged when not (the node is still heard).
    pub fn checks(
        &mut self,
        cfg: &SchedulerConfig,
        e: &NodeEntry,
        checks: &[PreflightCheck],
    ) -> bool {
        let was = kept_of(&e.node);
        let now = was - message::encoded_len_repeated(10, &e.node.preflight)
            + message::encoded_len_repeated(10, checks);
        match self.take(cfg, was, now) {
            Ok(()) => true,
            Err(over) => {
                cfg.refusals.refuse(
                    Refused::Registration,
                    &e.node.name,
                    &format!("heartbeat checks not kept: {}", over.why()),
                );
                false
            }
        }
    }
}

impl Scheduler {
    /// Admits what `req` makes node `name` keep, before anything of it is;
    /// refused past a budget.
    pub(super) fn admit(
        &mut self,
        name: &str,
        req: &RegisterRequest,
    ) -> Result<(), CoordinatorError> {
        if self.budget.nodes != self.nodes.len() {
            self.budget.bytes = self.nodes.values().map(|e| kept_of(&e.node)).sum();
            self.budget.nodes = self.nodes.len();
        }
        let was = self.nodes.get(name).map(|e| kept_of(&e.node));
        let now = kept(name, req.facts.as_ref(), &req.gpus, &req.preflight);
        match self.budget.take(&self.cfg, was.unwrap_or(0), now) {
            Ok(()) => {
                self.budget.nodes += usize::from(was.is_none());
                Ok(())
            }
            Err(over) => {
                self.cfg
                    .refusals
                    .refuse(Refused::Registration, name, over.why());
                Err(match over {
                    Over::Node(message) => CoordinatorError::InvalidField {
                        field: "register".into(),
                        message,
                    },
                    Over::Fleet(why) => CoordinatorError::Refused(why),
                })
            }
        }
    }
}

//! Planning a job off the scheduler's task. A 4,096-node plan (32,768
//! placements, its preflight checks) takes ~20 ms, and `Submit`
//! and `gpuctl plan` held the scheduler for it, every `gpuctl` call
//! waiting. The spec is checked on the task (a bad field is answered at
//! once); the nodes are taken as they are then, shared, and planned on a
//! blocking thread. A submitted job is stored and started when the plan
//! comes back ([`Event::Planned`]); if its nodes changed meanwhile,
//! starting it plans it again on the nodes it gets.

use std::sync::Arc;

use gpuctl_proto::pb::{JobSpec, Node, Plan};

use super::background::{self, off_task};
use super::events::{Event, Reply};
use super::state::NodeEntry;
use super::Scheduler;
use crate::error::CoordinatorError;
use crate::plan::planner;

/// A checked spec and the nodes as they were when it came.
pub struct Planning {
    spec: JobSpec,
    /// Each node with whether it was live and free.
    nodes: Vec<(Arc<Node>, bool, bool)>,
}

impl Planning {
    /// The plan on the nodes the job would get (or, if they are busy, the
    /// ones it would most likely get).
    pub fn run(self) -> Result<Plan, CoordinatorError> {
        let cands: Vec<planner::Candidate<'_>> = self
            .nodes
            .iter()
            .map(|(node, live, free)| planner::Candidate {
                node,
                live: *live,
                free: *free,
            })
            .collect();
        let chosen = match planner::choose(&self.spec, &cands)? {
            Some(c) => c,
            None => planner::likely(&self.spec, &cands),
        };
        Ok(planner::plan(&self.spec, &chosen))
    }
}

impl Scheduler {
    pub(super) fn candidates(&self) -> Vec<planner::Candidate<'_>> {
        self.nodes.values().map(NodeEntry::candidate).collect()
    }

    /// Checks `spec` and takes the nodes as they are now.
    pub(super) fn planning(&self, spec: JobSpec) -> Result<Planning, CoordinatorError> {
        let spec = gpuctl_proto::spec::normalize(&spec)?;
        if !spec.rules.trim().is_empty() {
            self.cfg.perf_rules.overlay(&spec.rules).map_err(|e| {
                CoordinatorError::InvalidField {
                    field: "--rules".into(),
                    message: format!("{e:#}"),
                }
            })?;
        }
        let nodes = self
            .nodes
            .values()
            .map(|e| {
                let c = e.candidate();
                (e.node.clone(), c.live, c.free)
            })
            .collect();
        Ok(Planning { spec, nodes })
    }

    /// Plans `spec` here, on the task (a suite's stage).
    pub(super) fn plan(&self, spec: JobSpec) -> Result<Plan, CoordinatorError> {
        self.planning(spec)?.run()
    }

    /// `gpuctl plan`: answered from a blocking thread.
    pub(super) fn plan_later(&self, spec: JobSpec, reply: Reply<Result<Plan, CoordinatorError>>) {
        match self.planning(spec) {
            Ok(p) => off_task(move || drop(reply.send(p.run()))),
            Err(e) => drop(reply.send(Err(e))),
        }
    }

    /// `Submit`: planned on a blocking thread, then stored and started on
    /// the task ([`Event::Planned`]).
    pub(super) fn submit_later(
        &self,
        spec: JobSpec,
        reply: Reply<Result<gpuctl_proto::pb::Job, CoordinatorError>>,
    ) {
        let planning = match self.planning(spec) {
            Ok(p) => p,
            Err(e) => return drop(reply.send(Err(e))),
        };
        let lane = self.first_lane.clone();
        off_task(move || {
            let plan = planning.run();
            background::send(&lane, Event::Planned { plan, reply });
        });
    }
}

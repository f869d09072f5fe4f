//! Planning a job off the scheduler's task. A 4,096-node plan (32,768
//! placements, its preflight checks) takes ~20 ms, and `Submit`
//! and `gpuctl plan` held the scheduler for it, every `gpuctl` call
//! waiting. The spec is checked on the task (a bad field is answered at
//! once); the nodes are taken as they are then, shared, and planned on a
//! blocking thread. A submitted job is stored and started when the plan
//! comes back ([`JobEvent::Planned`]); if its nodes changed meanwhile,
//! starting it plans it again on the nodes it gets.

use std::sync::Arc;

use gpuctl_proto::pb::{JobSpec, Node, Plan, Verdict};

use super::background::{self, off_task};
use super::events::{JobEvent, Reply};
use super::state::NodeEntry;
use super::views;
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
        let plan = planner::plan(&self.spec, &chosen);
        // What only the nodes tell (their count with `--nodes all`, ranks
        // per node, GPU or CPU ranks and their defaults): a request that
        // cannot run on them is refused before anything runs, not failed
        // on healthy nodes by its workers (issue 47).
        crate::plan::check_request(&self.spec, &plan)?;
        Ok(plan)
    }
}

/// `plan` as a bounded `PlanJob` answer (see `PlanRequest.max_ranks`): the
/// first `max_ranks` ranks, the checks that did not pass, worst first, at
/// most `max_ranks` of them, and counts of what was left out.
pub fn bounded(mut plan: Plan, max_ranks: u32) -> Plan {
    let max = max_ranks as usize;
    if max == 0 || (plan.ranks.len() <= max && plan.checks.len() <= max) {
        return plan;
    }
    // Placements are made in rank order.
    plan.ranks.truncate(max);
    plan.ranks_left_out = plan.world_size.saturating_sub(plan.ranks.len() as u32);
    let (faults, left) = views::not_passing(&plan.checks, max);
    let faulty = plan
        .checks
        .iter()
        .filter(|c| c.verdict() != Verdict::Pass)
        .count();
    plan.faults_left_out = (faulty - faults.len()) as u32;
    plan.passes_left_out = left - plan.faults_left_out;
    plan.checks = faults;
    plan
}

impl Scheduler {
    pub(super) fn candidates(&self) -> Vec<planner::Candidate<'_>> {
        self.nodes.values().map(NodeEntry::candidate).collect()
    }

    /// Checks `spec` and takes the nodes as they are now.
    pub(super) fn planning(&self, spec: JobSpec) -> Result<Planning, CoordinatorError> {
        let spec = gpuctl_core::spec::normalize(&spec)?;
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

    /// `gpuctl plan`: planned whole and bounded (`PlanRequest.max_ranks`)
    /// on a blocking thread, where the whole plan is also dropped.
    pub(super) fn plan_later(
        &self,
        spec: JobSpec,
        max_ranks: u32,
        reply: Reply<Result<Plan, CoordinatorError>>,
    ) {
        match self.planning(spec) {
            Ok(p) => off_task(move || drop(reply.send(p.run().map(|p| bounded(p, max_ranks))))),
            Err(e) => drop(reply.send(Err(e))),
        }
    }

    /// `Submit`: planned on a blocking thread, then stored and started on
    /// the task ([`JobEvent::Planned`]).
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
            background::send(&lane, JobEvent::Planned { plan, reply });
        });
    }
}

#[cfg(test)]
mod tests {
    use gpuctl_proto::pb::{PreflightCheck, RankPlacement};

    use super::*;

    fn check(node: &str, verdict: Verdict) -> PreflightCheck {
        PreflightCheck {
            node: node.into(),
            name: "shm".into(),
            verdict: verdict as i32,
            ..Default::default()
        }
    }

    fn plan(world: u32, checks: Vec<PreflightCheck>) -> Plan {
        Plan {
            ranks: (0..world)
                .map(|rank| RankPlacement {
                    rank,
                    node: format!("n{}", rank / 8),
                    ..Default::default()
                })
                .collect(),
            world_size: world,
            checks,
            ..Default::default()
        }
    }

    #[test]
    fn a_bounded_plan_keeps_the_first_ranks_and_the_worst_checks_and_counts_the_rest() {
        let mut checks: Vec<PreflightCheck> = (0..100)
            .map(|k| check(&format!("n{k}"), Verdict::Pass))
            .collect();
        checks.push(check("n7", Verdict::Warn));
        checks.extend((0..5).map(|k| check(&format!("bad{k}"), Verdict::Fail)));
        let whole = plan(800, checks);
        let b = bounded(whole.clone(), 4);
        let ranks: Vec<u32> = b.ranks.iter().map(|r| r.rank).collect();
        assert_eq!(ranks, [0, 1, 2, 3]);
        assert_eq!((b.world_size, b.ranks_left_out), (800, 796));
        // Four of the five failures, none of the warning or the passes.
        assert_eq!(b.checks.len(), 4);
        assert!(
            b.checks.iter().all(|c| c.verdict() == Verdict::Fail),
            "{b:?}"
        );
        assert_eq!((b.passes_left_out, b.faults_left_out), (100, 2));
        // 0 and a bound the plan fits in leave it whole.
        assert_eq!(bounded(whole.clone(), 0), whole);
        assert_eq!(bounded(whole.clone(), 1_000), whole);
    }
}

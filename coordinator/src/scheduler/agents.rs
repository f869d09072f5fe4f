//! Agents and their sessions: registration (and the adoption of jobs whose
//! workers an agent kept while the coordinator was away), the session that
//! carries assignments down and heartbeats up, acknowledgements of
//! assignments, nodes that fall silent, and the pace the fleet's size sets
//! for all of them (`fleet/pace.rs`).

use std::sync::Arc;

use gpuctl_proto::pb::{
    coordinator_message, AssignmentAck, CoordinatorMessage, Heartbeat, JobState, Node, NodeState,
    RegisterRequest, RegisterResponse,
};
use tracing::{debug, info, warn};

use super::events::{AgentEvent, SessionTx};
use super::state::{NodeEntry, Session};
use super::{human, Scheduler};
use crate::error::CoordinatorError;
use crate::fleet::NodeEvent;
use crate::plan::planner;
use crate::store::Batch;

/// A node still running a job this long after it ended is told again to stop.
const STALE_JOB_MS: u64 = 5_000;

impl Scheduler {
    /// What agents send, in the order below, and a person's removal of a
    /// node; the tick's share (nodes gone silent, jobs awaiting adoption)
    /// comes last.
    pub(super) async fn on_agent(&mut self, ev: AgentEvent) {
        match ev {
            AgentEvent::AgentRegistered {
                req,
                coordinator_url,
                reply,
            } => {
                let _ = reply.send(self.register(req, coordinator_url).await);
            }
            AgentEvent::SessionOpened {
                node,
                session,
                tx,
                first,
                reply,
            } => {
                let _ = reply.send(self.session_opened(node, session, tx, first));
            }
            AgentEvent::Heartbeat { node, session, hb } => self.heartbeat(node, session, hb),
            AgentEvent::SessionClosed { node, session, why } => {
                self.session_closed(node, session, &why)
            }
            AgentEvent::AssignmentAck { node, ack } => self.assignment_ack(node, ack).await,
            AgentEvent::RemoveNode { name, reply } => {
                let _ = reply.send(self.remove_node(&name).await);
            }
        }
    }

    async fn register(
        &mut self,
        req: RegisterRequest,
        url: String,
    ) -> Result<RegisterResponse, CoordinatorError> {
        let name = req.name.trim().to_string();
        if name.is_empty() {
            return Err(CoordinatorError::InvalidField {
                field: "name".into(),
                message: "the node name is empty; start the agent with --name NAME".into(),
            });
        }
        gpuctl_core::limits::register(&req)?;
        if !self.nodes.contains_key(&name) && self.nodes.len() >= self.cfg.max_nodes {
            return Err(CoordinatorError::FleetFull {
                max: self.cfg.max_nodes,
            });
        }
        self.admit(&name, &req)?;
        let now = self.cfg.clock.now_ms();
        let entry = self
            .nodes
            .entry(name.clone())
            .or_insert_with(|| NodeEntry::detached(Node::default()));
        // The job this node was part of: kept across a lost session and a
        // coordinator restart, so that the agent can hand its workers back.
        let prior = std::mem::take(&mut entry.node_mut().current_job);
        let changed = super::inventory::change(&entry.node, &req);
        let mut node = Node {
            name: name.clone(),
            facts: req.facts,
            gpus: req.gpus,
            state: NodeState::Ready as i32,
            last_heartbeat_unix_ms: now,
            current_job: String::new(),
            slots: 0,
            registered_unix_ms: now,
            state_reason: String::new(),
            preflight: req.preflight,
        };
        node.slots = planner::slots(&node);
        entry.set_node(node, &self.listing);
        entry.session = None;
        entry.coordinator_url = url.clone();

        // What the agent still runs: the job this node is part of is adopted
        // when the coordinator knows it as running under that attempt; the
        // rest is refused, and the agent stops it.
        let (mut adopted, mut refused) = (Vec::new(), Vec::new());
        for rj in &req.running {
            let adopt = rj.job_id == prior
                && self.jobs.get(&rj.job_id).is_some_and(|j| {
                    j.state() == JobState::Running
                        && j.job.attempt == rj.attempt
                        && j.job.plan.iter().any(|p| p.nodes.contains(&name))
                });
            if adopt {
                adopted.push(rj.job_id.clone());
            } else if !refused.contains(&rj.job_id) {
                refused.push(rj.job_id.clone());
            }
        }
        // Without the job's workers the node is still part of it when each
        // of its ranks delivered a result (the workers ended while the
        // coordinator was away); else the job cannot finish.
        let interrupted = if prior.is_empty() || adopted.contains(&prior) {
            None
        } else {
            match self.jobs.get(&prior) {
                Some(j) if j.state() == JobState::Running => {
                    let done = j
                        .job
                        .plan
                        .iter()
                        .flat_map(|p| &p.ranks)
                        .filter(|p| p.node == name)
                        .all(|p| j.results.contains_key(&p.rank));
                    (!done).then(|| prior.clone())
                }
                _ => None,
            }
        };
        let keep = !prior.is_empty()
            && interrupted.is_none()
            && self
                .jobs
                .get(&prior)
                .is_some_and(|j| j.state() == JobState::Running);
        let entry = self.nodes.get_mut(&name).expect("inserted above");
        let job = if keep { prior.as_str() } else { "" };
        entry.on(NodeEvent::Registered { job }, now, &self.listing);
        let mut batch = Batch::default().node(&entry.node);
        if let Some(why) = changed {
            warn!(node = %name, "{why}");
            batch = batch.acceptance(&super::inventory::finding(&name, &why, now));
        }
        info!(node = %name, slots = entry.node.slots, gpus = entry.node.gpus.len(), ?adopted, ?refused, "agent registered");
        self.save(batch);
        for id in &adopted {
            info!(node = %name, job = %id, "job adopted: the agent kept its workers running");
        }
        if let Some(id) = interrupted {
            self.finish(
                &id,
                JobState::Failed,
                format!(
                    "node {name} registered again without the job's workers (its agent restarted, or stopped them after losing the coordinator)"
                ),
                Some(&name),
            )
            .await;
        }
        self.repace();
        Ok(RegisterResponse {
            name,
            heartbeat_interval_ms: self.cfg.heartbeat_interval.as_millis() as u32,
            pace: Some(self.pace.to_proto()),
            protocol_version: gpuctl_proto::PROTOCOL_VERSION,
            coordinator_url: url,
            adopted,
            refused,
        })
    }

    fn session_opened(
        &mut self,
        node: String,
        id: u64,
        tx: SessionTx,
        first: Heartbeat,
    ) -> Result<(), CoordinatorError> {
        let Some(e) = self.nodes.get_mut(&node) else {
            return Err(CoordinatorError::Refused(format!(
                "node `{node}` is not registered with this coordinator; the agent must call Register before opening a session"
            )));
        };
        if e.coordinator_url.is_empty() {
            return Err(CoordinatorError::Refused(format!(
                "node `{node}` was registered with an earlier coordinator run; the agent must call Register again"
            )));
        }
        e.session = Some(Session { id, tx });
        let heard = first.unix_ms;
        if e.on(
            NodeEvent::SessionOpened {
                heard_unix_ms: heard,
            },
            self.cfg.clock.now_ms(),
            &self.listing,
        )
        .save
        {
            let batch = Batch::default().node(&e.node);
            self.save(batch);
        }
        info!(node = %node, session = id, "agent session open");
        Ok(())
    }

    fn heartbeat(&mut self, node: String, session: u64, hb: Heartbeat) {
        let now = self.cfg.clock.now_ms();
        let Some(e) = self.nodes.get_mut(&node) else {
            return;
        };
        if e.session.as_ref().map(|s| s.id) != Some(session) {
            return; // a replaced session still draining
        }
        if let Err(why) = gpuctl_core::limits::heartbeat(&hb) {
            // Not heard: a node that keeps sending these goes lost, named.
            warn!(node = %node, "heartbeat refused: {why}");
            return;
        }
        let fx = e.on(NodeEvent::Heard, now, &self.listing);
        if !hb.preflight.is_empty() && self.budget.checks(&self.cfg, e, &hb.preflight) {
            // Kept in memory: the next registration or state change stores it.
            e.node_mut().preflight = hb.preflight;
        }
        if let Some(what) = &fx.log {
            info!(node = %node, "{what}");
        }
        if fx.save {
            let batch = Batch::default().node(&e.node);
            self.save(batch);
        }
        // The workers' process states, for telling a hung rank from those
        // waiting on it; only for ranks planned on this node, so that a
        // heartbeat cannot grow the map.
        for rj in &hb.running {
            if let Some(j) = self.jobs.get_mut(&rj.job_id) {
                if j.job.attempt == rj.attempt && j.state() == JobState::Running {
                    for p in &rj.processes {
                        if j.placement(p.rank).is_some_and(|pl| pl.node == node) {
                            j.watch.processes.insert(p.rank, p.clone());
                        }
                    }
                }
            }
        }
        let Some(e) = self.nodes.get(&node) else {
            return;
        };
        // Workers of a job that is over (or unknown) are told again to stop.
        for rj in &hb.running {
            let stale = match self.jobs.get(&rj.job_id) {
                None => true,
                Some(j) => {
                    j.job.attempt != rj.attempt
                        || (j.state().is_terminal()
                            && now.saturating_sub(j.job.finished_unix_ms) > STALE_JOB_MS)
                }
            };
            if stale {
                debug!(node = %node, job = %rj.job_id, "node still runs an ended job; cancelling again");
                e.send_cancel(&rj.job_id, rj.attempt, "the job is over");
            }
        }
    }

    fn session_closed(&mut self, node: String, session: u64, why: &str) {
        if let Some(e) = self.nodes.get_mut(&node) {
            if e.session.as_ref().map(|s| s.id) == Some(session) {
                e.session = None;
                if crate::burst::SESSIONS_CLOSED.each(&node, 1) {
                    warn!(node = %node, "agent session closed ({why}); the node is lost unless it reconnects within the node timeout");
                }
            }
        }
    }

    async fn assignment_ack(&mut self, node: String, ack: AssignmentAck) {
        // Only a node the job was assigned to may say how its start went.
        if self
            .jobs
            .get(&ack.job_id)
            .is_some_and(|j| j.job.attempt == ack.attempt && !j.has_node(&node))
        {
            self.cfg.refusals.refuse(
                crate::refusals::Refused::Ack,
                &node,
                &format!(
                    "node {node} acknowledged {} attempt {}, which was not assigned to it",
                    ack.job_id, ack.attempt
                ),
            );
            return;
        }
        let running = match self.jobs.get_mut(&ack.job_id) {
            Some(j) if j.state() == JobState::Running && j.job.attempt == ack.attempt => {
                // The node's preflight at job start replaces the one from registration.
                j.job.start_checks.retain(|c| c.node != node);
                j.job
                    .start_checks
                    .extend(ack.checks.iter().cloned().map(|mut c| {
                        c.node = node.clone();
                        c
                    }));
                true
            }
            _ => false,
        };
        if ack.ok {
            debug!(node = %node, job = %ack.job_id, checks = ack.checks.len(), "assignment acknowledged");
            return;
        }
        if running {
            let msg = format!("node {node} could not start the workers: {}", ack.error);
            self.finish(&ack.job_id, JobState::Failed, msg, Some(&node))
                .await;
        }
    }

    /// Forgets a node that runs no job. A live agent's session ends with
    /// it; such an agent registers again by itself.
    async fn remove_node(&mut self, name: &str) -> Result<Node, CoordinatorError> {
        let Some(e) = self.nodes.get(name) else {
            return Err(CoordinatorError::NodeNotFound(name.to_string()));
        };
        if !e.node.current_job.is_empty() {
            return Err(CoordinatorError::Refused(format!(
                "node {name} is running {}; cancel it first (gpuctl cancel {})",
                e.node.current_job, e.node.current_job
            )));
        }
        self.store
            .delete_node(name)
            .await
            .map_err(|err| CoordinatorError::store("could not remove the node", err))?;
        let removed = self
            .nodes
            .remove(name)
            .map(|e| Arc::unwrap_or_clone(e.node))
            .unwrap_or_default();
        self.listing.changed();
        info!(node = %name, "node removed");
        self.repace();
        Ok(removed)
    }

    /// Tells every session the fleet's pace when its size has changed it.
    /// A node registering now hears it in its RegisterResponse.
    fn repace(&mut self) {
        let pace = crate::fleet::pace::pace(
            self.nodes.len(),
            self.cfg.agent_messages_per_s,
            self.cfg.node_timeout,
        );
        if pace == self.pace {
            return;
        }
        self.pace = pace;
        info!(
            nodes = self.nodes.len(),
            heartbeat = %human(pace.heartbeat),
            telemetry_send = %human(pace.telemetry_send),
            "the fleet's size changed its pace; telling every agent"
        );
        let queue = gpuctl_core::listen::queue();
        if let Some(why) = gpuctl_core::listen::too_short_for(self.nodes.len(), queue) {
            warn!("{why}");
        }
        let msg = CoordinatorMessage {
            msg: Some(coordinator_message::Msg::Pace(pace.to_proto())),
        };
        for e in self.nodes.values() {
            e.send(msg.clone());
        }
    }

    /// Nodes without a heartbeat for the node timeout are lost, and so is the
    /// job each was running.
    pub(super) async fn lose_silent_nodes(&mut self) {
        let now = self.cfg.clock.now_ms();
        let timeout = self.cfg.node_timeout;
        let mut lost = Vec::new();
        for (name, e) in self.nodes.iter_mut() {
            let fx = e.on(NodeEvent::Tick { timeout }, now, &self.listing);
            if fx.save {
                lost.push((name.clone(), fx, e.node.clone()));
            }
        }
        for (name, fx, node) in lost {
            if let Some(what) = &fx.log {
                if crate::burst::NODES_LOST.each(&name, 1) {
                    warn!(node = %name, "{what}");
                }
            }
            self.save(Batch::default().node(&node));
            if let Some((job, why)) = fx.fail_job {
                let msg = format!("node {name} lost: {why}");
                self.finish(&job, JobState::Failed, msg, Some(&name)).await;
            }
        }
        self.check_adoptions().await;
    }

    /// Jobs found running at load: done once every node came back (or every
    /// rank has a result); failed, naming the nodes still missing, when the
    /// adopt grace has passed.
    pub(super) async fn check_adoptions(&mut self) {
        let now = self.cfg.clock.now_ms();
        let ids: Vec<String> = self.adopting.keys().cloned().collect();
        for id in ids {
            if self.judge_if_complete(&id) {
                self.adopting.remove(&id);
                continue;
            }
            let Some(j) = self
                .jobs
                .get(&id)
                .filter(|j| j.state() == JobState::Running)
            else {
                self.adopting.remove(&id);
                continue;
            };
            let missing: Vec<String> = j
                .job
                .plan
                .iter()
                .flat_map(|p| &p.nodes)
                .filter(|n| self.nodes.get(*n).is_none_or(|e| e.lost()))
                .cloned()
                .collect();
            if missing.is_empty() {
                info!(job = %id, "job adopted: every node came back");
                self.adopting.remove(&id);
            } else if now >= self.adopting[&id] {
                self.adopting.remove(&id);
                let msg = format!(
                    "{} {} did not come back within {} of the coordinator restart",
                    if missing.len() == 1 { "node" } else { "nodes" },
                    gpuctl_core::listing::names(&missing),
                    human(self.cfg.adopt_grace)
                );
                self.finish(&id, JobState::Failed, msg, None).await;
            }
        }
    }
}

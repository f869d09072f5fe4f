//! A started job's assignments, one per node, built off the scheduler's
//! task and sent from it. At 4,096 nodes building them (each node's
//! placements, the spec and environment, a secret per rank) held the
//! scheduler 66-90 ms of a ~130 ms `Submit`, every `gpuctl` call waiting.
//! They are still sent from the task, in order with everything else it sends
//! a node: a cancel that comes first leaves them unsent.

use std::collections::HashMap;

use gpuctl_core::auth::JobSecrets;
use gpuctl_proto::pb::coordinator_message::Msg;
use gpuctl_proto::pb::{Assignment, CoordinatorMessage, JobSpec, Plan};

/// What every node's assignment of one job attempt is made of.
pub struct AssignmentInputs {
    pub job_id: String,
    pub attempt: u32,
    pub spec: JobSpec,
    pub plan: Plan,
    pub deadline_unix_ms: u64,
    pub secrets: JobSecrets,
    /// Each planned node the scheduler knows, with the coordinator URL its
    /// agent reached.
    pub nodes: Vec<(String, String)>,
}

impl AssignmentInputs {
    /// Each node's assignment message, in plan order.
    pub fn build(self) -> Vec<(String, CoordinatorMessage)> {
        let env: HashMap<String, String> = self
            .plan
            .env
            .iter()
            .map(|e| (e.name.clone(), e.value.clone()))
            .collect();
        let by_node = self.plan.ranks_by_node();
        let node_rank: HashMap<&str, u32> = self
            .plan
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.as_str(), i as u32))
            .collect();
        let mut out = Vec::with_capacity(self.nodes.len());
        for (name, coordinator_url) in &self.nodes {
            let ranks: Vec<_> = by_node
                .get(name.as_str())
                .into_iter()
                .flatten()
                .map(|r| (*r).clone())
                .collect();
            let a = Assignment {
                job_id: self.job_id.clone(),
                attempt: self.attempt,
                spec: Some(self.spec.clone()),
                rank_secrets: ranks
                    .iter()
                    .map(|r| (r.rank, self.secrets.of(r.rank)))
                    .collect(),
                ranks,
                env: env.clone(),
                world_size: self.plan.world_size,
                node_rank: node_rank.get(name.as_str()).copied().unwrap_or(0),
                nnodes: self.plan.nodes.len() as u32,
                master_addr: self.plan.master_addr.clone(),
                master_port: self.plan.master_port,
                deadline_unix_ms: self.deadline_unix_ms,
                coordinator_url: coordinator_url.clone(),
                coordinator_urls: Vec::new(),
            };
            let msg = CoordinatorMessage {
                msg: Some(Msg::Assignment(a)),
            };
            out.push((name.clone(), msg));
        }
        out
    }
}

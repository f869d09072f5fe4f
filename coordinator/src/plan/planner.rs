//! Job planning, free of I/O: which nodes a job gets, the rank table, the
//! environment with a reason for every variable, and the preflight checks of
//! [`super::preflight`]. The Plan RPC and Submit both come through here, so a
//! dry run shows exactly what a submit would do.

use std::collections::{BTreeMap, HashSet};

use gpuctl_core::spec::{parse_selector, Selector};
use gpuctl_proto::pb::{EnvVar, JobSpec, Node, Plan, RankPlacement};

use super::{memory, nccl_env, preflight};
use crate::error::CoordinatorError;

/// torchrun's default rendezvous port.
pub const MASTER_PORT: u32 = 29500;

/// The reason a reason-carrying env var got its value from the user.
pub const USER_ENV_REASON: &str = "set by --env";

/// A node as the planner sees it.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    pub node: &'a Node,
    /// Heartbeating (not lost).
    pub live: bool,
    /// Live, connected and running nothing.
    pub free: bool,
}

/// Ranks a node runs: one per GPU, else the CPU ranks its agent offers.
pub fn slots(node: &Node) -> u32 {
    if !node.gpus.is_empty() {
        node.gpus.len() as u32
    } else {
        node.facts.as_ref().map_or(1, |f| f.cpu_ranks).max(1)
    }
}

pub fn selectors(spec: &JobSpec) -> Result<Vec<Selector>, CoordinatorError> {
    Ok(spec
        .selectors
        .iter()
        .map(|s| parse_selector(s))
        .collect::<Result<_, _>>()?)
}

/// `JobSpec.only_nodes` as a set (empty: any node).
fn only_nodes(spec: &JobSpec) -> HashSet<&str> {
    spec.only_nodes.iter().map(String::as_str).collect()
}

/// Whether a node may run the job: it matches every selector and, when the
/// job names its nodes (a suite's stage), is one of them.
fn in_scope(sel: &[Selector], only: &HashSet<&str>, node: &Node) -> bool {
    (only.is_empty() || only.contains(node.name.as_str())) && sel.iter().all(|s| s.matches(node))
}

fn names(nodes: &[&Node]) -> String {
    const SHOWN: usize = 8;
    let mut s: Vec<&str> = nodes.iter().take(SHOWN).map(|n| n.name.as_str()).collect();
    let more = nodes.len().saturating_sub(SHOWN);
    let more_text = format!("{more} more");
    if more > 0 {
        s.push(&more_text);
    }
    s.join(", ")
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Picks the nodes for a job. `Ok(None)`: enough nodes match but too few are
/// free now, so the job waits. Chosen nodes come back sorted by name.
pub fn choose<'a>(
    spec: &JobSpec,
    candidates: &[Candidate<'a>],
) -> Result<Option<Vec<&'a Node>>, CoordinatorError> {
    let sel = selectors(spec)?;
    let only = only_nodes(spec);
    let mut all: Vec<&Candidate<'a>> = candidates
        .iter()
        .filter(|c| in_scope(&sel, &only, c.node))
        .collect();
    all.sort_by(|a, b| a.node.name.cmp(&b.node.name));
    let live: Vec<&Node> = all.iter().filter(|c| c.live).map(|c| c.node).collect();
    let lost: Vec<&Node> = all.iter().filter(|c| !c.live).map(|c| c.node).collect();
    let want = if spec.all_nodes {
        live.len().max(1)
    } else {
        spec.node_count as usize
    };
    if live.len() < want {
        let asked = if spec.all_nodes {
            "all nodes".to_string()
        } else {
            plural(want, "node", "nodes")
        };
        let matching = if sel.is_empty() {
            String::new()
        } else {
            format!(" matching {}", spec.selectors.join(", "))
        };
        let verb = if live.len() == 1 { "matches" } else { "match" };
        let mut msg = format!(
            "asked for {asked}{matching}, {} {verb}",
            plural(live.len(), "registered node", "registered nodes")
        );
        if !live.is_empty() {
            msg += &format!(" ({})", names(&live));
        }
        if !lost.is_empty() {
            msg += &format!(
                "; {} lost ({})",
                plural(lost.len(), "matching node is", "matching nodes are"),
                names(&lost)
            );
        }
        return Err(CoordinatorError::NotEnoughNodes(msg));
    }
    let free: Vec<&Node> = all.iter().filter(|c| c.free).map(|c| c.node).collect();
    if free.len() < want {
        return Ok(None);
    }
    Ok(Some(free.into_iter().take(want).collect()))
}

/// The nodes a waiting job would most likely get, for preflight checks at submit.
pub fn likely<'a>(spec: &JobSpec, candidates: &[Candidate<'a>]) -> Vec<&'a Node> {
    let Ok(sel) = selectors(spec) else {
        return Vec::new();
    };
    let only = only_nodes(spec);
    let mut live: Vec<&Node> = candidates
        .iter()
        .filter(|c| c.live && in_scope(&sel, &only, c.node))
        .map(|c| c.node)
        .collect();
    live.sort_by(|a, b| a.name.cmp(&b.name));
    if !spec.all_nodes {
        live.truncate(spec.node_count as usize);
    }
    live
}

/// The full plan for a job on the chosen nodes.
pub fn plan(spec: &JobSpec, chosen: &[&Node]) -> Plan {
    let mut nodes: Vec<&Node> = chosen.to_vec();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let mut ranks = Vec::new();
    let mut next = 0u32;
    for (node_rank, node) in nodes.iter().enumerate() {
        let per_node = match spec.gpus_per_node {
            0 => slots(node),
            n => slots(node).min(n),
        };
        for local_rank in 0..per_node {
            let (gpu_index, gpu_uuid, device_name) = match node.gpus.get(local_rank as usize) {
                Some(g) => (Some(g.index), g.uuid.clone(), g.name.clone()),
                None => (
                    None,
                    String::new(),
                    node.facts
                        .as_ref()
                        .map(|f| f.cpu_model.clone())
                        .unwrap_or_default(),
                ),
            };
            ranks.push(RankPlacement {
                rank: next,
                local_rank,
                node_rank: node_rank as u32,
                node: node.name.clone(),
                gpu_index,
                gpu_uuid,
                device_name,
            });
            next += 1;
        }
    }
    let master_addr = nodes
        .first()
        .and_then(|n| n.facts.as_ref())
        .and_then(|f| f.addresses.first().cloned())
        .unwrap_or_else(|| "127.0.0.1".to_string());
    let (nccl, nccl_checks) = nccl_env::planned(&nodes);
    let mut checks = preflight::checks(&nodes);
    checks.extend(nccl_checks);
    checks.extend(nccl_env::check_overrides(&spec.env, &nodes));
    checks.extend(memory::checks(spec, &nodes, &ranks));
    Plan {
        nodes: nodes.iter().map(|n| n.name.clone()).collect(),
        ranks,
        env: env(nccl, spec, &nodes),
        world_size: next,
        master_addr,
        master_port: MASTER_PORT,
        checks,
        spec: Some(spec.clone()),
        ..Default::default()
    }
}

/// The planned environment, one reason per variable; `--env` wins last.
/// `nccl` is NCCL's part ([`nccl_env::planned`]), made once for the plan's
/// checks and its environment.
pub fn env(mut out: Vec<EnvVar>, spec: &JobSpec, nodes: &[&Node]) -> Vec<EnvVar> {
    // CPU ranks share the host's cores; without a cap every rank's OpenMP pool
    // grabs them all and they thrash. Nodes on one host (a local fleet, agents
    // in containers) share its cores too, so ranks are counted per kernel
    // (its boot id), else per hostname: containers and namespaces have host
    // names of their own. Three Slurm nodes in namespaces on 2 cores, counted
    // by host name, ran 2 threads each and every rank's GEMM intervals swung
    // tenfold (0.003 against 0.03 TFLOP/s), a healthy node's median to 0.23x.
    let host = |n: &Node| {
        n.facts
            .as_ref()
            .and_then(|f| {
                [&f.boot_id, &f.hostname]
                    .into_iter()
                    .find(|h| !h.is_empty())
            })
            .cloned()
            .unwrap_or_else(|| n.name.clone())
    };
    let hostname = |n: &Node| {
        n.facts
            .as_ref()
            .map(|f| f.hostname.clone())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| n.name.clone())
    };
    let mut ranks_on: BTreeMap<String, u32> = BTreeMap::new();
    for n in nodes.iter().filter(|n| n.gpus.is_empty()) {
        *ranks_on.entry(host(n)).or_default() += slots(n);
    }
    let share = |n: &Node| {
        let cpus = n.facts.as_ref().map_or(1, |f| f.cpu_count).max(1);
        let ranks = ranks_on.get(&host(n)).copied().unwrap_or(1).max(1);
        (cpus, ranks)
    };
    let cpu_threads = nodes
        .iter()
        .filter(|n| n.gpus.is_empty())
        .map(|n| {
            let (cpus, ranks) = share(n);
            (cpus / ranks).max(1)
        })
        .min();
    if let Some(threads) = cpu_threads {
        let detail: Vec<String> = nodes
            .iter()
            .filter(|n| n.gpus.is_empty())
            .take(4)
            .map(|n| {
                let (cpus, ranks) = share(n);
                if ranks > slots(n) {
                    format!(
                        "{}: {cpus} CPUs / {ranks} ranks on host {}",
                        n.name,
                        hostname(n)
                    )
                } else {
                    format!("{}: {cpus} CPUs / {ranks} ranks", n.name)
                }
            })
            .collect();
        out.push(EnvVar {
            name: "OMP_NUM_THREADS".into(),
            value: threads.to_string(),
            reason: format!("CPU ranks split the cores ({})", detail.join(", ")),
        });
    }
    let user: BTreeMap<&String, &String> = spec.env.iter().collect();
    for (name, value) in user {
        out.retain(|v| &v.name != name);
        out.push(EnvVar {
            name: name.clone(),
            value: value.clone(),
            reason: USER_ENV_REASON.into(),
        });
    }
    out
}

#[cfg(test)]
mod tests;

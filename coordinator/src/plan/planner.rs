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
mod tests {
    use super::*;
    use crate::plan::preflight::preflight_error;
    use gpuctl_proto::pb::HostFacts;
    use gpuctl_proto::pb::{PreflightCheck, Verdict};

    fn cpu_node(name: &str, cpu_ranks: u32, cpus: u32, ib: bool) -> Node {
        Node {
            name: name.into(),
            facts: Some(HostFacts {
                hostname: name.into(),
                addresses: vec![format!("10.0.0.{}", name.len())],
                cpu_count: cpus,
                cpu_ranks,
                cpu_model: "Xeon".into(),
                ib_devices: if ib { vec!["mlx5_0".into()] } else { vec![] },
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn gpu_node(name: &str, gpus: u32, rack: &str) -> Node {
        let mut n = cpu_node(name, 1, 64, true);
        let f = n.facts.as_mut().unwrap();
        f.labels.insert("rack".into(), rack.into());
        f.shm_bytes = 16 << 30;
        n.gpus = gpuctl_testkit::gpu::infos(name, gpus);
        n
    }

    fn spec(nodes: u32) -> JobSpec {
        JobSpec {
            workload: "stress".into(),
            node_count: nodes,
            ..Default::default()
        }
    }

    fn free(nodes: &[Node]) -> Vec<Candidate<'_>> {
        nodes
            .iter()
            .map(|node| Candidate {
                node,
                live: true,
                free: true,
            })
            .collect()
    }

    #[test]
    fn ranks_follow_sorted_node_names() {
        let nodes = [gpu_node("b", 2, "r1"), gpu_node("a", 2, "r1")];
        let chosen = choose(&spec(2), &free(&nodes)).unwrap().unwrap();
        let p = plan(&spec(2), &chosen);
        assert_eq!(p.nodes, vec!["a", "b"]);
        assert_eq!(p.world_size, 4);
        let labels: Vec<String> = p.ranks.iter().map(|r| r.device_label()).collect();
        let table: Vec<(u32, u32, u32, &str, &str)> = p
            .ranks
            .iter()
            .zip(&labels)
            .map(|(r, l)| {
                (
                    r.rank,
                    r.node_rank,
                    r.local_rank,
                    r.node.as_str(),
                    l.as_str(),
                )
            })
            .collect();
        assert_eq!(
            table,
            vec![
                (0, 0, 0, "a", "cuda:0"),
                (1, 0, 1, "a", "cuda:1"),
                (2, 1, 0, "b", "cuda:0"),
                (3, 1, 1, "b", "cuda:1"),
            ]
        );
        assert_eq!(p.ranks[3].gpu_uuid, "GPU-b-1");
        assert_eq!(p.ranks[3].device_name, "NVIDIA H200");
        assert_eq!(p.master_addr, "10.0.0.1");
        assert_eq!(p.master_port, 29500);
    }

    #[test]
    fn uneven_slots_hand_out_ranks_in_node_order() {
        let nodes = [cpu_node("n1", 3, 6, false), cpu_node("n0", 1, 4, false)];
        let p = plan(&spec(2), &[&nodes[0], &nodes[1]]);
        let labels: Vec<String> = p.ranks.iter().map(|r| r.device_label()).collect();
        let table: Vec<(u32, &str, u32, &str)> = p
            .ranks
            .iter()
            .zip(&labels)
            .map(|(r, l)| (r.rank, r.node.as_str(), r.local_rank, l.as_str()))
            .collect();
        assert_eq!(
            table,
            vec![
                (0, "n0", 0, "cpu"),
                (1, "n1", 0, "cpu"),
                (2, "n1", 1, "cpu"),
                (3, "n1", 2, "cpu")
            ]
        );
        assert_eq!(p.ranks[0].device_name, "Xeon");
    }

    #[test]
    fn env_has_reasons_and_user_overrides_last() {
        let nodes = [cpu_node("n0", 2, 8, true), cpu_node("n1", 2, 2, false)];
        let mut s = spec(2);
        let p = plan(&s, &[&nodes[0], &nodes[1]]);
        let ib = p
            .env
            .iter()
            .find(|e| e.name == "NCCL_IB_DISABLE")
            .expect("IB disabled");
        assert_eq!(ib.value, "1");
        assert!(
            ib.reason.contains("n1") && !ib.reason.contains("n0"),
            "{}",
            ib.reason
        );
        let omp = p.env.iter().find(|e| e.name == "OMP_NUM_THREADS").unwrap();
        assert_eq!(omp.value, "1", "2 CPUs / 2 ranks on n1 is the tightest");

        // Two nodes on one host (a local fleet) split its cores between them.
        let mut a = cpu_node("a", 1, 8, false);
        let mut b = cpu_node("b", 1, 8, false);
        for n in [&mut a, &mut b] {
            n.facts.as_mut().unwrap().hostname = "box".into();
        }
        let omp = env(Vec::new(), &s, &[&a, &b]);
        let omp = omp.iter().find(|e| e.name == "OMP_NUM_THREADS").unwrap();
        assert_eq!(omp.value, "4", "{}", omp.reason);
        assert!(omp.reason.contains("on host box"), "{}", omp.reason);

        // Namespaces or containers with host names of their own on one
        // kernel share its cores as well; other kernels do not.
        let mut c = cpu_node("c", 1, 8, false);
        for (n, name) in [(&mut a, "ns-a"), (&mut b, "ns-b"), (&mut c, "other")] {
            n.facts.as_mut().unwrap().hostname = name.into();
        }
        a.facts.as_mut().unwrap().boot_id = "k1".into();
        b.facts.as_mut().unwrap().boot_id = "k1".into();
        c.facts.as_mut().unwrap().boot_id = "k2".into();
        let omp = env(Vec::new(), &s, &[&a, &b, &c]);
        let omp = omp.iter().find(|e| e.name == "OMP_NUM_THREADS").unwrap();
        assert_eq!(omp.value, "4", "{}", omp.reason);
        assert!(
            omp.reason.contains("a: 8 CPUs / 2 ranks on host ns-a"),
            "{}",
            omp.reason
        );
        assert!(omp.reason.contains("c: 8 CPUs / 1 ranks"), "{}", omp.reason);

        s.env.insert("OMP_NUM_THREADS".into(), "7".into());
        s.env.insert("NCCL_DEBUG".into(), "INFO".into());
        let p = plan(&s, &[&nodes[0], &nodes[1]]);
        let omp: Vec<&EnvVar> = p
            .env
            .iter()
            .filter(|e| e.name == "OMP_NUM_THREADS")
            .collect();
        assert_eq!(omp.len(), 1);
        assert_eq!(
            (omp[0].value.as_str(), omp[0].reason.as_str()),
            ("7", USER_ENV_REASON)
        );
        assert_eq!(p.env.last().unwrap().name, "OMP_NUM_THREADS");
        assert!(p
            .env
            .iter()
            .any(|e| e.name == "NCCL_DEBUG" && e.reason == USER_ENV_REASON));

        // Every node with InfiniBand and GPUs: neither variable is planned.
        let gpus = [gpu_node("g0", 2, "r1")];
        let p = plan(&spec(1), &[&gpus[0]]);
        assert!(p.env.is_empty(), "{:?}", p.env);
    }

    #[test]
    fn gpus_per_node_takes_the_first_gpus_of_every_node() {
        let nodes = [gpu_node("a", 8, "r1"), gpu_node("b", 8, "r1")];
        let mut s = spec(2);
        s.gpus_per_node = 1;
        let p = plan(&s, &[&nodes[0], &nodes[1]]);
        assert_eq!(p.world_size, 2);
        let placed: Vec<(u32, &str, Option<u32>)> = p
            .ranks
            .iter()
            .map(|r| (r.rank, r.node.as_str(), r.gpu_index))
            .collect();
        assert_eq!(placed, vec![(0, "a", Some(0)), (1, "b", Some(0))]);
        s.gpus_per_node = 99;
        assert_eq!(plan(&s, &[&nodes[0], &nodes[1]]).world_size, 16);
    }

    #[test]
    fn selectors_filter_and_shortfalls_are_named() {
        let nodes = [
            gpu_node("a", 1, "r1"),
            gpu_node("b", 1, "r2"),
            gpu_node("c", 1, "r1"),
            gpu_node("d", 1, "r1"),
        ];
        let mut cands = free(&nodes);
        let mut s = spec(2);
        s.selectors = vec!["rack=r1".into()];
        let got: Vec<&str> = choose(&s, &cands)
            .unwrap()
            .unwrap()
            .iter()
            .map(|n| n.name.as_str())
            .collect();
        assert_eq!(got, vec!["a", "c"]);

        s.selectors = vec!["rack!=r1".into()];
        let err = choose(&s, &cands).unwrap_err().to_string();
        assert_eq!(
            err,
            "asked for 2 nodes matching rack!=r1, 1 registered node matches (b)"
        );

        let err = choose(&spec(5), &cands).unwrap_err();
        assert_eq!(
            err.to_string(),
            "asked for 5 nodes, 4 registered nodes match (a, b, c, d)"
        );
        assert!(
            matches!(err, CoordinatorError::NotEnoughNodes(_)),
            "{err:?}"
        );

        // Busy nodes make the job wait; lost nodes do not count at all.
        cands[0].free = false;
        cands[1].free = false;
        cands[2].free = false;
        assert!(choose(&spec(2), &cands).unwrap().is_none());
        cands[3].live = false;
        cands[3].free = false;
        let err = choose(&spec(4), &cands).unwrap_err().to_string();
        assert!(
            err.contains("3 registered nodes match") && err.contains("1 matching node is lost (d)"),
            "{err}"
        );

        let mut all = spec(0);
        all.all_nodes = true;
        all.selectors = vec!["gpu=A100".into()];
        let err = choose(&all, &cands).unwrap_err().to_string();
        assert_eq!(
            err,
            "asked for all nodes matching gpu=A100, 0 registered nodes match"
        );

        let mut bad = spec(1);
        bad.selectors = vec!["gpu".into()];
        let err = choose(&bad, &cands).unwrap_err();
        assert!(
            matches!(&err, CoordinatorError::InvalidField { field, .. } if field == "--selector"),
            "{err:?}"
        );
    }

    #[test]
    fn nccl_plan_refuses_what_cannot_work_on_these_nodes() {
        let mut a = gpu_node("a", 2, "r1");
        let mut b = gpu_node("b", 2, "r1");
        for (n, ifs) in [(&mut a, ["eth0", "ib0"]), (&mut b, ["eth0", "eth1"])] {
            let f = n.facts.as_mut().unwrap();
            f.nccl_version = "2.28.9".into();
            f.interfaces = ifs
                .iter()
                .map(|i| gpuctl_proto::pb::NetInterface {
                    name: (*i).into(),
                    ..Default::default()
                })
                .collect();
        }
        b.facts.as_mut().unwrap().ib_devices.clear();
        let p = plan(&spec(2), &[&a, &b]);
        assert!(preflight_error(&p).is_none(), "{:?}", p.checks);
        let names: Vec<&str> = p.env.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, vec!["NCCL_IB_DISABLE", "NCCL_SOCKET_IFNAME"]);
        assert_eq!(p.env[1].value, "=eth0");

        // The user turning IB back on is refused, naming the node without it.
        let mut s = spec(2);
        s.env.insert("NCCL_IB_DISABLE".into(), "0".into());
        let p = plan(&s, &[&a, &b]);
        let err = preflight_error(&p).expect("refused").to_string();
        assert!(err.starts_with("preflight `env` failed: "), "{err}");
        assert!(err.contains("b has no InfiniBand"), "{err}");
        assert!(matches!(
            preflight_error(&p),
            Some(CoordinatorError::PlanRefused(_))
        ));

        // NCCL versions that differ fail the plan; a typo'd NCCL_ name only warns.
        b.facts.as_mut().unwrap().nccl_version = "2.27.3".into();
        let mut s = spec(2);
        s.env.insert("NCCL_SOCKET_IFNAM".into(), "eth0".into());
        let p = plan(&s, &[&a, &b]);
        let err = preflight_error(&p).expect("refused").to_string();
        assert!(
            err.contains("nccl-version") && err.contains("2.27.3 (b)"),
            "{err}"
        );
        assert!(p
            .checks
            .iter()
            .any(|c| c.verdict() == Verdict::Warn && c.detail.contains("NCCL_SOCKET_IFNAM ")));
    }

    #[test]
    fn small_shm_fails_preflight_with_the_fix() {
        let mut n = gpu_node("g0", 8, "r1");
        n.facts.as_mut().unwrap().shm_bytes = 64 << 20;
        let p = plan(&spec(1), &[&n]);
        let err = preflight_error(&p).expect("shm check fails").to_string();
        assert!(err.contains("g0") && err.contains("--shm-size"), "{err}");
        let ok = gpu_node("g1", 8, "r1");
        assert!(preflight_error(&plan(&spec(1), &[&ok])).is_none());
        // CPU ranks do not use NCCL's shared memory.
        let mut cpu = cpu_node("c0", 4, 8, false);
        assert!(plan(&spec(1), &[&cpu]).checks.is_empty());
        // An agent's own failing check is shown but does not block.
        cpu.preflight.push(PreflightCheck {
            name: "memlock".into(),
            verdict: Verdict::Fail as i32,
            ..Default::default()
        });
        let p = plan(&spec(1), &[&cpu]);
        assert_eq!(p.checks.len(), 1);
        assert_eq!(p.checks[0].node, "c0");
        assert!(preflight_error(&p).is_none());
    }
}

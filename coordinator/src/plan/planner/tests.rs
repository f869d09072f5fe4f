//! The planner's tests: node choice, the rank table and the environment.

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

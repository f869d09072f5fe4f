//! `--pattern pairs` with real CPU ranks as threads: each pair of nodes opens
//! TCP communicators of its own through one in-process rendezvous (no
//! coordinator), as workers of a job do through the coordinator's. Checks that
//! every pair of nodes is measured exactly once per op, in the round the
//! schedule gives it, with exact results and a bandwidth.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use anyhow::Context;
use gpuctl_core::catalogue::NcclPattern;
use gpuctl_core::pairs::{pair_of, round_robin};
use gpuctl_proto::pb::CollectiveResult;
use gpuctl_worker::comm::tcp::TcpComm;
use gpuctl_worker::comm::{Collectives, Op};
use gpuctl_worker::rendezvous::{MemoryRendezvous, Rendezvous};
use gpuctl_worker::workloads::nccl::pairs::{pairs, Place};
use gpuctl_worker::workloads::nccl::SweepConfig;
use tch::{Device, Kind};

const MAX_BYTES: u64 = 64 << 10;

fn cfg() -> SweepConfig {
    SweepConfig {
        // The pairs pattern measures sendrecv and all_reduce whatever `ops` says.
        ops: vec![Op::Broadcast],
        min_bytes: 1 << 10,
        max_bytes: MAX_BYTES,
        factor: 2,
        kind: Kind::Float,
        dtype: "float".into(),
        iters: 2,
        warmup: 1,
        floor_gbps: 0.0,
    }
}

/// Runs `pairs` on the ranks of `nodes` nodes, `local[k]` ranks on node k (in
/// node order, as the planner hands them out); each rank's outcome in rank order.
fn run_pairs(local: &[usize]) -> Vec<anyhow::Result<CollectiveResult>> {
    let world: usize = local.iter().sum();
    let rdzv = MemoryRendezvous::new();
    let mut hs = Vec::new();
    let mut rank = 0;
    for (node, &l) in local.iter().enumerate() {
        for local_rank in 0..l {
            let rdzv = rdzv.clone();
            hs.push(thread::spawn(move || {
                tch::set_num_threads(1);
                let place = Place::new(NcclPattern::Pairs, rank, world, node, local_rank, l)?;
                // The rounds this node plays, in order: the k-th communicator it
                // opens is for the k-th of them.
                let played: Vec<usize> = round_robin(place.nnodes)
                    .iter()
                    .enumerate()
                    .filter(|(_, round)| pair_of(round, node).is_some())
                    .map(|(r, _)| r)
                    .collect();
                let opened = Cell::new(0);
                let open = |g: usize, n: usize, r: &dyn Rendezvous| {
                    let round = played[opened.get()];
                    opened.set(opened.get() + 1);
                    // Rounds never overlap: every rank ended the round before.
                    if round > 0 {
                        let done = format!("barrier/pairs-{}/done", round - 1);
                        rdzv.get(&done, Duration::ZERO).with_context(|| {
                            format!(
                                "node {node} opened round {round} before round {} ended",
                                round - 1
                            )
                        })?;
                    }
                    let c = TcpComm::connect(g, n, r, "127.0.0.1", Duration::from_secs(20))?;
                    Ok(Box::new(c) as Box<dyn Collectives>)
                };
                let phases = Arc::new(std::sync::Mutex::new(Vec::new()));
                let seen = phases.clone();
                let out = pairs(
                    &place,
                    &cfg(),
                    &rdzv,
                    &open,
                    Device::Cpu,
                    Duration::from_secs(60),
                    &move |phase, _, _| seen.lock().unwrap().push(phase.to_string()),
                )?;
                // Progress names every round, in order.
                let phases = phases.lock().unwrap().clone();
                let rounds = round_robin(place.nnodes).len();
                for r in 1..=rounds {
                    let p = format!("pairs round {r}/{rounds}");
                    assert!(phases.contains(&p), "{p} missing from {phases:?}");
                }
                Ok(out)
            }));
            rank += 1;
        }
    }
    hs.into_iter()
        .map(|h| h.join().expect("a rank panicked"))
        .collect()
}

/// Every rank's links: exactly the pairs its node is in, once per op, each in
/// its round of the schedule; together every pair of nodes once per op.
fn check(nnodes: usize, l: usize) {
    let out = run_pairs(&vec![l; nnodes]);
    let schedule = round_robin(nnodes);
    let round_of: BTreeMap<(u32, u32), u32> = schedule
        .iter()
        .enumerate()
        .flat_map(|(r, round)| {
            round
                .iter()
                .map(move |&(a, b)| ((a as u32, b as u32), r as u32))
        })
        .collect();
    let mut all = BTreeSet::new();
    for (rank, res) in out.into_iter().enumerate() {
        let res = res.unwrap_or_else(|e| panic!("rank {rank}: {e:#}"));
        let node = (rank / l) as u32;
        assert_eq!(
            (res.backend.as_str(), res.world_size),
            ("tcp-ring", (nnodes * l) as u32)
        );
        assert!(res.rows.is_empty());
        let mut mine = BTreeSet::new();
        for link in &res.links {
            assert!(link.node_a < link.node_b, "{link:?}");
            assert!(node == link.node_a || node == link.node_b, "{link:?}");
            assert_eq!(
                round_of.get(&(link.node_a, link.node_b)),
                Some(&link.round),
                "{link:?}"
            );
            assert_eq!(link.wrong, 0, "rank {rank}: {link:?}");
            assert!(
                link.time_us > 0.0 && link.algbw_gbps > 0.0 && link.busbw_gbps > 0.0,
                "{link:?}"
            );
            assert_eq!((link.bytes, link.dtype.as_str()), (MAX_BYTES, "float"));
            // nccl-tests' factors for the 2L ranks of the pair.
            let n = (2 * l) as f64;
            let factor = match link.op.as_str() {
                "sendrecv" => 1.0,
                "all_reduce" => 2.0 * (n - 1.0) / n,
                op => panic!("unexpected op {op}"),
            };
            assert!((link.busbw_gbps - link.algbw_gbps * factor).abs() < 1e-9);
            assert!(
                mine.insert((link.node_a, link.node_b, link.op.clone())),
                "rank {rank}: {link:?} twice"
            );
            all.insert((link.node_a, link.node_b, link.op.clone()));
        }
        // One link per op with each other node.
        assert_eq!(mine.len(), 2 * (nnodes - 1), "rank {rank}: {mine:?}");
    }
    let want: BTreeSet<_> = round_of
        .keys()
        .flat_map(|&(a, b)| ["sendrecv", "all_reduce"].map(|op| (a, b, op.to_string())))
        .collect();
    assert_eq!(all, want);
    assert_eq!(want.len(), nnodes * (nnodes - 1));
}

#[test]
fn four_and_five_nodes_of_one_rank_measure_every_pair_once() {
    check(4, 1);
    check(5, 1);
}

#[test]
fn three_nodes_of_two_ranks_measure_every_pair_once() {
    // Odd: one node sits out each round; GPU i meets GPU i (4-rank groups).
    check(3, 2);
}

#[test]
fn nodes_of_different_sizes_are_refused_by_name() {
    // 4 + 2 + 2 ranks: node 0 counts 2 nodes, the others 4; rank 0 finds node 1
    // differs and every rank stops with the same reason, opening nothing.
    for (rank, res) in run_pairs(&[4, 2, 2]).into_iter().enumerate() {
        let e = format!("{:#}", res.expect_err("mixed node sizes must fail"));
        assert!(
            e.contains("same number of ranks") && e.contains("node 1 has 2"),
            "rank {rank}: {e}"
        );
    }
}

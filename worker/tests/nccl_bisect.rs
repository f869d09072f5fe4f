//! `--pattern bisect`, `--pattern search` (and `pairs` below a floor) with real CPU ranks as threads: each group of a round
//! opens TCP communicators of its own through one in-process rendezvous (no
//! coordinator), as workers of a job do through the coordinator's. On a healthy
//! set every rank must record the same rounds, the groups the search names,
//! exact results, and no culprit. A slow node here is one whose ranks wait
//! before each all_reduce they join (a slow link is tested end to end on
//! network namespaces with `tc`).

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use gpuctl_core::catalogue::NcclPattern;
use gpuctl_proto::pb::CollectiveResult;
use gpuctl_worker::comm::tcp::TcpComm;
use gpuctl_worker::comm::{Collectives, Op};
use gpuctl_worker::rendezvous::{MemoryRendezvous, Rendezvous};
use gpuctl_worker::workloads::nccl::bisect::{bisect, plan, Bisected, RoundsEnv};
use gpuctl_worker::workloads::nccl::pairs::{pairs, Place};
use gpuctl_worker::workloads::nccl::search::search;
use gpuctl_worker::workloads::nccl::SweepConfig;
use tch::{Device, Kind, Tensor};

/// Loopback TCP on a shared machine is uneven: only a group 10× slower than the
/// other counts as slow here, so a healthy set never names a node by chance.
const SLOW_RATIO: f64 = 0.1;

fn cfg() -> SweepConfig {
    SweepConfig {
        // Bisect measures all_reduce at max_bytes whatever `ops` says.
        ops: vec![Op::Broadcast],
        min_bytes: 1 << 10,
        // Large enough and often enough that a scheduling hiccup is averaged out.
        max_bytes: 1 << 20,
        factor: 2,
        kind: Kind::Float,
        dtype: "float".into(),
        iters: 10,
        warmup: 2,
        floor_gbps: 0.0,
    }
}

/// A rank of a slow node: every all_reduce starts `delay` late, which holds up
/// the whole ring of its group as a slow NIC would.
struct Late {
    inner: TcpComm,
    delay: Duration,
}

impl Collectives for Late {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn version(&self) -> String {
        self.inner.version()
    }
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn all_reduce(&mut self, send: &Tensor, recv: &Tensor) -> anyhow::Result<()> {
        thread::sleep(self.delay);
        self.inner.all_reduce(send, recv)
    }
    fn all_gather(&mut self, send: &Tensor, recv: &Tensor) -> anyhow::Result<()> {
        self.inner.all_gather(send, recv)
    }
    fn reduce_scatter(&mut self, send: &Tensor, recv: &Tensor) -> anyhow::Result<()> {
        self.inner.reduce_scatter(send, recv)
    }
    fn broadcast(&mut self, send: &Tensor, recv: &Tensor, root: usize) -> anyhow::Result<()> {
        self.inner.broadcast(send, recv, root)
    }
    fn reduce(&mut self, send: &Tensor, recv: &Tensor, root: usize) -> anyhow::Result<()> {
        self.inner.reduce(send, recv, root)
    }
    fn alltoall(&mut self, send: &Tensor, recv: &Tensor) -> anyhow::Result<()> {
        self.inner.alltoall(send, recv)
    }
    fn sendrecv(
        &mut self,
        send: &Tensor,
        to: usize,
        recv: &Tensor,
        from: usize,
    ) -> anyhow::Result<()> {
        thread::sleep(self.delay);
        self.inner.sendrecv(send, to, recv, from)
    }
    fn barrier(&mut self) -> anyhow::Result<()> {
        self.inner.barrier()
    }
    fn synchronize(&mut self) -> anyhow::Result<()> {
        self.inner.synchronize()
    }
}

/// Runs `bisect` on `nnodes` nodes of `l` ranks, the ranks of node `slow` (if
/// any) late to every all_reduce; each rank's outcome and its progress phases,
/// in rank order.
fn run_bisect(nnodes: usize, l: usize, slow: Option<usize>) -> Vec<(Bisected, Vec<String>)> {
    run_pattern(NcclPattern::Bisect, nnodes, l, slow.into_iter().collect())
}

fn run_pattern(
    pattern: NcclPattern,
    nnodes: usize,
    l: usize,
    slow: Vec<usize>,
) -> Vec<(Bisected, Vec<String>)> {
    let world = nnodes * l;
    let rdzv = MemoryRendezvous::new();
    let hs: Vec<_> = (0..world)
        .map(|rank| {
            let rdzv = rdzv.clone();
            let slow = slow.clone();
            thread::spawn(move || {
                tch::set_num_threads(1);
                let place = Place::new(pattern, rank, world, rank / l, rank % l, l)?;
                let open = |g: usize, n: usize, r: &dyn Rendezvous| {
                    let c = TcpComm::connect(g, n, r, "127.0.0.1", Duration::from_secs(20))?;
                    if slow.contains(&(rank / l)) {
                        // Far above a healthy all_reduce of 1 MiB even on a
                        // loaded 2-core machine (CI saw healthy groups at
                        // 0.22 GB/s, 7 ms a call, against 30 ms late: 0.14x,
                        // over SLOW_RATIO).
                        let delay = Duration::from_millis(200);
                        return Ok(Box::new(Late { inner: c, delay }) as Box<dyn Collectives>);
                    }
                    Ok(Box::new(c) as Box<dyn Collectives>)
                };
                let phases = Arc::new(Mutex::new(Vec::new()));
                let seen = phases.clone();
                let progress = move |phase: &str, _: f64, _: Option<f64>| {
                    seen.lock().unwrap().push(phase.to_string())
                };
                let out = if pattern == NcclPattern::Search {
                    let cfg = cfg();
                    let env = RoundsEnv {
                        place: &place,
                        cfg: &cfg,
                        rdzv: &rdzv,
                        open: &open,
                        dev: Device::Cpu,
                        round_timeout: Duration::from_secs(60),
                        progress: &progress,
                    };
                    search(&env, SLOW_RATIO, 0.2)?
                } else {
                    bisect(
                        &place,
                        &cfg(),
                        &rdzv,
                        &open,
                        Device::Cpu,
                        Duration::from_secs(60),
                        SLOW_RATIO,
                        &progress,
                    )?
                };
                let phases = phases.lock().unwrap().clone();
                anyhow::Ok((out, phases))
            })
        })
        .collect();
    hs.into_iter()
        .enumerate()
        .map(|(rank, h)| {
            h.join()
                .expect("a rank panicked")
                .unwrap_or_else(|e| panic!("rank {rank}: {e:#}"))
        })
        .collect()
}

/// The rounds' groups, as node lists.
fn groups(res: &CollectiveResult) -> Vec<Vec<Vec<u32>>> {
    res.bisect
        .iter()
        .map(|r| r.groups.iter().map(|g| g.nodes.clone()).collect())
        .collect()
}

/// Every rank agrees, results are exact, every group has a bandwidth.
fn check_common(out: &[(Bisected, Vec<String>)], world: usize) {
    let first = &out[0].0.result;
    for (rank, (b, phases)) in out.iter().enumerate() {
        let res = &b.result;
        assert_eq!(b.wrong, 0, "rank {rank}: {:?}", b.wrong_in);
        assert_eq!(
            (res.backend.as_str(), res.world_size),
            ("tcp-ring", world as u32)
        );
        assert!(res.rows.is_empty() && res.links.is_empty());
        // The same numbers, so the same decisions, on every rank.
        assert_eq!(res.bisect, first.bisect, "rank {rank}");
        assert_eq!(
            (res.bisect_culprit, &res.bisect_note),
            (first.bisect_culprit, &first.bisect_note)
        );
        for (r, round) in res.bisect.iter().enumerate() {
            assert_eq!(round.round as usize, r);
            assert!(!round.decision.is_empty());
            for g in &round.groups {
                assert!(g.busbw_gbps > 0.0 && g.names.is_empty(), "{round:?}");
            }
            assert!(phases.contains(&format!("bisect round {r}")), "{phases:?}");
        }
    }
}

#[test]
fn four_healthy_nodes_stop_after_the_halves() {
    let out = run_bisect(4, 1, None);
    check_common(&out, 4);
    let res = &out[0].0.result;
    assert_eq!(
        groups(res),
        vec![vec![vec![0, 1, 2, 3]], vec![vec![0, 1], vec![2, 3]]]
    );
    assert_eq!(res.bisect_culprit, None);
    assert_eq!(res.bisect_note, plan::NO_SLOW_HALF);
    assert_eq!(res.bisect[1].decision, plan::NO_SLOW_HALF);
    assert!(res.bisect[0].decision.starts_with("all 4 nodes: "));
}

#[test]
fn three_healthy_nodes_of_two_ranks_meet_in_pairs() {
    // No healthy half to pair with: the three pairs one a round, the third node
    // waiting at the barrier; GPU i meets GPU i (4-rank groups). A pair that
    // measured slow on these shared cores is measured again after them.
    let out = run_bisect(3, 2, None);
    check_common(&out, 6);
    let res = &out[0].0.result;
    let g = groups(res);
    assert!((4..=6).contains(&g.len()), "{g:?}");
    assert_eq!(g[0], vec![vec![0, 1, 2]]);
    let mut pairs: Vec<Vec<u32>> = g[1..4].iter().map(|r| r[0].clone()).collect();
    pairs.sort();
    assert_eq!(pairs, vec![vec![0, 1], vec![0, 2], vec![1, 2]]);
    assert_eq!(res.bisect_culprit, None);
    assert_eq!(res.bisect_note, plan::NO_SLOW_PAIR);
}

#[test]
fn a_late_node_is_isolated() {
    // 4 nodes: the whole set, the halves, each suspect with a healthy node,
    // then the late node's pair again.
    let out = run_bisect(4, 1, Some(2));
    check_common(&out, 4);
    let res = &out[0].0.result;
    let g = groups(res);
    assert_eq!(g.len(), 4, "{:?}", res.bisect);
    assert_eq!(g[1], vec![vec![0, 1], vec![2, 3]]);
    assert_eq!(g[2], vec![vec![0, 2], vec![1, 3]]);
    assert!(g[3].contains(&vec![0, 2]), "{:?}", res.bisect);
    assert_eq!(res.bisect_culprit, Some(2), "{:?}", res.bisect);
    assert_eq!(res.bisect_note, "node 2 isolated");
    // 3 nodes of 2 ranks: the pairs with the late node are the slow ones.
    let out = run_bisect(3, 2, Some(0));
    check_common(&out, 6);
    let res = &out[0].0.result;
    assert_eq!(res.bisect_culprit, Some(0), "{:?}", res.bisect);
}

#[test]
fn two_nodes_are_refused_before_any_round() {
    let e = Place::new(NcclPattern::Bisect, 0, 2, 0, 0, 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("3 nodes or more"), "{e}");
}

#[test]
fn search_names_two_late_nodes_among_eight_and_nothing_else() {
    let out = run_pattern(NcclPattern::Search, 8, 1, vec![2, 5]);
    let first = &out[0].0.result;
    for (rank, (b, phases)) in out.iter().enumerate() {
        assert_eq!(b.wrong, 0, "rank {rank}: {:?}", b.wrong_in);
        // The same numbers, so the same verdict, on every rank.
        assert_eq!(b.result.bisect, first.bisect, "rank {rank}");
        assert_eq!(b.result.search_blamed, first.search_blamed, "rank {rank}");
        assert!(phases.contains(&"search round 0".to_string()), "{phases:?}");
    }
    let mut nodes: Vec<u32> = first.search_blamed.iter().filter_map(|b| b.node).collect();
    nodes.sort();
    assert_eq!(nodes, vec![2, 5], "{:#?}", first.bisect);
    assert!(
        first.search_blamed.iter().all(|b| b.node.is_some()),
        "no link blamed: {:?}",
        first.search_blamed
    );
    for b in &first.search_blamed {
        assert!(b.first_gbps > 0.0 && b.confirm_gbps > 0.0, "{b:?}");
        assert_eq!(b.partners.len(), 2);
        assert_ne!(
            b.partners[0], b.partners[1],
            "confirmed with another partner"
        );
    }
    // A healthy set: one round of groups, nobody blamed.
    let out = run_pattern(NcclPattern::Search, 8, 1, Vec::new());
    assert!(
        out[0].0.result.search_blamed.is_empty(),
        "{:?}",
        out[0].0.result
    );
}

/// Issue 36: a link far slower than any healthy one kept its pair measuring
/// every warm-up and timed operation, four times, while the other ranks
/// waited at the round's barrier until the hang timeout. Below the floor,
/// each of its measurements stops after two operations and says so.
#[test]
fn pairs_cut_a_link_below_the_floor_short_and_only_that_one() {
    let (nnodes, late) = (4usize, 2usize);
    let rdzv = MemoryRendezvous::new();
    let hs: Vec<_> = (0..nnodes)
        .map(|rank| {
            let rdzv = rdzv.clone();
            thread::spawn(move || {
                tch::set_num_threads(1);
                let place = Place::new(NcclPattern::Pairs, rank, nnodes, rank, 0, 1)?;
                let open = |g: usize, n: usize, r: &dyn Rendezvous| {
                    let c = TcpComm::connect(g, n, r, "127.0.0.1", Duration::from_secs(20))?;
                    if rank == late {
                        let delay = Duration::from_millis(200);
                        return Ok(Box::new(Late { inner: c, delay }) as Box<dyn Collectives>);
                    }
                    Ok(Box::new(c) as Box<dyn Collectives>)
                };
                // 1 MiB at 0.02 GB/s: 52 ms an operation at most, against
                // 7 ms for a healthy one on a loaded CI machine and 200+ ms
                // for the late node's.
                let cfg = SweepConfig {
                    iters: 20,
                    floor_gbps: 0.02,
                    ..cfg()
                };
                pairs(
                    &place,
                    &cfg,
                    &rdzv,
                    &open,
                    Device::Cpu,
                    Duration::from_secs(60),
                    &|_, _, _| {},
                )
            })
        })
        .collect();
    for (rank, h) in hs.into_iter().enumerate() {
        let res = h
            .join()
            .expect("a rank panicked")
            .unwrap_or_else(|e| panic!("rank {rank}: {e:#}"));
        assert_eq!(res.links.len(), 2 * (nnodes - 1), "rank {rank}");
        for l in &res.links {
            let slow = l.node_a == late as u32 || l.node_b == late as u32;
            assert_eq!(
                (l.below_floor, l.repeat_below_floor),
                (slow, slow),
                "rank {rank}: {l:?}"
            );
            assert_eq!((l.wrong, l.floor_gbps), (0, 0.02), "{l:?}");
            if slow {
                assert!(l.algbw_gbps < 0.02 && l.time_us >= 200_000.0, "{l:?}");
            }
        }
    }
}

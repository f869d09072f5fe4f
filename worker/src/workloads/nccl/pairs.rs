//! `--pattern pairs`: every pair of nodes measured, in rounds.
//!
//! The rounds are `gpuctl_core::pairs::round_robin` over the node ranks
//! (GROUP_RANK): N nodes take N−1 rounds (N rounds when N is odd, one node
//! sitting out each), not N(N−1)/2 one after the other. In a round, the 2×L ranks
//! of each pair of nodes (a, b) open a communicator of their own — group rank
//! `side × L + local rank`, node a's ranks first — meeting under the rendezvous
//! prefix `pairs/{round}/{a}-{b}` (each key owned by the job rank of its group
//! rank, [`Place::members`]), so the pairs of a round run at the same time
//! without meeting each other. Each pair measures, at `max_bytes`, out-of-place:
//!
//! * sendrecv: local rank i of a and local rank i of b send to each other at
//!   once (both directions, nccl-tests' sendrecv on two ranks, busbw = algbw);
//! * all_reduce over the 2×L ranks (busbw = algbw × 2(n−1)/n, n = 2L);
//!
//! and then both again (`repeat_busbw_gbps`), so that a link is blamed only
//! when a second measurement agrees with the first.
//!
//! Every round ends at a rendezvous barrier of all ranks (`barrier/pairs-{round}`),
//! so rounds never overlap and nodes that sit a round out wait there. Each rank
//! reports the links it took part in with its own time; the coordinator keeps
//! the slowest rank's.

use std::cell::RefCell;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use gpuctl_core::catalogue::{NcclParams, NcclPattern};
use gpuctl_core::pairs::{pair_of, round_robin};
use gpuctl_core::rendezvous_keys::owned;
use gpuctl_core::request::RequestError;
use gpuctl_core::units::format_bytes;
use gpuctl_proto::pb::{rank_result::Detail, CollectiveResult, LinkResult};
use tch::Device;

use super::sweep::{config, measure, Peer, SweepConfig};
use super::{bandwidth, report_progress, sizes, Pattern};
use crate::comm::{watched::Units, Collectives, Op};
use crate::context::{Ctx, RankEnv};
use crate::rendezvous::{barrier, Rendezvous, Scoped};
use crate::workloads::Outcome;

/// Where this rank sits among the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// The job's rank and ranks.
    pub rank: usize,
    pub world: usize,
    /// The node's rank (GROUP_RANK) and how many nodes there are.
    pub node: usize,
    pub nnodes: usize,
    pub local_rank: usize,
    pub local_world: usize,
}

impl Place {
    /// Every node runs `local_world` ranks, so there are `world / local_world`
    /// nodes; fewer than `pattern` needs (two for pairs) are refused.
    pub fn new(
        pattern: NcclPattern,
        rank: usize,
        world: usize,
        node: usize,
        local_rank: usize,
        local_world: usize,
    ) -> Result<Place> {
        let name = pattern.name();
        if local_world == 0 || !world.is_multiple_of(local_world) {
            return Err(RequestError(format!(
                "--pattern {name} needs the same number of ranks on every node (GPU i meets \
                 GPU i): WORLD_SIZE={world} is not a multiple of this node's \
                 LOCAL_WORLD_SIZE={local_world}"
            ))
            .into());
        }
        let nnodes = world / local_world;
        let (least, why) = pattern.min_nodes();
        if nnodes < least as usize {
            return Err(RequestError(why.into()).into());
        }
        if node >= nnodes || local_rank >= local_world {
            bail!(
                "GROUP_RANK={node} LOCAL_RANK={local_rank} do not fit {nnodes} nodes of \
                 {local_world} ranks"
            );
        }
        Ok(Place {
            rank,
            world,
            node,
            nnodes,
            local_rank,
            local_world,
        })
    }

    /// Node `k`'s local rank 0, as a job rank. The planner numbers ranks
    /// node by node, and every node has L of them ([`check_shape`]), so
    /// node k's local rank i is rank k × L + i.
    pub fn first_rank(&self, k: usize) -> u32 {
        (k * self.local_world) as u32
    }

    /// The job ranks of `nodes`' ranks, node by node: group rank
    /// `position × L + local rank` is `members[group rank]`.
    pub fn members(&self, nodes: &[usize]) -> Vec<u32> {
        let l = self.local_world as u32;
        nodes
            .iter()
            .flat_map(|&k| self.first_rank(k)..self.first_rank(k) + l)
            .collect()
    }

    pub fn from_env(pattern: NcclPattern, env: &RankEnv) -> Result<Place> {
        Place::new(
            pattern,
            env.rank,
            env.world_size,
            env.group_rank,
            env.local_rank,
            env.local_world_size,
        )
    }
}

/// Opens a communicator over a group: (rank in the group, group size, the
/// group's rendezvous).
pub type Opener<'a> = dyn Fn(usize, usize, &dyn Rendezvous) -> Result<Box<dyn Collectives>> + 'a;

pub fn run(ctx: &Ctx, params: &NcclParams) -> Result<Outcome> {
    let cfg = config(params)?;
    let place = Place::from_env(NcclPattern::Pairs, &ctx.env)?;
    let version = RefCell::new(None);
    let open = opener(ctx, &version);
    let round_timeout = round_timeout(ctx);
    // On a failure the links of the rounds done are in `crate::partial`,
    // which sends them with the error.
    let out = pairs(
        &place,
        &cfg,
        ctx.rdzv.as_ref(),
        &open,
        ctx.dev.device,
        round_timeout,
        &report_progress(ctx),
    )?;
    let wrong: u64 = out.links.iter().map(|l| l.wrong).sum();
    let error = (wrong > 0).then(|| {
        let bad: Vec<String> = out
            .links
            .iter()
            .filter(|l| l.wrong > 0)
            .map(|l| format!("{} nodes {}-{}", l.op, l.node_a, l.node_b))
            .collect();
        format!(
            "{wrong} wrong elements in the pair results ({})",
            bad.join(", ")
        )
    });
    Ok(Outcome {
        detail: Detail::Collectives(out),
        nccl_version: version.take(),
        error,
        more_train: Vec::new(),
    })
}

/// Opens a group's communicator through the job's backend, keeping the first
/// communicator's library version for the result.
pub(super) fn opener<'a>(
    ctx: &'a Ctx,
    version: &'a RefCell<Option<String>>,
) -> impl Fn(usize, usize, &dyn Rendezvous) -> Result<Box<dyn Collectives>> + 'a {
    move |rank, world, rdzv| {
        let comm = ctx.make_comm_in(rank, world, rdzv, Units::Calls)?;
        version.borrow_mut().get_or_insert_with(|| comm.version());
        Ok(comm)
    }
}

/// How long a rank may wait at a round's barrier: a node may wait out other
/// groups' measurements there, up to the job's deadline (the agent stops the
/// worker then anyway).
pub(super) fn round_timeout(ctx: &Ctx) -> Duration {
    let left_ms = ctx.args.deadline_unix_ms.saturating_sub(ctx.clock.now_ms());
    ctx.rendezvous_timeout.max(Duration::from_millis(left_ms))
}

/// Checks, once before the rounds, that every node runs as many ranks as this
/// one: node ranks' local rank 0 publish theirs, rank 0 compares and publishes
/// the verdict every rank reads (a key per node and per rank, not per pair).
/// Keys live under the pattern's name (`pairs/ranks/{node}@{rank}`,
/// `pairs/shape@0`).
pub(super) fn check_shape(
    pattern: NcclPattern,
    place: &Place,
    rdzv: &dyn Rendezvous,
    timeout: Duration,
) -> Result<()> {
    let name = pattern.name();
    let l = place.local_world;
    let count = |k: usize, rank: u32| owned(&format!("{name}/ranks/{k}"), rank);
    if place.local_rank == 0 {
        // Under its own rank: the node's first rank whether or not the
        // nodes before it have L ranks.
        rdzv.put(
            &count(place.node, place.rank as u32),
            l.to_string().as_bytes(),
        )?;
    }
    let shape = owned(&format!("{name}/shape"), 0);
    if place.rank == 0 {
        // Node k starts at rank k × L while the nodes before it have L ranks
        // each: past the first node that differs, rank 0 cannot tell which
        // rank publishes a node's count, so it stops there.
        let mut odd = None;
        for k in 0..place.nnodes {
            let v = rdzv
                .get(&count(k, place.first_rank(k)), timeout)
                .with_context(|| format!("waiting for node {k}'s rank count"))?;
            let v = String::from_utf8_lossy(&v).into_owned();
            if v != l.to_string() {
                odd = Some(format!("node {k} has {v}"));
                break;
            }
        }
        let verdict = match odd {
            None => String::new(),
            Some(odd) => format!(
                "--pattern {name} needs the same number of ranks on every node (GPU i meets \
                 GPU i): node 0 has {l}, {odd}"
            ),
        };
        rdzv.put(&shape, verdict.as_bytes())?;
    }
    let verdict = rdzv
        .get(&shape, timeout)
        .context("waiting for rank 0's check of the nodes")?;
    if !verdict.is_empty() {
        return Err(RequestError(String::from_utf8_lossy(&verdict).into_owned()).into());
    }
    Ok(())
}

/// Every round of the schedule for this rank; `progress(phase, fraction,
/// all_reduce busbw of the round just done)`. `open` makes each pair's
/// communicator; `round_timeout` bounds the wait at a round's barrier. The
/// links of every round done are kept in `crate::partial` as it ends: a
/// failure or a stop later loses none of them.
pub fn pairs(
    place: &Place,
    cfg: &SweepConfig,
    rdzv: &dyn Rendezvous,
    open: &Opener,
    dev: Device,
    round_timeout: Duration,
    progress: &dyn Fn(&str, f64, Option<f64>),
) -> Result<CollectiveResult> {
    let (l, es) = (place.local_world, cfg.kind.elt_size_in_bytes());
    let n = 2 * l;
    if sizes(Op::AllReduce, cfg.max_bytes, es, n).count == 0 {
        return Err(RequestError(format!(
            "--max-bytes {} holds no {} element; give at least {es} bytes",
            cfg.max_bytes, cfg.dtype
        ))
        .into());
    }
    check_shape(NcclPattern::Pairs, place, rdzv, round_timeout)?;
    let pat = Pattern::new(cfg.kind, n);
    let rounds = round_robin(place.nnodes);
    let total = rounds.len();
    let mut links = Vec::new();
    let mut backend = None;
    for (r, round) in rounds.iter().enumerate() {
        let phase = format!("pairs round {}/{total}", r + 1);
        progress(&phase, r as f64 / total as f64, None);
        let mut busbw = None;
        if let Some((a, b)) = pair_of(round, place.node) {
            let side = usize::from(place.node == b);
            let g = side * l + place.local_rank;
            let what = format!("{phase}, nodes {a} and {b}");
            let scoped = Scoped::new(rdzv, &format!("pairs/{r}/{a}-{b}"), place.members(&[a, b]));
            let mut comm = open(g, n, &scoped)
                .with_context(|| format!("{what}: opening their communicator"))?;
            backend.get_or_insert(comm.backend());
            let ops = [
                (Op::SendRecv, Peer::Both((g + l) % n)),
                (Op::AllReduce, Peer::Ring),
            ];
            // Each link twice, the other op between: one slow figure is a
            // measurement, two are a link (the judge blames on both).
            let first = links.len();
            for (i, (op, peer)) in ops.iter().chain(ops.iter()).copied().enumerate() {
                let again = i >= ops.len();
                let s = sizes(op, cfg.max_bytes, es, n);
                let m = measure(comm.as_mut(), op, cfg, &s, &pat, dev, false, peer, 1)
                    .with_context(|| {
                        format!("{what}: {} {}", op.name(), format_bytes(s.bytes(es)))
                    })?;
                let (t, wrong) = (m.time_us, m.wrong);
                let (alg, bus) = bandwidth(op, &s, es, n, t);
                if g == 0 {
                    tracing::info!(
                        "{phase} nodes {a}-{b}: {}{} {} {:.1} us algbw {:.2} busbw {:.2} GB/s #wrong {wrong}{}",
                        op.name(),
                        if again { " (again)" } else { "" },
                        format_bytes(s.bytes(es)),
                        t,
                        alg,
                        bus,
                        if m.below_floor { " (below the floor: cut short)" } else { "" }
                    );
                }
                if wrong > 0 {
                    tracing::error!("{what}: {} has {wrong} wrong elements", op.name());
                }
                if op == Op::AllReduce {
                    busbw = Some(bus);
                }
                if again {
                    let l: &mut LinkResult = &mut links[first + i - ops.len()];
                    l.repeat_busbw_gbps = bus;
                    l.repeat_time_us = t;
                    l.repeat_below_floor = m.below_floor;
                    l.wrong += wrong;
                    continue;
                }
                links.push(LinkResult {
                    round: r as u32,
                    node_a: a as u32,
                    node_b: b as u32,
                    op: op.name().into(),
                    bytes: s.bytes(es),
                    dtype: cfg.dtype.clone(),
                    time_us: t,
                    algbw_gbps: alg,
                    busbw_gbps: bus,
                    wrong,
                    below_floor: m.below_floor,
                    floor_gbps: cfg.floor_gbps,
                    ..Default::default()
                });
            }
        }
        barrier(
            rdzv,
            &format!("pairs-{r}"),
            place.rank,
            place.world,
            round_timeout,
        )
        .with_context(|| format!("{phase}: waiting for the other pairs"))?;
        crate::partial::keep(Detail::Collectives(CollectiveResult {
            backend: backend.unwrap_or_default().into(),
            world_size: place.world as u32,
            links: links.clone(),
            ..Default::default()
        }));
        progress(&phase, (r + 1) as f64 / total as f64, busbw);
    }
    Ok(CollectiveResult {
        backend: backend.unwrap_or_default().into(),
        world_size: place.world as u32,
        rows: Vec::new(),
        links,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_need_two_nodes_of_equal_size() {
        let p = Place::new(NcclPattern::Pairs, 5, 6, 2, 1, 2).unwrap();
        assert_eq!((p.nnodes, p.node, p.local_rank), (3, 2, 1));
        let e = Place::new(NcclPattern::Pairs, 0, 2, 0, 0, 2).unwrap_err();
        // The request's error, not the node's: the coordinator blames no node.
        assert!(e.is::<RequestError>(), "{e:#}");
        let e = e.to_string();
        assert!(e.contains("2 nodes or more"), "{e}");
        let e = Place::new(NcclPattern::Pairs, 0, 6, 0, 0, 4)
            .unwrap_err()
            .to_string();
        assert!(e.contains("same number of ranks"), "{e}");
        assert!(Place::new(NcclPattern::Pairs, 0, 4, 2, 0, 2).is_err());
        let e = Place::new(NcclPattern::Bisect, 0, 4, 0, 0, 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("3 nodes or more"), "{e}");
        assert_eq!(
            Place::new(NcclPattern::Bisect, 0, 3, 0, 0, 1)
                .unwrap()
                .nnodes,
            3
        );
        // Group ranks, node by node, as the job's ranks.
        assert_eq!(p.members(&[2, 0]), [4, 5, 0, 1]);
    }
}

//! `p2p`: the links inside one node, as nvbandwidth measures them.
//!
//! * Host↔device: `iters` copies of `bytes` between pinned host memory and
//!   this rank's GPU, each direction (the copy engine over PCIe), one GPU of
//!   a node at a time, every phase of every node starting together. On a CPU rank, copies
//!   between two host buffers, so that the whole path runs without a GPU.
//! * GPU pairs: every ordered pair (s, d) of the node's ranks, one pair at a
//!   time so that pairs never share a switch or a root port: s sends `bytes`
//!   to d `iters` times (NCCL send/recv, which takes NVLink or PCIe P2P as
//!   the hardware offers; the TCP backend on CPU ranks). Each rank times the
//!   pairs it is in with its own clock; the coordinator keeps the slower.
//!
//! Every figure is measured in two passes, so that the coordinator blames a
//! link only when both are slow (one noisy pass is not a slow link). A CPU
//! rank's host copy that waited for a core (another process of the host ran)
//! is taken again within its pass ([`super::busy`]). The
//! ranks of a node meet in a communicator of their own (rendezvous prefix
//! `p2p/{node}`, each key owned by the job rank of its local rank), so the
//! nodes of a job measure at the same time, each alone.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gpuctl_core::catalogue::P2pParams;
use gpuctl_core::rendezvous_keys::owned;
use gpuctl_proto::pb::{rank_result::Detail, P2pResult, PeerCopy, PhaseKind};
use tch::{Device, Kind, Tensor};

use super::{busy, Outcome};
use crate::comm::{watched::Units, Collectives};
use crate::context::Ctx;
use crate::rendezvous::{barrier, Rendezvous, Scoped};

/// Passes per figure: the first and the confirming one.
pub const PASSES: usize = 2;

pub fn run(ctx: &Ctx, p: &P2pParams) -> Result<Outcome> {
    let n = elements(p.bytes)?;
    let progress = |phase: &str, frac: f64, gbps: Option<f64>| {
        ctx.sample_memory();
        // Called from the copies alone: the first call starts the measured phase.
        ctx.progress.enter(PhaseKind::Measured);
        match gbps {
            Some(g) => ctx.progress.update(phase, frac, &[("gbps", g)]),
            None => ctx.progress.update(phase, frac, &[]),
        }
    };
    let mut out = P2pResult {
        bytes: n as u64 * 4,
        iters: p.iters as u32,
        method: if ctx.dev.is_cuda() { "pinned" } else { "host" }.into(),
        ..Default::default()
    };
    let (l, me, node) = (
        ctx.env.local_world_size,
        ctx.env.local_rank,
        ctx.env.group_rank,
    );
    let ranks = node_ranks(ctx.env.rank, me, l)?;
    let scoped = Scoped::new(ctx.rdzv.as_ref(), &format!("p2p/{node}"), ranks.clone());
    let mut comm = if l >= 2 {
        let c = ctx
            .make_comm_in(me, l, &scoped, Units::Calls)
            .context("opening the node's communicator for the GPU pairs")?;
        Some(c)
    } else {
        None
    };
    progress("host copies", 0.0, None);
    let host = host_copies(ctx, n, p)?;
    (out.h2d_gbps, out.h2d_repeat_gbps) = (host.h2d[0], host.h2d[1]);
    (out.d2h_gbps, out.d2h_repeat_gbps) = (host.d2h[0], host.d2h[1]);
    progress("host copies", 0.2, Some(host.h2d[0].max(host.h2d[1])));

    let mut version = None;
    let mut wrong = 0;
    if let Some(comm) = comm.as_mut() {
        out.backend = comm.backend().to_string();
        version = Some(comm.version());
        out.peers = pairs(comm.as_mut(), n, p, ctx.dev.device, &ranks, &|done, g| {
            progress("gpu pairs", 0.2 + 0.8 * done, g)
        })?;
        wrong = out.peers.iter().map(|c| c.wrong).sum::<u64>();
    }
    let error = (wrong > 0).then(|| {
        let bad: Vec<String> = out
            .peers
            .iter()
            .filter(|c| c.wrong > 0)
            .map(|c| format!("rank {} to rank {}", c.src_rank, c.dst_rank))
            .collect();
        format!("{wrong} wrong elements arrived ({})", bad.join(", "))
    });
    Ok(Outcome {
        detail: Detail::P2p(out),
        nccl_version: version,
        error,
        more_train: Vec::new(),
    })
}

/// fp32 elements of a `bytes` copy; at least one.
fn elements(bytes: u64) -> Result<usize> {
    let n = (bytes / 4) as usize;
    if n == 0 {
        return Err(gpuctl_core::request::RequestError(format!(
            "--bytes {bytes} holds no 4-byte element; give 4 bytes or more"
        ))
        .into());
    }
    Ok(n)
}

/// GB/s of `iters` copies of `n` fp32 elements in `secs`.
fn gbps(n: usize, iters: u64, secs: f64) -> f64 {
    if secs <= 0.0 {
        return 0.0;
    }
    (n as f64 * 4.0 * iters as f64) / secs / 1e9
}

/// Two passes each way.
struct HostCopies {
    h2d: [f64; PASSES],
    d2h: [f64; PASSES],
}

/// Host copies in turns: in turn k the local rank k of every node copies,
/// one GPU of a node at a time so that each figure is that GPU's own link.
/// Every direction and pass of a turn starts at a barrier of the whole job:
/// agents that share a host (one per GPU) then copy at the same time, each
/// run alike. Measured on four H100s: copying whenever a rank was ready gave
/// 35-55 GB/s from run to run and failed a healthy GPU at 0.82x; PyTorch
/// with the phases aligned, a steady 43.2-43.4 (docs/benchmarks.md).
fn host_copies(ctx: &Ctx, n: usize, p: &P2pParams) -> Result<HostCopies> {
    let dev = ctx.dev.device;
    let host = Tensor::f_ones([n as i64], (Kind::Float, Device::Cpu))?;
    // Pinned memory is what a data loader copies from, and what the copy
    // engine reaches at full PCIe speed (pageable memory goes through a
    // staging buffer at a fraction of it).
    let mut host = if ctx.dev.is_cuda() {
        host.f_pin_memory(dev)?
    } else {
        host
    };
    let mut device = Tensor::f_zeros([n as i64], (Kind::Float, dev))?;
    let mut copy = |to_device: bool| -> Result<()> {
        if to_device {
            device.f_copy_(&host)
        } else {
            host.f_copy_(&device)
        }
        .map_err(Into::into)
    };
    for _ in 0..p.warmup {
        copy(true)?;
        copy(false)?;
    }
    ctx.dev.synchronize();
    let (rdzv, rank, world, timeout) = (
        ctx.rdzv.as_ref(),
        ctx.env.rank,
        ctx.env.world_size,
        ctx.rendezvous_timeout,
    );
    let turns = job_max(
        rdzv,
        "p2p-turns",
        rank,
        world,
        ctx.env.local_world_size,
        timeout,
    )?;
    let mut out = HostCopies {
        h2d: [0.0; PASSES],
        d2h: [0.0; PASSES],
    };
    for turn in 0..turns {
        for pass in 0..PASSES {
            for (to_device, figure) in [(true, &mut out.h2d[pass]), (false, &mut out.d2h[pass])] {
                let name = format!("p2p-host/{turn}/{pass}/{}", u8::from(to_device));
                barrier(rdzv, &name, rank, world, timeout)?;
                if turn != ctx.env.local_rank {
                    continue;
                }
                let mut once = || -> Result<f64> {
                    let t0 = Instant::now();
                    for _ in 0..p.iters {
                        copy(to_device)?;
                        ctx.progress.tick(1);
                    }
                    ctx.dev.synchronize();
                    Ok(gbps(n, p.iters, t0.elapsed().as_secs_f64()))
                };
                // A CPU rank's copies run on cores the whole host shares: a
                // try the rank spent waiting for a core is taken again.
                *figure = if ctx.dev.is_cuda() {
                    once()?
                } else {
                    let (g, waited) = busy::best_quiet_try(once)?;
                    if waited > busy::DISTURBED {
                        tracing::info!(
                            pass,
                            to_device,
                            gbps = g,
                            "the host was busy: the best of {} tries waited for a core {:.0}% of its time",
                            busy::TRIES,
                            waited * 100.0
                        );
                    }
                    g
                };
            }
        }
    }
    Ok(out)
}

/// The largest `value` any rank of the job gives, through the rendezvous:
/// each rank puts its own (`{name}@{rank}`), rank 0 reads them all and puts
/// the answer (`{name}/max@0`): a key per rank, as [`barrier`].
fn job_max(
    rdzv: &dyn Rendezvous,
    name: &str,
    rank: usize,
    world: usize,
    value: usize,
    timeout: Duration,
) -> Result<usize> {
    let read = |key: &str| -> Result<usize> {
        let v = rdzv.get(key, timeout)?;
        String::from_utf8_lossy(&v)
            .parse()
            .with_context(|| format!("`{key}` holds no number"))
    };
    rdzv.put(&owned(name, rank as u32), value.to_string().as_bytes())?;
    let answer = owned(&format!("{name}/max"), 0);
    if rank == 0 {
        let mut max = value;
        for r in 1..world {
            max =
                max.max(read(&owned(name, r as u32)).with_context(|| {
                    format!("waiting for rank {r}'s number of ranks on its node")
                })?);
        }
        rdzv.put(&answer, max.to_string().as_bytes())?;
        return Ok(max);
    }
    read(&answer).context("waiting for rank 0's largest node")
}

/// The job rank of every local rank of this node, `local` being this
/// rank's: the planner numbers ranks node by node, so a node's ranks follow
/// each other from its local rank 0.
fn node_ranks(rank: usize, local: usize, l: usize) -> Result<Vec<u32>> {
    let Some(first) = rank.checked_sub(local) else {
        bail!("RANK={rank} is below LOCAL_RANK={local}: ranks are not numbered node by node");
    };
    Ok((first..first + l).map(|r| r as u32).collect())
}

/// The value local rank `s` sends to `d`: every pair its own, so that a copy
/// that lands on the wrong GPU shows as wrong elements.
fn fill(s: usize, d: usize, l: usize) -> f64 {
    (s * l + d + 1) as f64
}

/// Whether `mine` holds on any rank of `comm`.
fn any_rank(comm: &mut dyn Collectives, mine: bool) -> Result<bool> {
    let flag = Tensor::from_slice(&[f32::from(u8::from(mine))]);
    let sum = Tensor::f_zeros([1], (Kind::Float, Device::Cpu))?;
    comm.all_reduce(&flag, &sum)?;
    Ok(sum.f_double_value(&[0])? > 0.0)
}

/// Every ordered pair of the node's `l` ranks, one after another; this rank
/// returns the pairs it took part in. `ranks`: job rank by local rank.
pub fn pairs(
    comm: &mut dyn Collectives,
    n: usize,
    p: &P2pParams,
    dev: Device,
    ranks: &[u32],
    progress: &dyn Fn(f64, Option<f64>),
) -> Result<Vec<PeerCopy>> {
    let (me, l) = (comm.rank(), comm.world_size());
    let total = (l * (l - 1)) as f64;
    let mut out = Vec::new();
    let mut done = 0.0;
    let mut buf = Tensor::f_full([n as i64], -1.0, (Kind::Float, dev))?;
    for s in 0..l {
        for d in (0..l).filter(|d| *d != s) {
            let role = if me == s {
                Some(true)
            } else if me == d {
                Some(false)
            } else {
                None
            };
            let value = fill(s, d, l);
            match role {
                Some(true) => drop(buf.f_fill_(value)?),
                // What an earlier pair left would count as wrong anyway
                // (every pair has its own value); -1 says "nothing came".
                Some(false) => drop(buf.f_fill_(-1.0)?),
                None => {}
            }
            let issue = |comm: &mut dyn Collectives| match role {
                Some(true) => comm.send(&buf, d),
                Some(false) => comm.recv(&buf, s),
                None => Ok(()),
            };
            // The first copies also make NCCL's connection between the two.
            for _ in 0..p.warmup {
                issue(comm)?;
            }
            // CPU ranks' pairs are TCP between processes on cores the whole
            // host shares: a try that either rank spent waiting for a core
            // is made again, the node's ranks deciding together.
            let mut figures = [0.0f64; PASSES];
            for f in figures.iter_mut() {
                let start = Instant::now();
                for tries in 1.. {
                    comm.barrier()?;
                    let (delay, t0) = (busy::run_delay_ns(), Instant::now());
                    for _ in 0..p.iters {
                        issue(comm)?;
                    }
                    comm.synchronize()?;
                    let secs = t0.elapsed().as_secs_f64();
                    *f = f.max(gbps(n, p.iters, secs));
                    if dev != Device::Cpu {
                        break;
                    }
                    let waited = busy::waited(delay, secs);
                    let mine = role.is_some() && busy::again(waited, start, tries);
                    if !any_rank(comm, mine)? {
                        break;
                    }
                }
            }
            if let Some(sender) = role {
                let wrong = if sender {
                    0
                } else {
                    buf.f_ne(value)?.f_sum(Kind::Int64)?.int64_value(&[]) as u64
                };
                out.push(PeerCopy {
                    src_rank: ranks[s],
                    dst_rank: ranks[d],
                    src_local: s as u32,
                    dst_local: d as u32,
                    gbps: figures[0],
                    repeat_gbps: figures[1],
                    wrong,
                });
            }
            done += 1.0;
            let mine = role.map(|_| figures[0].max(figures[1]));
            progress(done / total, mine);
        }
    }
    comm.barrier()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_bytes_over_time() {
        assert_eq!(gbps(250_000_000, 2, 1.0), 2.0);
        assert_eq!(gbps(1, 1, 0.0), 0.0);
        assert!(elements(3).is_err());
        assert_eq!(elements(1 << 20).unwrap(), 1 << 18);
        // Every ordered pair its own value.
        let l = 4;
        let mut seen = std::collections::BTreeSet::new();
        for s in 0..l {
            for d in (0..l).filter(|d| *d != s) {
                assert!(seen.insert(fill(s, d, l) as u64));
            }
        }
    }
}

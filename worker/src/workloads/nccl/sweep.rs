//! `--pattern all`: nccl-tests' sweep over every rank of the job.
//!
//! For every op and every size (min_bytes, ×factor, up to max_bytes) the rank
//! runs `warmup` untimed and `iters` timed operations out-of-place, then the same
//! in-place, and after each checks one more operation on fresh inputs against
//! the exact expected values (`#wrong`). At the sizes the coordinator judges
//! (`judged_sizes`) the timed run is repeated `JUDGED_RUNS` times and the
//! median kept: a judged figure is as steady as its reference, not one run's.

use std::time::Instant;

use anyhow::{Context, Result};
use gpuctl_core::catalogue::NcclParams;
use gpuctl_core::units::format_bytes;
use gpuctl_proto::pb::{rank_result::Detail, CollectiveResult, CollectiveRow};
use tch::{Device, Kind, Tensor};

use super::{
    bandwidth, count_wrong, expected, input, redop_label, report_progress, sizes, Pattern, Sizes,
};
use crate::comm::{watched::Units, Collectives, Op};
use crate::context::Ctx;
use crate::workloads::Outcome;

#[derive(Debug, Clone)]
pub struct SweepConfig {
    pub ops: Vec<Op>,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub factor: u64,
    pub kind: Kind,
    pub dtype: String,
    pub iters: u64,
    pub warmup: u64,
    /// The slowest algbw (GB/s) a measurement may run at before it is cut
    /// short as below the floor (0: none; the sweep has none).
    pub floor_gbps: f64,
}

/// The sweep of a job's (already checked) parameters, in the worker's types.
pub fn config(p: &NcclParams) -> Result<SweepConfig> {
    let ops = p
        .ops
        .iter()
        .map(|s| Op::parse(s).with_context(|| format!("collective `{s}` has no implementation")))
        .collect::<Result<_>>()?;
    let kind = match p.dtype.as_str() {
        "bfloat16" => Kind::BFloat16,
        "half" => Kind::Half,
        _ => Kind::Float,
    };
    Ok(SweepConfig {
        ops,
        min_bytes: p.min_bytes,
        max_bytes: p.max_bytes,
        factor: p.factor,
        kind,
        dtype: p.dtype.clone(),
        iters: p.iters,
        warmup: p.warmup,
        // A sweep's small sizes are latency, not rate: it has no floor.
        floor_gbps: if p.pattern == gpuctl_core::catalogue::NcclPattern::All {
            0.0
        } else {
            p.floor_gbps
        },
    })
}

pub use gpuctl_core::catalogue::size_steps;
use gpuctl_core::catalogue::{judged_sizes, JUDGED_RUNS};

/// Whom sendrecv exchanges with: nccl-tests' ring (send to rank+1, receive
/// from rank−1), or one peer in both directions at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    Ring,
    Both(usize),
}

/// One measurement: µs per op and #wrong; `below_floor` when it was cut short.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Measured {
    pub time_us: f64,
    pub wrong: u64,
    /// The first two operations were each slower than `cfg.floor_gbps`: the
    /// time is the second's, and no timed run followed. A link that slow is
    /// a slow link, so it is recorded in seconds rather than measured until
    /// the job's hang timeout.
    pub below_floor: bool,
}

/// One measurement. The time is the median of `runs` timed runs of
/// `cfg.iters` operations each (one run: nccl-tests' figure). With a floor,
/// the first warm-up operations are timed alone first (a fresh
/// communicator's first pays for its connections, hence two).
#[allow(clippy::too_many_arguments)]
pub(super) fn measure(
    comm: &mut dyn Collectives,
    op: Op,
    cfg: &SweepConfig,
    s: &Sizes,
    pat: &Pattern,
    dev: Device,
    in_place: bool,
    peer: Peer,
    runs: usize,
) -> Result<Measured> {
    let r = comm.rank();
    let kind = cfg.kind;
    // Buffers: out-of-place a send and a recv tensor; in-place one buffer with
    // nccl-tests' offsets.
    let make = |fill_input: bool| -> Result<(Tensor, Tensor)> {
        let inp = input(pat, s, r, kind, dev)?;
        if !in_place {
            let recv = Tensor::f_full([s.recv as i64], -1.0, (kind, dev))?;
            return Ok((inp, recv));
        }
        Ok(match op {
            Op::AllGather => {
                let buf = Tensor::f_full([s.recv as i64], -1.0, (kind, dev))?;
                let mut send = buf.narrow(0, (r * s.count) as i64, s.count as i64);
                if fill_input {
                    send.f_copy_(&inp)?;
                }
                (send, buf)
            }
            Op::ReduceScatter => {
                let buf = inp;
                let recv = buf.narrow(0, (r * s.count) as i64, s.count as i64);
                (buf, recv)
            }
            _ => {
                let buf = inp;
                let recv = buf.shallow_clone();
                (buf, recv)
            }
        })
    };
    let issue = |comm: &mut dyn Collectives, send: &Tensor, recv: &Tensor| match (op, peer) {
        (Op::SendRecv, Peer::Both(p)) => comm.sendrecv(send, p, recv, p),
        _ => comm.run(op, send, recv),
    };
    let want = || -> Result<Option<Tensor>> {
        match (op, peer) {
            (Op::SendRecv, Peer::Both(p)) => Ok(Some(pat.tensor(p, 0, s.send, dev)?)),
            _ => expected(op, pat, s, r, dev),
        }
    };
    let (send, recv) = make(true)?;
    let mut warmup = cfg.warmup;
    if cfg.floor_gbps > 0.0 {
        let limit_us = s.bytes(kind.elt_size_in_bytes()) as f64 / (cfg.floor_gbps * 1e3);
        for probe in 0..2 {
            let t0 = Instant::now();
            issue(comm, &send, &recv)?;
            comm.synchronize()?;
            let t = agreed(comm, t0.elapsed().as_secs_f64() * 1e6, dev)?;
            warmup = warmup.saturating_sub(1);
            if t <= limit_us {
                break;
            }
            if probe == 1 {
                // Out-of-place inputs are untouched: the result checks
                // as the fresh one below would.
                let wrong = match (in_place, want()?) {
                    (false, Some(w)) => count_wrong(&recv, &w)?,
                    _ => 0,
                };
                return Ok(Measured {
                    time_us: t,
                    wrong,
                    below_floor: true,
                });
            }
        }
    }
    for _ in 0..warmup {
        issue(comm, &send, &recv)?;
    }
    let mut times = Vec::with_capacity(runs.max(1));
    for _ in 0..runs.max(1) {
        comm.barrier()?;
        let t0 = Instant::now();
        for _ in 0..cfg.iters {
            issue(comm, &send, &recv)?;
        }
        comm.synchronize()?;
        times.push(t0.elapsed().as_secs_f64() * 1e6 / cfg.iters as f64);
    }
    // At least one timed run, so there is always a median.
    let time_us = gpuctl_core::stats::median(times).unwrap_or_default();
    drop((send, recv));
    // Correctness on fresh inputs.
    let (send, recv) = make(true)?;
    issue(comm, &send, &recv)?;
    comm.synchronize()?;
    let wrong = match want()? {
        Some(want) => count_wrong(&recv, &want)?,
        None => 0,
    };
    Ok(Measured {
        time_us,
        wrong,
        below_floor: false,
    })
}

/// The mean of every rank's `time_us`: each rank times its own operation,
/// and the decision to cut a measurement short must be the same on all of
/// them, or the ones that go on wait for the ones that stopped.
fn agreed(comm: &mut dyn Collectives, time_us: f64, dev: Device) -> Result<f64> {
    // One element per rank, so that no rank's share of the ring is empty.
    let n = comm.world_size();
    let t = Tensor::f_full([n as i64], time_us, (Kind::Float, dev))?;
    let sum = Tensor::f_zeros([n as i64], (Kind::Float, dev))?;
    comm.all_reduce(&t, &sum)?;
    comm.synchronize()?;
    let sum = sum.f_to_device(Device::Cpu)?.f_double_value(&[0])?;
    Ok(sum / n as f64)
}

/// nccl-tests' warm-up before an op's sweep: `warmup` untimed operations at
/// the largest size. Without it the first sizes measured also paid for
/// NCCL's lazy connection set-up and clocks still rising: a healthy H100
/// host's all_reduce at 64 MiB, the first size of its sweep, gave 186 GB/s
/// in one run and 309 in the next (nccl-tests: 299 and 305).
#[allow(clippy::too_many_arguments)]
fn warm_up(
    comm: &mut dyn Collectives,
    op: Op,
    cfg: &SweepConfig,
    steps: &[u64],
    es: usize,
    n: usize,
    pat: &Pattern,
    dev: Device,
) -> Result<()> {
    let Some(&largest) = steps.last() else {
        return Ok(());
    };
    let s = sizes(op, largest, es, n);
    if cfg.warmup == 0 || s.count == 0 {
        return Ok(());
    }
    let inp = input(pat, &s, comm.rank(), cfg.kind, dev)?;
    let recv = Tensor::f_full([s.recv as i64], -1.0, (cfg.kind, dev))?;
    for _ in 0..cfg.warmup {
        comm.run(op, &inp, &recv)?;
    }
    comm.synchronize()
}

pub fn run(ctx: &Ctx, params: &NcclParams) -> Result<Outcome> {
    let cfg = config(params)?;
    let mut comm = ctx.make_comm(Units::Calls)?;
    let out = sweep(comm.as_mut(), &cfg, ctx.dev.device, &report_progress(ctx))?;
    let version = comm.version();
    let total_wrong: u64 = out.rows.iter().map(|r| r.wrong + r.wrong_ip).sum();
    let error = (total_wrong > 0).then(|| {
        format!("{total_wrong} wrong elements in the collective results (see the #wrong columns)")
    });
    Ok(Outcome {
        detail: Detail::Collectives(out),
        nccl_version: Some(version),
        error,
        more_train: Vec::new(),
    })
}

/// The whole sweep on one communicator; `progress(phase, fraction, busbw of the step just done)`.
pub fn sweep(
    comm: &mut dyn Collectives,
    cfg: &SweepConfig,
    dev: Device,
    progress: &dyn Fn(&str, f64, Option<f64>),
) -> Result<CollectiveResult> {
    let n = comm.world_size();
    let es = cfg.kind.elt_size_in_bytes();
    let pat = Pattern::new(cfg.kind, n);
    let steps = size_steps(cfg.min_bytes, cfg.max_bytes, cfg.factor);
    // The sizes the coordinator judges rest on several timed runs.
    let judged = judged_sizes(&steps);
    let total = (steps.len() * cfg.ops.len()).max(1) as f64;
    let mut rows = Vec::new();
    let mut done = 0.0;
    if comm.rank() == 0 {
        tracing::info!(
            "{:>12} {:>12} {:>8} {:>6} {:>6} {:>9} {:>8} {:>8} {:>6} {:>9} {:>8} {:>8} {:>6}",
            "size(B)",
            "count",
            "type",
            "redop",
            "root",
            "time(us)",
            "algbw",
            "busbw",
            "#wrong",
            "time(us)",
            "algbw",
            "busbw",
            "#wrong"
        );
    }
    for &op in &cfg.ops {
        warm_up(comm, op, cfg, &steps, es, n, &pat, dev)
            .with_context(|| format!("{} warm-up at the largest size", op.name()))?;
        for &bytes in &steps {
            let s = sizes(op, bytes, es, n);
            let phase = format!("{} {}", op.name(), format_bytes(bytes));
            if s.count == 0 {
                tracing::debug!("{phase}: no element per rank at this size; skipped");
                done += 1.0;
                continue;
            }
            progress(&phase, done / total, None);
            let runs = if judged.contains(&bytes) {
                JUDGED_RUNS
            } else {
                1
            };
            let m = measure(comm, op, cfg, &s, &pat, dev, false, Peer::Ring, runs)
                .with_context(|| format!("{phase} out-of-place"))?;
            let m_ip = measure(comm, op, cfg, &s, &pat, dev, true, Peer::Ring, runs)
                .with_context(|| format!("{phase} in-place"))?;
            let (t, w, t_ip, w_ip) = (m.time_us, m.wrong, m_ip.time_us, m_ip.wrong);
            let (alg, bus) = bandwidth(op, &s, es, n, t);
            let (alg_ip, bus_ip) = bandwidth(op, &s, es, n, t_ip);
            let row = CollectiveRow {
                op: op.name().into(),
                bytes: s.bytes(es),
                count: s.count as u64,
                dtype: cfg.dtype.clone(),
                redop: redop_label(op).into(),
                root: if op.rooted() { 0 } else { -1 },
                time_us: t,
                algbw_gbps: alg,
                busbw_gbps: bus,
                wrong: w,
                time_us_ip: t_ip,
                algbw_gbps_ip: alg_ip,
                busbw_gbps_ip: bus_ip,
                wrong_ip: w_ip,
            };
            if comm.rank() == 0 {
                tracing::info!(
                    "{:>12} {:>12} {:>8} {:>6} {:>6} {:>9.1} {:>8.2} {:>8.2} {:>6} {:>9.1} {:>8.2} {:>8.2} {:>6}  {}",
                    row.bytes, row.count, row.dtype, row.redop, row.root, row.time_us, row.algbw_gbps,
                    row.busbw_gbps, row.wrong, row.time_us_ip, row.algbw_gbps_ip, row.busbw_gbps_ip,
                    row.wrong_ip, op.name()
                );
            }
            if w + w_ip > 0 {
                tracing::error!("{phase}: {w} wrong out-of-place, {w_ip} wrong in-place");
            }
            done += 1.0;
            progress(&phase, done / total, Some(bus));
            rows.push(row);
        }
    }
    Ok(CollectiveResult {
        backend: comm.backend().into(),
        world_size: n as u32,
        rows,
        links: Vec::new(),
        ..Default::default()
    })
}

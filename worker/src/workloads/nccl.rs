//! Collective bandwidth, the way nccl-tests measures it.
//!
//! For every op and every size (min_bytes, ×factor, up to max_bytes) the rank
//! runs `warmup` untimed and `iters` timed operations out-of-place, then the same
//! in-place, and after each checks one more operation on fresh inputs against
//! the exact expected values (`#wrong`). Sizes, counts, algbw and busbw follow
//! nccl-tests (`setupArgs`, `*GetCollByteCount`, `*GetBw`), so a row can be laid
//! beside nccl-tests' output line by line.
//!
//! Inputs are small integers, `v(rank, i) = f((rank + i) mod p)`, chosen so that
//! every partial sum is exactly representable in float, bfloat16 and half: the
//! expected result is exact and any difference is a wrong element.

use std::time::Instant;

use anyhow::{Context, Result};
use gpuctl_proto::catalogue::NcclParams;
use gpuctl_proto::pb::{rank_result::Detail, CollectiveResult, CollectiveRow};
use gpuctl_proto::units::format_bytes;
use tch::{Device, Kind, Tensor};

use super::Outcome;
use crate::comm::{Collectives, Op};
use crate::context::Ctx;

/// nccl-tests' busbw factor: busbw = algbw × factor.
pub fn bus_factor(op: Op, nranks: usize) -> f64 {
    let n = nranks as f64;
    match op {
        Op::AllReduce => 2.0 * (n - 1.0) / n,
        Op::AllGather | Op::ReduceScatter | Op::AllToAll => (n - 1.0) / n,
        Op::Broadcast | Op::Reduce | Op::SendRecv => 1.0,
    }
}

/// The redop column as nccl-tests prints it: "sum" for the reductions and for
/// sendrecv (which nccl-tests runs with ncclSum), "none" for the others.
pub fn redop_label(op: Op) -> &'static str {
    if op.reduces() || op == Op::SendRecv {
        "sum"
    } else {
        "none"
    }
}

/// Buffer sizes of one step, in elements, as nccl-tests' `*GetCollByteCount`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// The per-rank count nccl-tests prints in its "count" column.
    pub count: usize,
    pub send: usize,
    pub recv: usize,
}

impl Sizes {
    /// The "size" column: the larger of the send and the receive buffer, in bytes.
    pub fn bytes(&self, elem_size: usize) -> u64 {
        (self.send.max(self.recv) * elem_size) as u64
    }
}

/// nccl-tests aligns all_gather and reduce_scatter counts to 4 elements per rank.
const ALIGN: usize = 4;

pub fn sizes(op: Op, bytes: u64, elem_size: usize, nranks: usize) -> Sizes {
    let count = bytes as usize / elem_size;
    let n = nranks;
    match op {
        Op::AllReduce | Op::Broadcast | Op::Reduce | Op::SendRecv => Sizes {
            count,
            send: count,
            recv: count,
        },
        Op::AllGather => {
            let base = count / (ALIGN * n) * ALIGN;
            Sizes {
                count: base,
                send: base,
                recv: base * n,
            }
        }
        Op::ReduceScatter => {
            let base = count / (ALIGN * n) * ALIGN;
            Sizes {
                count: base,
                send: base * n,
                recv: base,
            }
        }
        Op::AllToAll => {
            let base = count / n;
            Sizes {
                count: base,
                send: base * n,
                recv: base * n,
            }
        }
    }
}

/// algbw and busbw in GB/s (10^9 bytes/s) of one step taking `time_us`.
pub fn bandwidth(op: Op, s: &Sizes, elem_size: usize, nranks: usize, time_us: f64) -> (f64, f64) {
    if time_us <= 0.0 {
        return (0.0, 0.0);
    }
    let algbw = s.bytes(elem_size) as f64 / (time_us * 1e-6) / 1e9;
    (algbw, algbw * bus_factor(op, nranks))
}

/// The input pattern: `v(rank, i) = f((rank + i) mod p)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pattern {
    /// Period of the pattern.
    pub p: usize,
    /// Dense: v = (rank+i) mod p, values 0..p−1. Sparse: v = 1 when (rank+i) mod p
    /// is 0, else 0 (p = world size: every sum is exactly 1).
    pub sparse: bool,
    pub world: usize,
}

impl Pattern {
    /// The densest pattern whose sums over all ranks stay exact in `kind`.
    pub fn new(kind: Kind, world: usize) -> Pattern {
        // Largest integer up to which every integer is representable.
        let exact: usize = match kind {
            Kind::BFloat16 => 256,
            Kind::Half => 2048,
            _ => 1 << 24,
        };
        let m = (exact / world.max(1)).min(3);
        if m >= 1 {
            Pattern {
                p: m + 1,
                sparse: false,
                world,
            }
        } else {
            Pattern {
                p: world,
                sparse: true,
                world,
            }
        }
    }

    pub fn value(&self, rank: usize, i: usize) -> f64 {
        let x = (rank + i) % self.p;
        if self.sparse {
            (x == 0) as u8 as f64
        } else {
            x as f64
        }
    }

    /// `Σ_rank v(rank, i)`.
    pub fn sum(&self, i: usize) -> f64 {
        if self.sparse {
            return 1.0;
        }
        (0..self.world).map(|r| self.value(r, i)).sum()
    }

    /// `v(rank, start..start+len)` as a float tensor on `dev` (exact small integers).
    pub fn tensor(&self, rank: usize, start: usize, len: usize, dev: Device) -> Result<Tensor> {
        let idx = Tensor::f_arange(len as i64, (Kind::Int64, dev))?;
        let x = (idx + ((rank + start) % self.p) as i64).f_remainder(self.p as i64)?;
        let v = if self.sparse { x.f_eq(0)? } else { x };
        Ok(v.f_to_kind(Kind::Float)?)
    }

    /// `Σ_rank v(rank, start..start+len)` as a float tensor on `dev`.
    pub fn sum_tensor(&self, start: usize, len: usize, dev: Device) -> Result<Tensor> {
        if self.sparse {
            return Ok(Tensor::f_ones([len as i64], (Kind::Float, dev))?);
        }
        // The sum depends only on i mod p: look it up.
        let table: Vec<f32> = (0..self.p).map(|k| self.sum(k) as f32).collect();
        let table = Tensor::from_slice(&table).f_to_device(dev)?;
        let idx = (Tensor::f_arange(len as i64, (Kind::Int64, dev))? + (start % self.p) as i64)
            .f_remainder(self.p as i64)?;
        Ok(table.f_index_select(0, &idx)?)
    }
}

/// What `recv` must hold on `rank` after `op` (all inputs from [`Pattern`]),
/// or `None` where nccl-tests does not check (reduce on non-root ranks).
pub fn expected(
    op: Op,
    pat: &Pattern,
    s: &Sizes,
    rank: usize,
    dev: Device,
) -> Result<Option<Tensor>> {
    let n = pat.world;
    let c = s.count;
    Ok(Some(match op {
        Op::AllReduce => pat.sum_tensor(0, c, dev)?,
        Op::Reduce if rank == 0 => pat.sum_tensor(0, c, dev)?,
        Op::Reduce => return Ok(None),
        Op::Broadcast => pat.tensor(0, 0, c, dev)?,
        Op::AllGather => {
            let parts: Vec<Tensor> = (0..n)
                .map(|k| pat.tensor(k, 0, c, dev))
                .collect::<Result<_>>()?;
            Tensor::f_cat(&parts, 0)?
        }
        Op::ReduceScatter => pat.sum_tensor(rank * c, c, dev)?,
        Op::AllToAll => {
            let parts: Vec<Tensor> = (0..n)
                .map(|k| pat.tensor(k, rank * c, c, dev))
                .collect::<Result<_>>()?;
            Tensor::f_cat(&parts, 0)?
        }
        Op::SendRecv => pat.tensor((rank + n - 1) % n, 0, s.send, dev)?,
    }))
}

/// This rank's input for `op`: `v(rank, 0..send)`.
pub fn input(pat: &Pattern, s: &Sizes, rank: usize, kind: Kind, dev: Device) -> Result<Tensor> {
    Ok(pat.tensor(rank, 0, s.send, dev)?.f_to_kind(kind)?)
}

/// The elements of `got` that differ from `want`.
pub fn count_wrong(got: &Tensor, want: &Tensor) -> Result<u64> {
    let g = got.f_to_kind(Kind::Float)?;
    Ok(g.f_ne_tensor(want)?
        .f_sum(Kind::Int64)?
        .f_int64_value(&[])? as u64)
}

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
    })
}

pub use gpuctl_proto::catalogue::size_steps;

/// One timed measurement: (µs per op, #wrong).
fn measure(
    comm: &mut dyn Collectives,
    op: Op,
    cfg: &SweepConfig,
    s: &Sizes,
    pat: &Pattern,
    dev: Device,
    in_place: bool,
) -> Result<(f64, u64)> {
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
    let (send, recv) = make(true)?;
    for _ in 0..cfg.warmup {
        comm.run(op, &send, &recv)?;
    }
    comm.barrier()?;
    let t0 = Instant::now();
    for _ in 0..cfg.iters {
        comm.run(op, &send, &recv)?;
    }
    comm.synchronize()?;
    let time_us = t0.elapsed().as_secs_f64() * 1e6 / cfg.iters as f64;
    drop((send, recv));
    // Correctness on fresh inputs.
    let (send, recv) = make(true)?;
    comm.run(op, &send, &recv)?;
    comm.synchronize()?;
    let wrong = match expected(op, pat, s, r, dev)? {
        Some(want) => count_wrong(&recv, &want)?,
        None => 0,
    };
    Ok((time_us, wrong))
}

pub fn run(ctx: &Ctx, params: &NcclParams) -> Result<Outcome> {
    let cfg = config(params)?;
    let mut comm = ctx.make_comm()?;
    let out = sweep(
        comm.as_mut(),
        &cfg,
        ctx.dev.device,
        &|phase, frac, busbw| {
            ctx.sample_memory();
            match busbw {
                Some(b) => ctx.progress.update(phase, frac, &[("busbw_gbps", b)]),
                None => ctx.progress.update(phase, frac, &[]),
            }
        },
    )?;
    let version = comm.version();
    let total_wrong: u64 = out.rows.iter().map(|r| r.wrong + r.wrong_ip).sum();
    let error = (total_wrong > 0).then(|| {
        format!("{total_wrong} wrong elements in the collective results (see the #wrong columns)")
    });
    Ok(Outcome {
        detail: Detail::Collectives(out),
        nccl_version: Some(version),
        error,
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
        for &bytes in &steps {
            let s = sizes(op, bytes, es, n);
            let phase = format!("{} {}", op.name(), format_bytes(bytes));
            if s.count == 0 {
                tracing::debug!("{phase}: no element per rank at this size; skipped");
                done += 1.0;
                continue;
            }
            progress(&phase, done / total, None);
            let (t, w) = measure(comm, op, cfg, &s, &pat, dev, false)
                .with_context(|| format!("{phase} out-of-place"))?;
            let (t_ip, w_ip) = measure(comm, op, cfg, &s, &pat, dev, true)
                .with_context(|| format!("{phase} in-place"))?;
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_factors_are_nccl_tests() {
        assert_eq!(bus_factor(Op::AllReduce, 8), 2.0 * 7.0 / 8.0);
        assert_eq!(bus_factor(Op::AllReduce, 2), 1.0);
        assert_eq!(bus_factor(Op::AllReduce, 1), 0.0);
        for op in [Op::AllGather, Op::ReduceScatter, Op::AllToAll] {
            assert_eq!(bus_factor(op, 4), 0.75, "{op:?}");
        }
        for op in [Op::Broadcast, Op::Reduce, Op::SendRecv] {
            assert_eq!(bus_factor(op, 16), 1.0, "{op:?}");
        }
    }

    #[test]
    fn sizes_follow_nccl_tests() {
        // all_reduce 1 MiB float: 262144 elements, size printed as 1048576.
        let s = sizes(Op::AllReduce, 1 << 20, 4, 8);
        assert_eq!((s.count, s.bytes(4)), (262144, 1 << 20));
        // all_gather on 8 ranks: nccl-tests prints 1048576 / 32768.
        let s = sizes(Op::AllGather, 1 << 20, 4, 8);
        assert_eq!(
            (s.count, s.send, s.recv, s.bytes(4)),
            (32768, 32768, 262144, 1 << 20)
        );
        let s = sizes(Op::ReduceScatter, 1 << 20, 4, 8);
        assert_eq!(
            (s.count, s.send, s.recv, s.bytes(4)),
            (32768, 262144, 32768, 1 << 20)
        );
        // 3 ranks: counts aligned to 4 per rank for all_gather/reduce_scatter...
        let s = sizes(Op::AllGather, 1 << 20, 4, 3);
        assert_eq!((s.count, s.bytes(4)), (87380, 1048560));
        // ...but not for alltoall.
        let s = sizes(Op::AllToAll, 1 << 20, 4, 3);
        assert_eq!((s.count, s.send, s.bytes(4)), (87381, 262143, 1048572));
        let s = sizes(Op::SendRecv, 1 << 20, 2, 3);
        assert_eq!((s.count, s.bytes(2)), (524288, 1 << 20));
    }

    #[test]
    fn bandwidth_uses_the_printed_size() {
        // 1 GiB all_reduce in 3260 µs on 2 ranks: algbw = busbw = 329.4 GB/s.
        let s = sizes(Op::AllReduce, 1 << 30, 4, 2);
        let (alg, bus) = bandwidth(Op::AllReduce, &s, 4, 2, 3260.0);
        assert!((alg - 329.37).abs() < 0.01, "{alg}");
        assert_eq!(alg, bus);
        let s = sizes(Op::AllGather, 1 << 20, 4, 4);
        let (alg, bus) = bandwidth(Op::AllGather, &s, 4, 4, 100.0);
        assert!((alg - 10.48576).abs() < 1e-9 && (bus - alg * 0.75).abs() < 1e-12);
        assert_eq!(bandwidth(Op::AllReduce, &s, 4, 4, 0.0), (0.0, 0.0));
    }

    #[test]
    fn redop_column_matches_nccl_tests() {
        let labels: Vec<_> = Op::ALL.iter().map(|o| redop_label(*o)).collect();
        assert_eq!(labels, ["sum", "none", "sum", "none", "sum", "none", "sum"]);
    }

    #[test]
    fn size_steps_double() {
        assert_eq!(size_steps(1 << 20, 16 << 20, 2).len(), 5);
        assert_eq!(size_steps(1000, 1000, 2), vec![1000]);
        assert_eq!(
            size_steps(1 << 20, 64 << 20, 4),
            vec![1 << 20, 4 << 20, 16 << 20, 64 << 20]
        );
    }

    #[test]
    fn patterns_stay_exact() {
        for (kind, limit) in [
            (Kind::Float, 1u64 << 24),
            (Kind::BFloat16, 256),
            (Kind::Half, 2048),
        ] {
            for world in [1usize, 2, 3, 8, 85, 86, 100, 300, 1000, 4096] {
                let p = Pattern::new(kind, world);
                let max_sum = (0..p.p).map(|i| p.sum(i)).fold(0.0, f64::max);
                assert!(max_sum <= limit as f64, "{kind:?} world {world}: {max_sum}");
                assert!(max_sum >= 1.0);
                // Sums match a brute-force count.
                for i in 0..p.p.min(7) {
                    let brute: f64 = (0..world).map(|r| p.value(r, i)).sum();
                    assert_eq!(brute, p.sum(i));
                }
            }
        }
        let p = Pattern::new(Kind::BFloat16, 4);
        assert_eq!((p.p, p.sparse), (4, false));
        let p = Pattern::new(Kind::BFloat16, 300);
        assert!(p.sparse);
    }

    #[test]
    fn expected_values_on_the_host() {
        let pat = Pattern::new(Kind::Float, 3);
        let dev = Device::Cpu;
        let s = sizes(Op::AllReduce, 64, 4, 3);
        let e = Vec::<f32>::try_from(expected(Op::AllReduce, &pat, &s, 1, dev).unwrap().unwrap())
            .unwrap();
        // p = 4: sums over ranks 0..3 of (r+i)%4: i=0 → 0+1+2 = 3, i=1 → 1+2+3 = 6, i=2 → 2+3+0 = 5.
        assert_eq!(&e[..4], &[3.0, 6.0, 5.0, 4.0]);
        let s = sizes(Op::AllGather, 48 * 4, 4, 3);
        assert_eq!(s.count, 16);
        let e = Vec::<f32>::try_from(expected(Op::AllGather, &pat, &s, 0, dev).unwrap().unwrap())
            .unwrap();
        assert_eq!(e.len(), 48);
        assert_eq!((e[0], e[16], e[32], e[33]), (0.0, 1.0, 2.0, 3.0));
        let s = sizes(Op::SendRecv, 16, 4, 3);
        let e = Vec::<f32>::try_from(expected(Op::SendRecv, &pat, &s, 0, dev).unwrap().unwrap())
            .unwrap();
        assert_eq!(e, vec![2.0, 3.0, 0.0, 1.0]); // from rank 2
        assert!(expected(Op::Reduce, &pat, &s, 1, dev).unwrap().is_none());
    }
}

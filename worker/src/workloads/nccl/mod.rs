//! Collective bandwidth, the way nccl-tests measures it: the arithmetic both
//! patterns share (sizes, bandwidths, inputs and their exact expected results).
//!
//! * [`sweep`] — `--pattern all`: every op and size over every rank of the job.
//! * [`pairs`] — `--pattern pairs`: every pair of nodes, in rounds.
//! * [`bisect`] — `--pattern bisect`: halves of the nodes until the slow one is left.
//!
//! Sizes, counts, algbw and busbw follow nccl-tests (`setupArgs`,
//! `*GetCollByteCount`, `*GetBw`), so a row can be laid beside nccl-tests'
//! output line by line. Inputs are small integers, `v(rank, i) = f((rank + i)
//! mod p)`, chosen so that every partial sum is exactly representable in float,
//! bfloat16 and half: the expected result is exact and any difference is a
//! wrong element.

pub mod bisect;
pub mod pairs;
pub mod search;
pub mod sweep;

use anyhow::Result;
use gpuctl_core::catalogue::{NcclParams, NcclPattern};
use gpuctl_proto::pb::PhaseKind;
use tch::{Device, Kind, Tensor};

use super::Outcome;
use crate::comm::Op;
use crate::context::Ctx;

pub use sweep::{config, size_steps, sweep, SweepConfig};

/// Runs the pattern the job asks for.
pub fn run(ctx: &Ctx, params: &NcclParams) -> Result<Outcome> {
    match params.pattern {
        NcclPattern::All => sweep::run(ctx, params),
        NcclPattern::Pairs => pairs::run(ctx, params),
        NcclPattern::Bisect => bisect::run(ctx, params),
        NcclPattern::Search => search::run(ctx, params),
    }
}

/// What the patterns send as progress: the phase, and the busbw of the step
/// just done when there is one. The first call starts the measured phase.
fn report_progress(ctx: &Ctx) -> impl Fn(&str, f64, Option<f64>) + '_ {
    move |phase, frac, busbw| {
        ctx.sample_memory();
        // The patterns call this from their measuring loops alone (a sweep's
        // step, a round of pairs or of the search): what came before the
        // first call was set-up.
        ctx.progress.enter(PhaseKind::Measured);
        match busbw {
            Some(b) => ctx.progress.update(phase, frac, &[("busbw_gbps", b)]),
            None => ctx.progress.update(phase, frac, &[]),
        }
    }
}

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

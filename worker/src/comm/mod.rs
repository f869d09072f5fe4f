//! Collectives: one trait, two backends.
//!
//! * [`nccl::NcclComm`] — NCCL (through cudarc's raw calls) on the memory of
//!   CUDA tensors, on the null stream that libtorch computes on.
//! * [`tcp::TcpComm`] — a TCP mesh between the ranks (one socket per pair) with
//!   ring algorithms, on host memory, so every workload also runs without a GPU.
//!
//! Buffers are `tch::Tensor`s (1-d, contiguous). Every call takes a `send` and a
//! `recv` tensor; they may share memory (in-place, the way nccl-tests runs it:
//! the same tensor for all_reduce, `send = recv.narrow(rank*c, c)` for
//! all_gather, `recv = send.narrow(rank*c, c)` for reduce_scatter). The only
//! reduction is a sum, as in nccl-tests' default.

pub mod abort;
pub mod nccl;
mod side;
pub mod tcp;
pub mod watched;

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{bail, Result};
use tch::{Device, Kind, Tensor};

/// The collectives nccl-tests measures, by the names the job spec uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
    SendRecv,
}

impl Op {
    pub const ALL: [Op; 7] = [
        Op::AllReduce,
        Op::AllGather,
        Op::ReduceScatter,
        Op::Broadcast,
        Op::Reduce,
        Op::AllToAll,
        Op::SendRecv,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::AllGather => "all_gather",
            Op::ReduceScatter => "reduce_scatter",
            Op::Broadcast => "broadcast",
            Op::Reduce => "reduce",
            Op::AllToAll => "alltoall",
            Op::SendRecv => "sendrecv",
        }
    }

    pub fn parse(name: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|o| o.name() == name)
    }

    /// Broadcast and reduce have a root (rank 0 here, as nccl-tests' default).
    pub fn rooted(self) -> bool {
        matches!(self, Op::Broadcast | Op::Reduce)
    }

    /// Ops that add numbers (and so need a numeric element type).
    pub fn reduces(self) -> bool {
        matches!(self, Op::AllReduce | Op::ReduceScatter | Op::Reduce)
    }
}

/// Element types the host backend knows how to add.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    F32,
    BF16,
    F16,
    F64,
    I32,
    I64,
    /// Moved but never added.
    Opaque(usize),
}

impl Elem {
    pub fn of(kind: Kind) -> Elem {
        match kind {
            Kind::Float => Elem::F32,
            Kind::BFloat16 => Elem::BF16,
            Kind::Half => Elem::F16,
            Kind::Double => Elem::F64,
            Kind::Int => Elem::I32,
            Kind::Int64 => Elem::I64,
            k => Elem::Opaque(k.elt_size_in_bytes()),
        }
    }

    /// The tch kind of a summable element type.
    pub fn kind(self) -> Option<Kind> {
        Some(match self {
            Elem::F32 => Kind::Float,
            Elem::BF16 => Kind::BFloat16,
            Elem::F16 => Kind::Half,
            Elem::F64 => Kind::Double,
            Elem::I32 => Kind::Int,
            Elem::I64 => Kind::Int64,
            Elem::Opaque(_) => return None,
        })
    }

    pub fn size(self) -> usize {
        match self {
            Elem::F32 | Elem::I32 => 4,
            Elem::BF16 | Elem::F16 => 2,
            Elem::F64 | Elem::I64 => 8,
            Elem::Opaque(n) => n,
        }
    }
}

/// From this many elements on, sums go through libtorch.
const TORCH_ADD_MIN: usize = 4096;

/// `dst[i] += src[i]` on raw little-endian bytes of one element type. bf16 and
/// fp16 are added in fp32 and rounded back after every addition, as NCCL does.
pub fn add_into(dst: &mut [u8], src: &[u8], elem: Elem) -> Result<()> {
    if dst.len() != src.len() {
        bail!(
            "internal: add_into on {} and {} bytes",
            dst.len(),
            src.len()
        );
    }
    let n = dst.len() / elem.size().max(1);
    if n >= TORCH_ADD_MIN {
        if let Some(kind) = elem.kind() {
            // libtorch's vectorised CPU kernel (bf16/fp16 computed in fp32 and
            // rounded per addition, as here): fast even in debug builds.
            // SAFETY: both views cover exactly the given slices, which outlive
            // the tensors; dst is written in place and does not overlap src.
            let (mut d, s) = unsafe {
                (
                    Tensor::f_from_blob(dst.as_mut_ptr(), &[n as i64], &[1], kind, Device::Cpu)?,
                    Tensor::f_from_blob(src.as_ptr(), &[n as i64], &[1], kind, Device::Cpu)?,
                )
            };
            let _ = d.f_add_(&s)?;
            return Ok(());
        }
    }
    match elem {
        Elem::F32 => add_typed::<f32>(dst, src, |a, b| a + b),
        Elem::F64 => add_typed::<f64>(dst, src, |a, b| a + b),
        Elem::I32 => add_typed::<i32>(dst, src, i32::wrapping_add),
        Elem::I64 => add_typed::<i64>(dst, src, i64::wrapping_add),
        Elem::BF16 => add_typed::<half::bf16>(dst, src, |a, b| {
            half::bf16::from_f32(a.to_f32() + b.to_f32())
        }),
        Elem::F16 => add_typed::<half::f16>(dst, src, |a, b| {
            half::f16::from_f32(a.to_f32() + b.to_f32())
        }),
        Elem::Opaque(_) => bail!("cannot add elements of this type; use float, bfloat16 or half"),
    }
    Ok(())
}

/// Plain-old-data number types whose every bit pattern is a value.
trait Pod: Copy {}
impl Pod for f32 {}
impl Pod for f64 {}
impl Pod for i32 {}
impl Pod for i64 {}
impl Pod for half::bf16 {}
impl Pod for half::f16 {}

fn add_typed<T: Pod>(dst: &mut [u8], src: &[u8], add: impl Fn(T, T) -> T) {
    let size = std::mem::size_of::<T>();
    // SAFETY: T is plain old data (every bit pattern valid); align_to only
    // yields the aligned middle part, the rest is handled bytewise below.
    let (dp, dm, ds) = unsafe { dst.align_to_mut::<T>() };
    let (sp, sm, ss) = unsafe { src.align_to::<T>() };
    if dp.is_empty() && sp.is_empty() && ds.is_empty() && ss.is_empty() {
        for (d, s) in dm.iter_mut().zip(sm) {
            *d = add(*d, *s);
        }
        return;
    }
    // Unaligned buffers (host tensors and Vecs are aligned; this is a fallback).
    for (d, s) in dst.chunks_exact_mut(size).zip(src.chunks_exact(size)) {
        // SAFETY: chunks of exactly size_of::<T>() bytes; unaligned reads/writes.
        unsafe {
            let a = std::ptr::read_unaligned(d.as_ptr() as *const T);
            let b = std::ptr::read_unaligned(s.as_ptr() as *const T);
            std::ptr::write_unaligned(d.as_mut_ptr() as *mut T, add(a, b));
        }
    }
}

/// What a background all_reduce loop did (stress `with_comm`).
#[derive(Clone, Copy, Debug, Default)]
pub struct LoopStats {
    pub ops: u64,
    pub bytes_per_op: u64,
    pub seconds: f64,
}

/// A point on the side (communication) stream that compute can wait for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ticket(pub u64);

/// Side-stream time since the last [`Collectives::side_times`]: seconds the
/// side stream spent in collectives, and seconds the compute stream stood
/// waiting for them (the communication that was not hidden).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SideTimes {
    pub busy_s: f64,
    pub stalled_s: f64,
}

/// Collective operations over all ranks of a job. Every rank must make the same
/// calls in the same order with the same sizes. Calls may return before the
/// device finished (NCCL); [`Collectives::synchronize`] waits for that.
pub trait Collectives: Send {
    /// `"nccl"` or `"tcp-ring"`.
    fn backend(&self) -> &'static str;
    /// NCCL's version as loaded (`2.28.9`), or the backend name.
    fn version(&self) -> String;
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;

    /// `recv = Σ_ranks send`; equal element counts.
    fn all_reduce(&mut self, send: &Tensor, recv: &Tensor) -> Result<()>;
    /// `recv[k*c..(k+1)*c] = send of rank k`; `recv` has `world × c` elements.
    fn all_gather(&mut self, send: &Tensor, recv: &Tensor) -> Result<()>;
    /// `recv = Σ_ranks send[rank*c..(rank+1)*c]`; `send` has `world × c` elements.
    fn reduce_scatter(&mut self, send: &Tensor, recv: &Tensor) -> Result<()>;
    /// `recv = send of root` on every rank.
    fn broadcast(&mut self, send: &Tensor, recv: &Tensor, root: usize) -> Result<()>;
    /// `recv = Σ_ranks send` on the root; other ranks' `recv` is left alone.
    fn reduce(&mut self, send: &Tensor, recv: &Tensor, root: usize) -> Result<()>;
    /// `recv[k*c..] = send[rank*c..] of rank k`; both have `world × c` elements.
    fn alltoall(&mut self, send: &Tensor, recv: &Tensor) -> Result<()>;
    /// Sends `send` to rank `to` while receiving `recv` from rank `from`.
    fn sendrecv(&mut self, send: &Tensor, to: usize, recv: &Tensor, from: usize) -> Result<()>;
    /// Sends `t` (1-d, contiguous) to rank `to`, which calls [`Collectives::recv`]
    /// with as many elements; the other ranks take no part.
    fn send(&mut self, _t: &Tensor, _to: usize) -> Result<()> {
        bail!("{}: no one-way send", self.backend())
    }
    /// Receives into `t` what rank `from` sends with [`Collectives::send`].
    fn recv(&mut self, _t: &Tensor, _from: usize) -> Result<()> {
        bail!("{}: no one-way receive", self.backend())
    }
    /// Returns when every rank has called it (and, on a GPU, finished its queued work).
    fn barrier(&mut self) -> Result<()>;
    /// Waits until the operations issued so far have finished on the device.
    fn synchronize(&mut self) -> Result<()>;

    /// Whether a call holds the host until the other ranks have taken part
    /// (TCP); NCCL's calls only queue work on the device, so the host
    /// waits for peers at a synchronisation, not in the call.
    fn holds_host(&self) -> bool {
        true
    }

    /// Whether collectives between [`Collectives::side_begin`] and
    /// [`Collectives::side_end`] really run beside compute (NCCL: on a second
    /// CUDA stream). Where not, they run when called, as always.
    fn overlaps(&self) -> bool {
        false
    }

    /// Later collectives go to the side stream, after everything queued so
    /// far on the compute stream. Their tensors must have been written by
    /// compute queued before this call, and must stay alive (not be dropped
    /// or overwritten by compute) until [`Collectives::side_wait`] for the
    /// ticket of their group: libtorch's allocator knows only the compute
    /// stream and would hand their memory to new compute at once.
    fn side_begin(&mut self) -> Result<()> {
        Ok(())
    }

    /// Later collectives go to the compute stream again; the ticket stands
    /// for the side work queued so far.
    fn side_end(&mut self) -> Result<Ticket> {
        Ok(Ticket::default())
    }

    /// The compute stream waits for `ticket` (the host does not block).
    fn side_wait(&mut self, _ticket: Ticket) -> Result<()> {
        Ok(())
    }

    /// Side-stream busy and stall time since the last call, read after
    /// [`Collectives::synchronize`]; `None` where the backend does not time
    /// (its calls are synchronous: the caller times them).
    fn side_times(&mut self) -> Result<Option<SideTimes>> {
        Ok(None)
    }

    /// Makes the calling thread fit to issue collectives (NCCL: the CUDA context).
    fn bind_thread(&self) -> Result<()> {
        Ok(())
    }

    /// Runs one op the way the nccl workload calls it: root 0, and for sendrecv
    /// the ring pattern of nccl-tests (send to rank+1, receive from rank−1).
    fn run(&mut self, op: Op, send: &Tensor, recv: &Tensor) -> Result<()> {
        let (r, n) = (self.rank(), self.world_size());
        match op {
            Op::AllReduce => self.all_reduce(send, recv),
            Op::AllGather => self.all_gather(send, recv),
            Op::ReduceScatter => self.reduce_scatter(send, recv),
            Op::Broadcast => self.broadcast(send, recv, 0),
            Op::Reduce => self.reduce(send, recv, 0),
            Op::AllToAll => self.alltoall(send, recv),
            Op::SendRecv => self.sendrecv(send, (r + 1) % n, recv, (r + n - 1) % n),
        }
    }

    /// Keeps all_reduces of `buf` (1-d float, zeros) going until `stop` is set on
    /// any rank. The last element carries each rank's stop flag, so every rank
    /// sees the same sum after the same all_reduce and all stop together: the
    /// ranks always issue the same number of collectives.
    fn all_reduce_loop(&mut self, buf: &Tensor, stop: &AtomicBool) -> Result<LoopStats> {
        self.bind_thread()?;
        let n = buf.numel() as i64;
        if n < 2 || buf.kind() != Kind::Float {
            bail!("internal: all_reduce_loop wants a float tensor of 2 elements or more");
        }
        let mut flag = buf.narrow(0, n - 1, 1);
        let start = std::time::Instant::now();
        let mut ops = 0u64;
        loop {
            let want_stop = stop.load(Ordering::Relaxed);
            let _ = flag.fill_(if want_stop { 1.0 } else { 0.0 });
            self.all_reduce(buf, buf)?;
            ops += 1;
            // Reading the flag waits for this all_reduce to finish.
            if flag.double_value(&[0]) > 0.0 {
                break;
            }
        }
        Ok(LoopStats {
            ops,
            bytes_per_op: (n as u64) * 4,
            seconds: start.elapsed().as_secs_f64(),
        })
    }
}

/// Checks the shapes that every backend relies on, with messages that say which.
pub(crate) fn check_sizes(op: Op, send: &Tensor, recv: &Tensor, world: usize) -> Result<()> {
    for (what, t) in [("send", send), ("recv", recv)] {
        if t.dim() != 1 || !t.is_contiguous() {
            bail!(
                "{}: the {what} tensor must be 1-d and contiguous (got shape {:?})",
                op.name(),
                t.size()
            );
        }
    }
    if send.kind() != recv.kind() {
        bail!(
            "{}: send is {:?} but recv is {:?}",
            op.name(),
            send.kind(),
            recv.kind()
        );
    }
    let (s, r, n) = (send.numel(), recv.numel(), world);
    let ok = match op {
        Op::AllReduce | Op::Broadcast | Op::Reduce | Op::SendRecv => s == r,
        Op::AllGather => r == s * n,
        Op::ReduceScatter => s == r * n,
        Op::AllToAll => s == r && s % n == 0,
    };
    if !ok {
        bail!(
            "{}: {s} send and {r} recv elements do not fit {n} ranks",
            op.name()
        );
    }
    if op.reduces() && matches!(Elem::of(send.kind()), Elem::Opaque(_)) {
        bail!("{}: cannot sum {:?} elements", op.name(), send.kind());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_names_round_trip_and_match_the_spec() {
        for op in Op::ALL {
            assert_eq!(Op::parse(op.name()), Some(op));
        }
        let names: Vec<_> = Op::ALL.iter().map(|o| o.name()).collect();
        assert_eq!(names, gpuctl_core::spec::COLLECTIVE_OPS);
        assert_eq!(Op::parse("bogus"), None);
    }

    #[test]
    fn half_precision_sums_round_like_nccl() {
        let a = half::bf16::from_f32(1.0).to_bits().to_le_bytes();
        let b = half::bf16::from_f32(2.0).to_bits().to_le_bytes();
        let mut d = a.to_vec();
        add_into(&mut d, &b, Elem::BF16).unwrap();
        assert_eq!(
            half::bf16::from_bits(u16::from_le_bytes([d[0], d[1]])).to_f32(),
            3.0
        );
        // 256 + 1 is not a bf16: rounds to even (256).
        let a = half::bf16::from_f32(256.0).to_bits().to_le_bytes();
        let b = half::bf16::from_f32(1.0).to_bits().to_le_bytes();
        let mut d = a.to_vec();
        add_into(&mut d, &b, Elem::BF16).unwrap();
        assert_eq!(
            half::bf16::from_bits(u16::from_le_bytes([d[0], d[1]])).to_f32(),
            256.0
        );
        let mut d = 1.5f32.to_le_bytes().to_vec();
        add_into(&mut d, &2.25f32.to_le_bytes(), Elem::F32).unwrap();
        assert_eq!(f32::from_le_bytes(d[..].try_into().unwrap()), 3.75);
        assert!(add_into(&mut [0u8; 1], &[0u8; 1], Elem::Opaque(1)).is_err());
        // Misaligned buffers take the bytewise path and agree.
        let a: Vec<u8> = [1.0f32, 2.0, 3.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let b: Vec<u8> = [0.5f32, 0.25, -3.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let mut d = [0u8; 13];
        d[1..].copy_from_slice(&a);
        let mut s = [0u8; 13];
        s[1..].copy_from_slice(&b);
        add_into(&mut d[1..], &s[1..], Elem::F32).unwrap();
        let got: Vec<f32> = d[1..]
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, vec![1.5, 2.25, 0.0]);
        // The libtorch path (long buffers) and the Rust path agree bit for bit.
        for elem in [Elem::F32, Elem::BF16, Elem::F16] {
            let n = TORCH_ADD_MIN * 2 + 3;
            let es = elem.size();
            let mk = |seed: u32| -> Vec<u8> {
                (0..n * es)
                    .map(|i| {
                        ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 13) as u8 & 0x3f
                    })
                    .collect()
            };
            let (a, b) = (mk(1), mk(7));
            let mut fast = a.clone();
            add_into(&mut fast, &b, elem).unwrap();
            let mut slow = a.clone();
            for (d, s) in slow.chunks_mut(1024 * es).zip(b.chunks(1024 * es)) {
                add_into(d, s, elem).unwrap();
            }
            assert_eq!(fast, slow, "{elem:?}");
        }
    }
}

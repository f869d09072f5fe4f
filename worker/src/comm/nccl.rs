//! NCCL through cudarc's raw calls, on the memory of CUDA tensors.
//!
//! As checked on H200 (DESIGN.md): rank 0 makes the 128-byte unique id and
//! publishes it under the rendezvous key `nccl/id`; every rank calls
//! `ncclCommInitRank`; collectives run on `tensor.data_ptr()` with the null
//! (legacy default) stream, the stream libtorch computes on, so they are
//! ordered with libtorch's kernels without extra synchronisation. Between
//! `side_begin` and `side_end` they run on a side stream instead
//! ([`super::side`]), beside compute.
//!
//! cudarc loads NCCL at run time (`dynamic-loading`), looking for `libnccl.so`:
//! the agent puts a folder with `libnccl.so` → PyTorch's `libnccl.so.2` first on
//! `LD_LIBRARY_PATH`, so this is the NCCL libtorch_cuda uses. The version is read
//! from the library that was loaded (`ncclGetVersion`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use cudarc::driver::CudaContext;
use cudarc::nccl::{result, sys};
use tch::{Device, Kind, Tensor};

use super::side::SideStream;
use super::{check_sizes, Collectives, Op, SideTimes, Ticket};
use crate::rendezvous::Rendezvous;

/// Whether a `libnccl.so` can be loaded at all (cudarc panics on a missing one).
pub fn nccl_present() -> bool {
    // SAFETY: only tries to dlopen candidate names.
    unsafe { sys::is_culib_present() }
}

/// `2.28.9` from NCCL's version code, or why it could not be read.
pub fn nccl_version() -> Result<String> {
    if !nccl_present() {
        bail!("{}", missing_nccl());
    }
    let code = result::get_nccl_version().map_err(|e| anyhow!("ncclGetVersion failed: {e:?}"))?;
    Ok(format_version(code))
}

/// NCCL's version code: major×10000 + minor×100 + patch since 2.9 (major×1000 before).
pub fn format_version(code: i32) -> String {
    if code >= 10000 {
        format!("{}.{}.{}", code / 10000, (code % 10000) / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, (code % 1000) / 100, code % 100)
    }
}

fn missing_nccl() -> String {
    "libnccl.so was not found: put a folder holding a `libnccl.so` link to PyTorch's \
     libnccl.so.2 (site-packages/nvidia/nccl/lib) first on LD_LIBRARY_PATH"
        .to_string()
}

fn nccl_err(what: &str, e: result::NcclError) -> anyhow::Error {
    anyhow!("{what} failed: NCCL error {:?}", e.0)
}

fn dtype(kind: Kind) -> Result<sys::ncclDataType_t> {
    use sys::ncclDataType_t as D;
    Ok(match kind {
        Kind::Float => D::ncclFloat32,
        Kind::BFloat16 => D::ncclBfloat16,
        Kind::Half => D::ncclFloat16,
        Kind::Double => D::ncclFloat64,
        Kind::Int => D::ncclInt32,
        Kind::Int64 => D::ncclInt64,
        Kind::Uint8 => D::ncclUint8,
        Kind::Int8 => D::ncclInt8,
        k => bail!("NCCL has no data type for {k:?}"),
    })
}

pub struct NcclComm {
    comm: sys::ncclComm_t,
    rank: usize,
    world: usize,
    ordinal: usize,
    version: String,
    ctx: Arc<CudaContext>,
    /// Made on the first `side_begin`.
    side: Option<SideStream>,
    /// Whether collectives go to the side stream now.
    on_side: bool,
    /// Temporaries (copies of aliased inputs) that side-stream collectives
    /// read: libtorch's allocator would hand their memory to null-stream work
    /// at once, so they live until the next synchronize.
    keep: Vec<Tensor>,
}

// SAFETY: an NCCL communicator may be used from any thread, one at a time; the
// &mut self receivers of Collectives make sure of "one at a time".
unsafe impl Send for NcclComm {}

impl NcclComm {
    /// Creates the communicator for CUDA ordinal `ordinal` (0 when the agent set
    /// `CUDA_VISIBLE_DEVICES`), waiting up to `timeout` for rank 0's id.
    pub fn new(
        rank: usize,
        world: usize,
        ordinal: usize,
        rdzv: &dyn Rendezvous,
        timeout: Duration,
    ) -> Result<Self> {
        let version = nccl_version()?;
        // The primary context, the one libtorch uses; current on this thread.
        let ctx = CudaContext::new(ordinal).context("opening the CUDA context")?;
        ctx.bind_to_thread()?;
        // Let libtorch initialise its side of the device first.
        let _warm = Tensor::f_zeros([1], (Kind::Float, Device::Cuda(ordinal)))?;
        let id = if rank == 0 {
            let id = result::get_uniqueid().map_err(|e| nccl_err("ncclGetUniqueId", e))?;
            let bytes: Vec<u8> = id.internal.iter().map(|c| *c as u8).collect();
            rdzv.put("nccl/id", &bytes)?;
            id
        } else {
            let bytes = rdzv
                .get("nccl/id", timeout)
                .context("waiting for rank 0's NCCL id")?;
            if bytes.len() != 128 {
                bail!("rank 0's NCCL id has {} bytes, not 128", bytes.len());
            }
            let mut internal = [0 as std::ffi::c_char; 128];
            for (d, s) in internal.iter_mut().zip(&bytes) {
                *d = *s as std::ffi::c_char;
            }
            sys::ncclUniqueId { internal }
        };
        tracing::info!(rank, world, nccl = %version, "ncclCommInitRank");
        let mut comm = std::mem::MaybeUninit::uninit();
        // SAFETY: comm is written by NCCL on success.
        let comm = unsafe {
            result::comm_init_rank(comm.as_mut_ptr(), world as i32, id, rank as i32)
                .map_err(|e| nccl_err("ncclCommInitRank", e))?;
            comm.assume_init()
        };
        super::abort::register(comm as usize, abort);
        Ok(Self {
            comm,
            rank,
            world,
            ordinal,
            version,
            ctx,
            side: None,
            on_side: false,
            keep: Vec::new(),
        })
    }

    /// The stream collectives go to now: null, or the side stream in a group.
    fn stream(&self) -> sys::cudaStream_t {
        match &self.side {
            Some(s) if self.on_side => s.raw() as sys::cudaStream_t,
            _ => std::ptr::null_mut(),
        }
    }

    /// A copy of `send` where it overlaps `recv` (grouped send/recv on one
    /// buffer would race). On the side stream, the side waits for the copy
    /// that compute makes, and the copy outlives the collective.
    fn unaliased(&mut self, send: &Tensor, recv: &Tensor) -> Result<Tensor> {
        if !overlaps(send, recv) {
            return Ok(send.shallow_clone());
        }
        let input = send.copy();
        if self.on_side {
            if let Some(s) = self.side.as_mut() {
                s.follow_compute()?;
            }
            self.keep.push(input.shallow_clone());
        }
        Ok(input)
    }

    fn check_device(&self, op: Op, ts: &[&Tensor]) -> Result<sys::ncclDataType_t> {
        for t in ts {
            if t.device() != Device::Cuda(self.ordinal) {
                bail!(
                    "{}: NCCL needs tensors on cuda:{}, got {:?}",
                    op.name(),
                    self.ordinal,
                    t.device()
                );
            }
        }
        dtype(ts[0].kind())
    }

    fn grouped<F: FnOnce() -> Result<()>>(&self, f: F) -> Result<()> {
        result::group_start().map_err(|e| nccl_err("ncclGroupStart", e))?;
        let r = f();
        let end = result::group_end().map_err(|e| nccl_err("ncclGroupEnd", e));
        r.and(end.map(|_| ()))
    }
}

fn overlaps(a: &Tensor, b: &Tensor) -> bool {
    let la = a.numel() * a.kind().elt_size_in_bytes();
    let lb = b.numel() * b.kind().elt_size_in_bytes();
    let (a0, b0) = (a.data_ptr() as usize, b.data_ptr() as usize);
    la > 0 && lb > 0 && a0 < b0 + lb && b0 < a0 + la
}

/// `ncclCommAbort` for the SIGTERM watcher ([`super::abort`]), which
/// knows the communicator by its raw handle only.
fn abort(comm: usize) {
    // SAFETY: a communicator registered by `NcclComm::new` and not yet
    // destroyed (Drop unregisters it first, under the same lock).
    if let Err(e) = unsafe { result::comm_abort(comm as sys::ncclComm_t) } {
        eprintln!("gpuctl-worker: ncclCommAbort failed: NCCL error {:?}", e.0);
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        super::abort::unregister(self.comm as usize);
        // SAFETY: the communicator is ours and no longer used.
        unsafe {
            let _ = result::comm_destroy(self.comm);
        }
        // The side stream after the communicator that queued work on it.
        self.side = None;
    }
}

impl Collectives for NcclComm {
    fn backend(&self) -> &'static str {
        "nccl"
    }

    fn version(&self) -> String {
        self.version.clone()
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn bind_thread(&self) -> Result<()> {
        self.ctx.bind_to_thread()?;
        Ok(())
    }

    fn all_reduce(&mut self, send: &Tensor, recv: &Tensor) -> Result<()> {
        check_sizes(Op::AllReduce, send, recv, self.world)?;
        let dt = self.check_device(Op::AllReduce, &[send, recv])?;
        // SAFETY: pointers of live CUDA tensors of the checked sizes.
        unsafe {
            result::all_reduce(
                send.data_ptr(),
                recv.data_ptr(),
                send.numel(),
                dt,
                sys::ncclRedOp_t::ncclSum,
                self.comm,
                self.stream(),
            )
        }
        .map_err(|e| nccl_err("ncclAllReduce", e))?;
        Ok(())
    }

    fn all_gather(&mut self, send: &Tensor, recv: &Tensor) -> Result<()> {
        check_sizes(Op::AllGather, send, recv, self.world)?;
        let dt = self.check_device(Op::AllGather, &[send, recv])?;
        // SAFETY: as above.
        unsafe {
            result::all_gather(
                send.data_ptr(),
                recv.data_ptr(),
                send.numel(),
                dt,
                self.comm,
                self.stream(),
            )
        }
        .map_err(|e| nccl_err("ncclAllGather", e))?;
        Ok(())
    }

    fn reduce_scatter(&mut self, send: &Tensor, recv: &Tensor) -> Result<()> {
        check_sizes(Op::ReduceScatter, send, recv, self.world)?;
        let dt = self.check_device(Op::ReduceScatter, &[send, recv])?;
        // SAFETY: as above.
        unsafe {
            result::reduce_scatter(
                send.data_ptr(),
                recv.data_ptr(),
                recv.numel(),
                dt,
                sys::ncclRedOp_t::ncclSum,
                self.comm,
                self.stream(),
            )
        }
        .map_err(|e| nccl_err("ncclReduceScatter", e))?;
        Ok(())
    }

    fn broadcast(&mut self, send: &Tensor, recv: &Tensor, root: usize) -> Result<()> {
        check_sizes(Op::Broadcast, send, recv, self.world)?;
        let dt = self.check_device(Op::Broadcast, &[send, recv])?;
        // SAFETY: as above.
        unsafe {
            result::broadcast(
                send.data_ptr(),
                recv.data_ptr(),
                send.numel(),
                dt,
                root as i32,
                self.comm,
                self.stream(),
            )
        }
        .map_err(|e| nccl_err("ncclBroadcast", e))?;
        Ok(())
    }

    fn reduce(&mut self, send: &Tensor, recv: &Tensor, root: usize) -> Result<()> {
        check_sizes(Op::Reduce, send, recv, self.world)?;
        let dt = self.check_device(Op::Reduce, &[send, recv])?;
        // SAFETY: as above.
        unsafe {
            result::reduce(
                send.data_ptr(),
                recv.data_ptr(),
                send.numel(),
                dt,
                sys::ncclRedOp_t::ncclSum,
                root as i32,
                self.comm,
                self.stream(),
            )
        }
        .map_err(|e| nccl_err("ncclReduce", e))?;
        Ok(())
    }

    fn alltoall(&mut self, send: &Tensor, recv: &Tensor) -> Result<()> {
        check_sizes(Op::AllToAll, send, recv, self.world)?;
        let dt = self.check_device(Op::AllToAll, &[send, recv])?;
        let input = self.unaliased(send, recv)?;
        let n = self.world;
        let c = send.numel() / n;
        let es = send.kind().elt_size_in_bytes();
        self.grouped(|| {
            for k in 0..n {
                // SAFETY: chunk k of live CUDA tensors of n×c elements.
                unsafe {
                    let s = (input.data_ptr() as *const u8).add(k * c * es) as *const _;
                    let r = (recv.data_ptr() as *mut u8).add(k * c * es) as *mut _;
                    result::send(s, c, dt, k as i32, self.comm, self.stream())
                        .map_err(|e| nccl_err("ncclSend", e))?;
                    result::recv(r, c, dt, k as i32, self.comm, self.stream())
                        .map_err(|e| nccl_err("ncclRecv", e))?;
                }
            }
            Ok(())
        })?;
        // On the null stream, dropping the copy is safe: libtorch's allocator
        // reuses it only there, after NCCL's kernels (on the side, `keep` holds it).
        drop(input);
        Ok(())
    }

    fn sendrecv(&mut self, send: &Tensor, to: usize, recv: &Tensor, from: usize) -> Result<()> {
        check_sizes(Op::SendRecv, send, recv, self.world)?;
        let dt = self.check_device(Op::SendRecv, &[send, recv])?;
        let input = self.unaliased(send, recv)?;
        let c = send.numel();
        self.grouped(|| {
            // SAFETY: live CUDA tensors of c elements.
            unsafe {
                result::send(input.data_ptr(), c, dt, to as i32, self.comm, self.stream())
                    .map_err(|e| nccl_err("ncclSend", e))?;
                result::recv(
                    recv.data_ptr(),
                    c,
                    dt,
                    from as i32,
                    self.comm,
                    self.stream(),
                )
                .map_err(|e| nccl_err("ncclRecv", e))?;
            }
            Ok(())
        })?;
        drop(input);
        Ok(())
    }

    fn send(&mut self, t: &Tensor, to: usize) -> Result<()> {
        check_sizes(Op::SendRecv, t, t, self.world)?;
        let dt = self.check_device(Op::SendRecv, &[t])?;
        if to >= self.world || to == self.rank {
            bail!("send: peer {to} is not another rank of {}", self.world);
        }
        let c = t.numel();
        // SAFETY: a live CUDA tensor of c elements.
        unsafe {
            result::send(t.data_ptr(), c, dt, to as i32, self.comm, self.stream())
                .map_err(|e| nccl_err("ncclSend", e))?;
        }
        Ok(())
    }

    fn recv(&mut self, t: &Tensor, from: usize) -> Result<()> {
        check_sizes(Op::SendRecv, t, t, self.world)?;
        let dt = self.check_device(Op::SendRecv, &[t])?;
        if from >= self.world || from == self.rank {
            bail!("recv: peer {from} is not another rank of {}", self.world);
        }
        let c = t.numel();
        // SAFETY: a live CUDA tensor of c elements.
        unsafe {
            result::recv(t.data_ptr(), c, dt, from as i32, self.comm, self.stream())
                .map_err(|e| nccl_err("ncclRecv", e))?;
        }
        Ok(())
    }

    fn barrier(&mut self) -> Result<()> {
        let t = Tensor::f_zeros([1], (Kind::Float, Device::Cuda(self.ordinal)))?;
        if self.on_side {
            // The zeros are written on the compute stream.
            if let Some(s) = self.side.as_mut() {
                s.follow_compute()?;
            }
        }
        self.all_reduce(&t, &t)?;
        self.synchronize()
    }

    fn synchronize(&mut self) -> Result<()> {
        // The whole device: the side stream too.
        tch::Cuda::synchronize(self.ordinal as i64);
        self.keep.clear();
        Ok(())
    }

    fn holds_host(&self) -> bool {
        false
    }
    fn overlaps(&self) -> bool {
        true
    }

    fn side_begin(&mut self) -> Result<()> {
        if self.side.is_none() {
            self.side = Some(SideStream::new(self.ctx.clone())?);
        }
        let side = self.side.as_mut().expect("made above");
        side.begin()?;
        self.on_side = true;
        Ok(())
    }

    fn side_end(&mut self) -> Result<Ticket> {
        let Some(side) = self.side.as_mut() else {
            bail!("side_end without side_begin");
        };
        let t = side.end()?;
        self.on_side = false;
        Ok(t)
    }

    fn side_wait(&mut self, ticket: Ticket) -> Result<()> {
        let Some(side) = self.side.as_mut() else {
            bail!(
                "side_wait for unknown ticket {}: side_begin was never called",
                ticket.0
            );
        };
        side.wait(ticket)
    }

    fn side_times(&mut self) -> Result<Option<SideTimes>> {
        match self.side.as_mut() {
            // Nothing went to the side: no communication time.
            None => Ok(Some(SideTimes::default())),
            Some(side) => {
                let t = side.times()?;
                self.keep.clear();
                Ok(Some(t))
            }
        }
    }
}

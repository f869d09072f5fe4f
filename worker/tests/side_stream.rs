//! The NCCL side stream on 2 real GPUs: two ranks as threads of this process,
//! each with an `NcclComm` on its own GPU. An all_reduce between `side_begin`
//! and `side_end`, then `side_wait`, must give the exact sum when compute
//! reads it; the side stream must have been busy; old tickets are refused.
//!
//! Needs 2 CUDA GPUs, libtorch_cuda and PyTorch's NCCL reachable through
//! `LD_LIBRARY_PATH` (with a folder holding a `libnccl.so` link to PyTorch's
//! `libnccl.so.2` first, as the agent sets it up for workers). Without them
//! the test fails saying what is missing; set `GPUCTL_SKIP_GPU_TESTS=1` on a
//! machine known to have no GPU (CI), or `GPUCTL_SKIP_2GPU_TESTS=1` on one
//! with one GPU, to opt out.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use gpuctl_worker::comm::nccl::{nccl_present, NcclComm};
use gpuctl_worker::comm::Collectives;
use gpuctl_worker::device::load_torch_cuda;
use gpuctl_worker::rendezvous::{MemoryRendezvous, Rendezvous};
use tch::{Device, Kind, Tensor};

const SKIP: &str = "GPUCTL_SKIP_GPU_TESTS";
const SETUP: &str = "this test needs 2 CUDA GPUs and LD_LIBRARY_PATH = <shim folder with \
     libnccl.so -> site-packages/nvidia/nccl/lib/libnccl.so.2>:site-packages/torch/lib:\
     site-packages/nvidia/nccl/lib:site-packages/nvidia/cu13/lib; on a machine without GPUs \
     set GPUCTL_SKIP_GPU_TESTS=1 to opt out";

/// Whether to run: panics saying what is missing, unless opted out.
fn gpus_or_opt_out() -> bool {
    for skip in [SKIP, "GPUCTL_SKIP_2GPU_TESTS"] {
        if std::env::var_os(skip).is_some_and(|v| !v.is_empty() && v != "0") {
            eprintln!("{skip} is set: the side-stream GPU test does not run");
            return false;
        }
    }
    if let Err(e) = load_torch_cuda() {
        panic!("libtorch_cuda.so could not be loaded ({e:#}); {SETUP}");
    }
    if !tch::Cuda::is_available() {
        panic!("libtorch_cuda.so loaded but libtorch sees no CUDA device; {SETUP}");
    }
    let n = tch::Cuda::device_count();
    if n < 2 {
        panic!("libtorch sees {n} CUDA device(s), not 2; {SETUP}");
    }
    if !nccl_present() {
        panic!("libnccl.so could not be loaded; {SETUP}");
    }
    true
}

/// Elements of the reduced buffer (128 MiB of fp32: the all_reduce takes
/// long enough that a missing wait would be seen).
const N: i64 = 32 << 20;

/// One rank's part; returns the side times it read.
fn rank(r: usize, rdzv: Arc<MemoryRendezvous>) -> anyhow::Result<(f64, f64)> {
    let mut comm = NcclComm::new(r, 2, r, &*rdzv as &dyn Rendezvous, Duration::from_secs(60))
        .map_err(|e| {
            e.context(
                "ncclCommInitRank (two NCCLs in one process fail here: put the libnccl.so shim first on LD_LIBRARY_PATH)",
            )
        })?;
    assert!(comm.overlaps());
    let dev = Device::Cuda(r);
    let a = Tensor::f_randn([4096, 4096], (Kind::Float, dev))?;
    let mut x = Tensor::f_zeros([N], (Kind::Float, dev))?;
    comm.synchronize()?;
    let mut last = None;
    for round in 0..4 {
        // Compute ahead of the fill: without the side stream waiting for
        // compute, the all_reduce would read x before the fill wrote it.
        for _ in 0..8 {
            let _ = a.f_matmul(&a)?;
        }
        let mine = (r + 1 + round) as f64;
        let _ = x.f_fill_(mine)?;
        comm.side_begin()?;
        comm.all_reduce(&x, &x)?;
        let ticket = comm.side_end()?;
        comm.side_wait(ticket)?;
        // Read on the compute stream right after the wait: without it the
        // reduction would still be running.
        let want = (1 + round + 2 + round) as f64;
        let (lo, hi) = (x.f_min()?.double_value(&[]), x.f_max()?.double_value(&[]));
        if lo != want || hi != want {
            anyhow::bail!("rank {r} round {round}: sum is {lo}..{hi}, want {want} everywhere");
        }
        last = Some(ticket);
    }
    comm.synchronize()?;
    let t = comm
        .side_times()?
        .ok_or_else(|| anyhow::anyhow!("NCCL gave no side times"))?;
    // After side_times every earlier ticket is stale, and says so.
    let e = comm
        .side_wait(last.expect("4 rounds"))
        .expect_err("a stale ticket must be refused");
    assert!(format!("{e:#}").contains("stale ticket"), "{e:#}");
    // The next read starts from zero.
    let again = comm.side_times()?.expect("NCCL times");
    assert_eq!((again.busy_s, again.stalled_s), (0.0, 0.0));
    Ok((t.busy_s, t.stalled_s))
}

#[test]
fn all_reduce_on_the_side_stream_sums_right_and_is_timed() {
    if !gpus_or_opt_out() {
        return;
    }
    let rdzv = Arc::new(MemoryRendezvous::new());
    let hs: Vec<_> = (0..2)
        .map(|r| {
            let rdzv = rdzv.clone();
            thread::spawn(move || rank(r, rdzv))
        })
        .collect();
    for (r, h) in hs.into_iter().enumerate() {
        let (busy, stalled) = h
            .join()
            .expect("a rank panicked")
            .unwrap_or_else(|e| panic!("rank {r}: {e:#}"));
        // 4 all_reduces of 128 MiB: well over a microsecond, under a minute.
        assert!(busy > 1e-6 && busy < 60.0, "rank {r}: busy {busy} s");
        assert!(
            (0.0..60.0).contains(&stalled),
            "rank {r}: stalled {stalled} s"
        );
        eprintln!("rank {r}: side stream busy {busy:.6} s, compute stalled {stalled:.6} s");
    }
}

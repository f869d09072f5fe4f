//! CUDA kernels of our own, compiled at run time by NVRTC.
//!
//! The worker builds with no CUDA toolkit (DESIGN.md: it links only
//! libtorch_cpu and loads libtorch_cuda at start), so a kernel PyTorch does
//! not have cannot come from nvcc at build time. NVRTC does: PyTorch's wheel
//! ships `libnvrtc.so.13` in `nvidia/cu13/lib`, already on the workers'
//! `LD_LIBRARY_PATH`, and cudarc loads it on first use. A kernel is compiled
//! once per process for the GPU's own architecture and launched on the
//! legacy default stream, the one libtorch computes on, so it is ordered
//! with libtorch's kernels as theirs are with each other.
//!
//! Where NVRTC is missing or the compile fails, [`sgd::SgdKernel::get`]
//! answers `None` (logged once) and the trainers keep PyTorch's kernels.

pub mod sgd;

use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use cudarc::driver::{CudaContext, CudaModule};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

/// `src` compiled for the GPU of `ctx` and loaded into its context.
fn compile(ctx: &Arc<CudaContext>, name: &str, src: &str) -> Result<Arc<CudaModule>> {
    let (major, minor) = ctx
        .compute_capability()
        .map_err(|e| anyhow!("reading the GPU's compute capability: {e}"))?;
    let opts = CompileOptions {
        options: vec![format!("--gpu-architecture=compute_{major}{minor}")],
        name: Some(format!("{name}.cu")),
        ..Default::default()
    };
    // cudarc panics when libnvrtc cannot be loaded at all.
    let ptx = std::panic::catch_unwind(|| compile_ptx_with_opts(src, opts))
        .map_err(|_| {
            anyhow!("libnvrtc.so could not be loaded: LD_LIBRARY_PATH lacks site-packages/nvidia/cu13/lib")
        })?
        .map_err(|e| anyhow!("NVRTC: {e:?}"))?;
    ctx.load_module(ptx)
        .with_context(|| format!("loading the {name} kernel into the CUDA context"))
}

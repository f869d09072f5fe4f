//! SGD's whole update for bf16 training in one pass over memory.
//!
//! With PyTorch's kernels the update of a bf16 model with fp32 master
//! weights is three: the bf16 gradient cast to fp32, the fused SGD step
//! (which also writes the unscaled gradient back), and the fp32 master cast
//! to the bf16 compute copy: about 38 bytes of memory traffic a parameter,
//! 13.9 ms of an 89 ms GPT-1.3B step on an H200 (docs/benchmarks.md). This
//! kernel reads the bf16 gradient, the master weight and the momentum, and
//! writes the master, the momentum and the bf16 copy: 20 bytes. Its
//! arithmetic is PyTorch's fused SGD's (`g /= divisor; buf = m·buf + g;
//! p -= lr·buf`) and its bf16 rounding is `__float2bfloat16`'s (to nearest,
//! ties to even), so ddp and fsdp, which both take it, stay bit-identical.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{anyhow, bail, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, LaunchConfig, PushKernelArg};
use tch::{Device, Kind, Tensor};

const SRC: &str = r#"
typedef unsigned short bf16_t;
__device__ __forceinline__ float from_bf16(unsigned int h) { return __uint_as_float(h << 16); }
__device__ __forceinline__ unsigned int to_bf16(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
__device__ __forceinline__ float step(float &p, float *b, float g, float lr, float mom, float div) {
  g = g / div;
  if (b) { *b = mom * *b + g; g = *b; }
  p = p - lr * g;
  return p;
}
extern "C" __global__ void sgd_bf16(float *__restrict__ p, float *__restrict__ buf,
    const bf16_t *__restrict__ g, bf16_t *__restrict__ out, unsigned long long n,
    float lr, float mom, float div, int vec) {
  unsigned long long tid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long start = 0;
  if (vec) {
    unsigned long long quads = n / 4;
    for (unsigned long long q = tid; q < quads; q += stride) {
      float4 pv = reinterpret_cast<float4 *>(p)[q];
      uint2 gv = reinterpret_cast<const uint2 *>(g)[q];
      float4 bv;
      float *bx = 0, *by = 0, *bz = 0, *bw = 0;
      if (buf) {
        bv = reinterpret_cast<float4 *>(buf)[q];
        bx = &bv.x; by = &bv.y; bz = &bv.z; bw = &bv.w;
      }
      step(pv.x, bx, from_bf16(gv.x & 0xffffu), lr, mom, div);
      step(pv.y, by, from_bf16(gv.x >> 16), lr, mom, div);
      step(pv.z, bz, from_bf16(gv.y & 0xffffu), lr, mom, div);
      step(pv.w, bw, from_bf16(gv.y >> 16), lr, mom, div);
      reinterpret_cast<float4 *>(p)[q] = pv;
      if (buf) reinterpret_cast<float4 *>(buf)[q] = bv;
      if (out) {
        uint2 o;
        o.x = to_bf16(pv.x) | (to_bf16(pv.y) << 16);
        o.y = to_bf16(pv.z) | (to_bf16(pv.w) << 16);
        reinterpret_cast<uint2 *>(out)[q] = o;
      }
    }
    start = quads * 4;
  }
  for (unsigned long long i = start + tid; i < n; i += stride) {
    float pi = p[i];
    float v = step(pi, buf ? buf + i : 0, from_bf16(g[i]), lr, mom, div);
    p[i] = pi;
    if (out) out[i] = (bf16_t)to_bf16(v);
  }
}
"#;

const THREADS: u32 = 256;

/// The update's scalars: `divisor` is ranks × loss scale, what the summed
/// gradient is divided by.
#[derive(Clone, Copy, Debug)]
pub struct Rates {
    pub lr: f64,
    pub momentum: f64,
    pub divisor: f64,
}

/// The compiled update of one GPU.
pub struct SgdKernel {
    ctx: Arc<CudaContext>,
    _module: Arc<CudaModule>,
    func: CudaFunction,
    /// Enough blocks to keep every SM busy; more only add scheduling.
    max_blocks: u32,
}

// SAFETY: the function and module handles are read-only after loading and
// CUDA's driver API may be called on them from any thread.
unsafe impl Send for SgdKernel {}
unsafe impl Sync for SgdKernel {}

type Loaded = Mutex<HashMap<usize, Option<&'static SgdKernel>>>;

impl SgdKernel {
    /// The kernel of `device`, compiled on first use; `None` on a CPU or
    /// where it cannot be compiled (said once in the log).
    pub fn get(device: Device) -> Option<&'static SgdKernel> {
        let Device::Cuda(ordinal) = device else {
            return None;
        };
        static LOADED: OnceLock<Loaded> = OnceLock::new();
        let mut loaded = LOADED.get_or_init(Default::default).lock().ok()?;
        *loaded.entry(ordinal).or_insert_with(|| match Self::load(ordinal) {
            Ok(k) => Some(Box::leak(Box::new(k))),
            Err(e) => {
                tracing::warn!("the one-pass SGD kernel is not available ({e:#}); PyTorch's kernels update instead");
                None
            }
        })
    }

    fn load(ordinal: usize) -> Result<SgdKernel> {
        let ctx = CudaContext::new(ordinal).map_err(|e| anyhow!("CUDA context: {e}"))?;
        let module = super::compile(&ctx, "sgd_bf16", SRC)?;
        let func = module
            .load_function("sgd_bf16")
            .map_err(|e| anyhow!("sgd_bf16 not in its module: {e}"))?;
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(|e| anyhow!("reading the SM count: {e}"))?;
        Ok(SgdKernel {
            ctx,
            _module: module,
            func,
            max_blocks: (sms.max(1) as u32) * 8,
        })
    }

    /// `buf = m·buf + grad/divisor; master -= lr·buf; compute = bf16(master)`
    /// element by element: `master` and `momentum` fp32, `grad` and
    /// `compute` bf16, all contiguous and of one length on this GPU. With
    /// `rates.momentum` 0 the momentum is neither read nor written;
    /// `compute: None` writes no copy (fsdp casts its shard when it gathers).
    pub fn step(
        &self,
        master: &Tensor,
        momentum: &Tensor,
        grad: &Tensor,
        compute: Option<&Tensor>,
        rates: Rates,
    ) -> Result<()> {
        let n = master.numel();
        let check = |t: &Tensor, what: &str, kind: Kind| -> Result<u64> {
            if t.kind() != kind
                || t.numel() != n
                || !t.is_contiguous()
                || t.device() != master.device()
            {
                bail!(
                    "one-pass SGD: {what} is {:?} of {} on {:?} (contiguous {}), wanted {kind:?} of {n} on {:?}",
                    t.kind(),
                    t.numel(),
                    t.device(),
                    t.is_contiguous(),
                    master.device()
                );
            }
            Ok(t.data_ptr() as u64)
        };
        let p = check(master, "the master", Kind::Float)?;
        let b = if rates.momentum != 0.0 {
            check(momentum, "the momentum", Kind::Float)?
        } else {
            0
        };
        let g = check(grad, "the gradient", Kind::BFloat16)?;
        let o = compute
            .map(|c| check(c, "the compute copy", Kind::BFloat16))
            .transpose()?
            .unwrap_or(0);
        if n == 0 {
            return Ok(());
        }
        let vec = i32::from(p % 16 == 0 && b % 16 == 0 && g % 8 == 0 && o % 8 == 0);
        let per_thread = if vec == 1 { 4 } else { 1 };
        let want = (n as u64).div_ceil(per_thread * THREADS as u64);
        let blocks = want.clamp(1, self.max_blocks as u64) as u32;
        let (n, lr, mom, div) = (
            n as u64,
            rates.lr as f32,
            rates.momentum as f32,
            rates.divisor as f32,
        );
        // The legacy default stream: libtorch's compute stream (comm/side.rs).
        let stream = self.ctx.default_stream();
        let mut launch = stream.launch_builder(&self.func);
        launch
            .arg(&p)
            .arg(&b)
            .arg(&g)
            .arg(&o)
            .arg(&n)
            .arg(&lr)
            .arg(&mom)
            .arg(&div)
            .arg(&vec);
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match the kernel's parameters one for one,
        // every pointer is a live contiguous tensor of n elements of the
        // kind the kernel reads it as, checked above.
        unsafe { launch.launch(cfg) }.map_err(|e| anyhow!("launching the one-pass SGD: {e}"))?;
        Ok(())
    }
}

//! The one-pass SGD kernel (worker/src/kernels/sgd.rs) on a real GPU against
//! PyTorch's own kernels doing the same update (the bf16 gradient cast to
//! fp32, `_fused_sgd_`, the master cast back to bf16): the master and the
//! momentum agree to rounding, the bf16 copy is exactly PyTorch's cast of
//! the kernel's master, on the vectorised path, the unaligned one (a view
//! one element in) and without momentum. The gradient is made by a matmul
//! queued just before, so a kernel on the wrong stream would read it early.
//!
//! Needs a CUDA GPU, libtorch_cuda and libnvrtc through `LD_LIBRARY_PATH`
//! (site-packages/torch/lib and nvidia/cu13/lib). Without them it fails
//! saying what is missing; set `GPUCTL_SKIP_GPU_TESTS=1` on a machine known
//! to have no GPU (CI) to opt out.

use gpuctl_worker::device::load_torch_cuda;
use gpuctl_worker::kernels::sgd::{Rates, SgdKernel};
use gpuctl_worker::shim::fused_sgd;
use tch::{Device, Kind, Tensor};

const SKIP: &str = "GPUCTL_SKIP_GPU_TESTS";

fn gpu_or_opt_out() -> bool {
    if std::env::var_os(SKIP).is_some_and(|v| !v.is_empty() && v != "0") {
        eprintln!("{SKIP} is set: the one-pass SGD GPU test does not run");
        return false;
    }
    let setup = "this test needs a CUDA GPU and LD_LIBRARY_PATH = site-packages/torch/lib:\
                 site-packages/nvidia/cu13/lib; on a machine without GPUs set GPUCTL_SKIP_GPU_TESTS=1";
    if let Err(e) = load_torch_cuda() {
        panic!("libtorch_cuda.so could not be loaded ({e:#}); {setup}");
    }
    assert!(
        tch::Cuda::is_available(),
        "libtorch sees no CUDA device; {setup}"
    );
    true
}

/// Largest |a - b| over the largest |b|.
fn rel_diff(a: &Tensor, b: &Tensor) -> f64 {
    let d = (a - b).abs().max().double_value(&[]);
    d / b.abs().max().double_value(&[]).max(f64::MIN_POSITIVE)
}

fn check(n: i64, offset: i64, with_momentum: bool) {
    let dev = Device::Cuda(0);
    let k = SgdKernel::get(dev).expect("the kernel compiles (NVRTC on LD_LIBRARY_PATH)");
    let (lr, mom, div) = (0.05, if with_momentum { 0.9 } else { 0.0 }, 2.0 * 1024.0);
    let _g = tch::no_grad_guard();
    let view = |t: Tensor| t.narrow(0, offset, n);
    let master = view(Tensor::randn([n + offset], (Kind::Float, dev)));
    let momentum = view(Tensor::randn([n + offset], (Kind::Float, dev)) * 0.01);
    // The gradient comes out of a matmul queued just before the update.
    let side = ((n + offset) as f64).sqrt().ceil() as i64;
    let a = Tensor::randn([side, side], (Kind::Float, dev));
    let grad = view(
        a.matmul(&a)
            .to_kind(Kind::BFloat16)
            .flatten(0, -1)
            .narrow(0, 0, n + offset),
    );
    let compute = view(Tensor::zeros([n + offset], (Kind::BFloat16, dev)));

    let (ref_master, ref_mom) = (master.copy(), momentum.copy());
    let g32 = grad.to_kind(Kind::Float);
    fused_sgd(&ref_master, &ref_mom, &g32, lr, mom, div).unwrap();

    let rates = Rates {
        lr,
        momentum: mom,
        divisor: div,
    };
    k.step(&master, &momentum, &grad, Some(&compute), rates)
        .unwrap();
    let what = format!("n {n}, offset {offset}, momentum {with_momentum}");
    let dm = rel_diff(&master, &ref_master);
    assert!(dm < 1e-6, "{what}: master differs from PyTorch's by {dm:e}");
    if with_momentum {
        let db = rel_diff(&momentum, &ref_mom);
        assert!(
            db < 1e-6,
            "{what}: momentum differs from PyTorch's by {db:e}"
        );
    }
    let cast = master.to_kind(Kind::BFloat16);
    let same = compute.eq_tensor(&cast).all().int64_value(&[]);
    assert_eq!(
        same, 1,
        "{what}: the bf16 copy is not PyTorch's cast of the master"
    );
    eprintln!("{what}: master within {dm:e} of PyTorch's; bf16 copy exact");
}

#[test]
fn one_pass_sgd_matches_pytorch_on_a_gpu() {
    if !gpu_or_opt_out() {
        return;
    }
    check(10_000_003, 0, true);
    check(10_000_003, 1, true);
    check(4_099, 0, false);
}

//! The C++ shim (`csrc/`, built by build.rs against libtorch's headers): what
//! libtorch has only as C++ — backward with a given gradient, the CUDA
//! caching allocator's figures, a cap on the host memory CPU tensors hold,
//! an empty tensor in pinned host memory, the fused SGD step.
//! Every function catches C++ exceptions and
//! hands back their message, so none crosses into Rust.

use std::ffi::{c_char, c_int, c_void, CStr};

use anyhow::{bail, Result};
use tch::Tensor;

extern "C" {
    fn gpuctl_backward_with(output: *mut c_void, grad: *mut c_void, err: *mut *mut c_char)
        -> c_int;
    fn gpuctl_alloc_stats(device: c_int, out: *mut i64, err: *mut *mut c_char) -> c_int;
    fn gpuctl_alloc_reset_peak(device: c_int, err: *mut *mut c_char) -> c_int;
    fn gpuctl_alloc_empty_cache(err: *mut *mut c_char) -> c_int;
    fn gpuctl_cpu_cap_install(err: *mut *mut c_char) -> c_int;
    fn gpuctl_cpu_cap_set(bytes: i64);
    fn gpuctl_cpu_cap_stats(out: *mut i64);
    fn gpuctl_cpu_cap_reset_peak();
    fn gpuctl_empty_pinned(
        sizes: *const i64,
        ndim: c_int,
        kind: c_int,
        out: *mut *mut c_void,
        err: *mut *mut c_char,
    ) -> c_int;
    fn gpuctl_fused_sgd(
        master: *mut c_void,
        momentum: *mut c_void,
        grad: *mut c_void,
        lr: f64,
        mom: f64,
        divisor: f64,
        err: *mut *mut c_char,
    ) -> c_int;
}

/// Turns a shim return code and its malloc'd message into a `Result`.
pub(crate) fn check(what: &str, rc: c_int, err: *mut c_char) -> Result<()> {
    if rc == 0 {
        return Ok(());
    }
    let msg = if err.is_null() {
        "unknown error".to_string()
    } else {
        // SAFETY: a NUL-terminated string from strdup, freed once here.
        unsafe {
            let m = CStr::from_ptr(err).to_string_lossy().into_owned();
            libc::free(err as *mut c_void);
            m
        }
    };
    bail!("{what}: {msg}")
}

/// `torch.autograd.backward(output, grad)`, which tch does not expose.
pub fn backward_with(output: &Tensor, grad: &Tensor) -> Result<()> {
    let mut err = std::ptr::null_mut();
    // SAFETY: both pointers are live tch tensors (`torch::Tensor*`) for the call.
    let rc = unsafe {
        gpuctl_backward_with(
            output.as_ptr() as *mut c_void,
            grad.as_ptr() as *mut c_void,
            &mut err,
        )
    };
    check("backward", rc, err)
}

/// The CUDA caching allocator's bytes for one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocStats {
    pub allocated: u64,
    pub allocated_peak: u64,
    pub reserved: u64,
    pub reserved_peak: u64,
}

/// `torch.cuda.memory_stats(device)`'s aggregate byte figures.
pub fn alloc_stats(device: usize) -> Result<AllocStats> {
    let mut out = [0i64; 4];
    let mut err = std::ptr::null_mut();
    // SAFETY: `out` has the 4 slots the shim writes.
    let rc = unsafe { gpuctl_alloc_stats(device as c_int, out.as_mut_ptr(), &mut err) };
    check("CUDA allocator statistics", rc, err)?;
    let b = |v: i64| v.max(0) as u64;
    Ok(AllocStats {
        allocated: b(out[0]),
        allocated_peak: b(out[1]),
        reserved: b(out[2]),
        reserved_peak: b(out[3]),
    })
}

/// `torch.cuda.reset_peak_memory_stats(device)`.
pub fn alloc_reset_peak(device: usize) -> Result<()> {
    let mut err = std::ptr::null_mut();
    // SAFETY: plain call; the shim catches everything.
    let rc = unsafe { gpuctl_alloc_reset_peak(device as c_int, &mut err) };
    check("resetting the CUDA allocator's peak", rc, err)
}

/// `torch.cuda.empty_cache()`.
pub fn alloc_empty_cache() -> Result<()> {
    let mut err = std::ptr::null_mut();
    // SAFETY: plain call; the shim catches everything.
    let rc = unsafe { gpuctl_alloc_empty_cache(&mut err) };
    check("emptying the CUDA allocator's cache", rc, err)
}

/// Wraps libtorch's CPU allocator (once) so that CPU tensors allocated from
/// now on count against [`cpu_cap_set`]'s cap: an allocation past it fails
/// with an out-of-memory error instead of growing the process.
pub fn cpu_cap_install() -> Result<()> {
    let mut err = std::ptr::null_mut();
    // SAFETY: plain call; the shim catches everything.
    let rc = unsafe { gpuctl_cpu_cap_install(&mut err) };
    check("capping the CPU allocator", rc, err)
}

/// The bytes CPU tensors may hold at once (counted since the install);
/// 0 lifts the cap.
pub fn cpu_cap_set(bytes: u64) {
    // SAFETY: an atomic store in the shim.
    unsafe { gpuctl_cpu_cap_set(bytes.min(i64::MAX as u64) as i64) }
}

/// (bytes CPU tensors hold now, their highest since [`cpu_cap_reset_peak`]),
/// counted since [`cpu_cap_install`].
pub fn cpu_cap_stats() -> (u64, u64) {
    let mut out = [0i64; 2];
    // SAFETY: `out` has the 2 slots the shim writes.
    unsafe { gpuctl_cpu_cap_stats(out.as_mut_ptr()) };
    (out[0].max(0) as u64, out[1].max(0) as u64)
}

/// Starts a new peak from what CPU tensors hold now.
pub fn cpu_cap_reset_peak() {
    // SAFETY: atomic loads and a store in the shim.
    unsafe { gpuctl_cpu_cap_reset_peak() }
}

/// An empty float32 tensor of `sizes` in pinned host memory, from the CUDA
/// caching host allocator (a GPU host only): written in place, then copied
/// to the device without blocking the host.
pub fn empty_pinned(sizes: &[i64]) -> Result<Tensor> {
    let mut out = std::ptr::null_mut();
    let mut err = std::ptr::null_mut();
    // SAFETY: `sizes` is live for the call; on success `out` is a new
    // `at::Tensor*` whose ownership passes to the returned tch tensor.
    let rc =
        unsafe { gpuctl_empty_pinned(sizes.as_ptr(), sizes.len() as c_int, 0, &mut out, &mut err) };
    check("allocating pinned host memory", rc, err)?;
    // SAFETY: see above; tch frees it when the tensor drops.
    Ok(unsafe { Tensor::from_ptr(out as *mut _) })
}

/// `momentum = m·momentum + grad/divisor; master -= lr·momentum` in one
/// pass of PyTorch's fused SGD kernel (`csrc/fused_sgd.cpp`): master,
/// momentum and grad of one float kind and shape.
pub fn fused_sgd(
    master: &Tensor,
    momentum: &Tensor,
    grad: &Tensor,
    lr: f64,
    mom: f64,
    divisor: f64,
) -> Result<()> {
    let mut err = std::ptr::null_mut();
    // SAFETY: the three pointers are live tch tensors (`torch::Tensor*`) for
    // the call; the kernel writes through master's and momentum's storage.
    let rc = unsafe {
        gpuctl_fused_sgd(
            master.as_ptr() as *mut c_void,
            momentum.as_ptr() as *mut c_void,
            grad.as_ptr() as *mut c_void,
            lr,
            mom,
            divisor,
            &mut err,
        )
    };
    check("the fused SGD step", rc, err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    #[test]
    fn backward_with_reports_a_shape_mismatch() {
        let x = Tensor::ones([3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let y = &x * 2.0;
        let err = backward_with(&y, &Tensor::ones([4], (Kind::Float, Device::Cpu)))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("backward:"), "{err}");
        let y = &x * 2.0;
        backward_with(&y, &Tensor::ones([3], (Kind::Float, Device::Cpu))).unwrap();
        assert!(x
            .grad()
            .equal(&Tensor::full([3], 2.0, (Kind::Float, Device::Cpu))));
    }

    #[test]
    fn allocator_calls_answer_or_fail_with_a_message() {
        if tch::Cuda::is_available() {
            let _t = Tensor::zeros([1 << 20], (Kind::Float, Device::Cuda(0)));
            let s = alloc_stats(0).unwrap();
            assert!(s.allocated >= 4 << 20 && s.reserved >= s.allocated, "{s:?}");
            alloc_reset_peak(0).unwrap();
            return;
        }
        // No CUDA allocator in a CPU-only process: an error, not an abort.
        let e = alloc_stats(0).unwrap_err().to_string();
        assert!(e.starts_with("CUDA allocator statistics:"), "{e}");
        assert!(alloc_empty_cache().is_err());
    }
}

//! GPU memory of this process as libtorch's CUDA caching allocator sees it:
//! peak bytes allocated (what `torch.cuda.max_memory_allocated` reports),
//! resetting that peak, and emptying the cache (`torch.cuda.empty_cache`),
//! through the C++ shim ([`crate::shim`]): libtorch has these only as inline
//! C++ over `c10::DeviceAllocator`.
//!
//! Beside the allocator's figures, the driver's view (`cuMemGetInfo`) is
//! sampled now and then: [`Memory::driver_peak`]. Where the allocator cannot
//! be read (or with `GPUCTL_NO_ALLOC_STATS=1`) the figures fall back to the
//! driver's used memory (all processes on the GPU), sampled, and the worker
//! says so once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::device::DeviceInfo;
use crate::shim;
pub use crate::shim::AllocStats;

/// Memory of one rank's device. On a CPU every call is a no-op and the peak
/// is the process's peak resident memory.
pub struct Memory<'a> {
    dev: Option<&'a DeviceInfo>,
    /// Whether to ask the allocator (a CUDA device, not turned off).
    alloc: bool,
    /// Set once the allocator failed to answer and the worker said so.
    warned: AtomicBool,
    /// Driver figure fallback: highest used memory seen.
    sampled_peak: AtomicU64,
}

impl<'a> Memory<'a> {
    pub fn new(dev: &'a DeviceInfo) -> Self {
        let off = std::env::var("GPUCTL_NO_ALLOC_STATS").is_ok_and(|v| v == "1");
        if off && dev.is_cuda() {
            tracing::warn!(
                "GPUCTL_NO_ALLOC_STATS=1: peak memory is the driver's used memory of the whole GPU"
            );
        }
        Memory {
            dev: dev.is_cuda().then_some(dev),
            alloc: dev.is_cuda() && !off,
            warned: AtomicBool::new(off),
            sampled_peak: AtomicU64::new(0),
        }
    }

    /// For CPU ranks without a DeviceInfo at hand (tests).
    pub fn cpu() -> Memory<'static> {
        Memory {
            dev: None,
            alloc: false,
            warned: AtomicBool::new(false),
            sampled_peak: AtomicU64::new(0),
        }
    }

    fn ordinal(&self) -> usize {
        self.dev.map(|d| d.ordinal).unwrap_or(0)
    }

    /// Says once that the allocator did not answer (and why).
    fn fell_back(&self, e: anyhow::Error) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "libtorch allocator statistics are off ({e:#}); peak memory is the \
                 driver's used memory of the whole GPU"
            );
        }
    }

    /// The caching allocator's statistics (GPU with allocator access only).
    pub fn stats(&self) -> Option<AllocStats> {
        if !self.alloc {
            return None;
        }
        match shim::alloc_stats(self.ordinal()) {
            Ok(s) => Some(s),
            Err(e) => {
                self.fell_back(e);
                None
            }
        }
    }

    /// Notes the driver's used memory now (fallback peak); call now and then.
    pub fn sample(&self) {
        if let Some(d) = self.dev {
            if let Some((used, _)) = d.gpu_memory() {
                self.sampled_peak.fetch_max(used, Ordering::Relaxed);
            }
        }
    }

    /// Peak bytes: allocator peak allocated on a GPU (driver used memory when
    /// the allocator cannot be read), peak resident memory on a CPU.
    pub fn peak(&self) -> u64 {
        match self.stats() {
            Some(s) => s.allocated_peak,
            None => self.driver_peak(),
        }
    }

    /// The device's used memory at its highest as the driver sees it (the
    /// allocator's cache, the CUDA context and NCCL buffers included), from
    /// the samples taken since the last reset; peak resident memory on a CPU.
    pub fn driver_peak(&self) -> u64 {
        if self.dev.is_some() {
            self.sample();
            return self.sampled_peak.load(Ordering::Relaxed);
        }
        crate::device::peak_rss_bytes()
    }

    /// [`Memory::reset_peak`], and on a CPU the process's resident peak
    /// (VmHWM, through `/proc/self/clear_refs`) too: between the models of
    /// one job, whose peaks are each their own. The caller keeps the
    /// process's peak (the highest of the parts).
    pub fn reset_all_peaks(&self) {
        if self.dev.is_none() {
            // "5" resets the peak resident set size (Linux 4.0+); where it
            // cannot, the figure stays the process's peak, which is still true.
            let _ = std::fs::write("/proc/self/clear_refs", "5");
        }
        self.reset_peak();
    }

    /// Starts a new peak (allocator peak, and the sampled fallback).
    pub fn reset_peak(&self) {
        if self.alloc {
            if let Err(e) = shim::alloc_reset_peak(self.ordinal()) {
                self.fell_back(e);
            }
        }
        self.sampled_peak.store(0, Ordering::Relaxed);
    }

    /// Gives cached, unused blocks back to the driver.
    pub fn empty_cache(&self) {
        if self.alloc {
            if let Some(d) = self.dev {
                d.synchronize();
            }
            if let Err(e) = shim::alloc_empty_cache() {
                self.fell_back(e);
            }
        }
    }
}

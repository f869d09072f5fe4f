//! GPU memory of this process as libtorch's CUDA caching allocator sees it:
//! peak bytes allocated (what `torch.cuda.max_memory_allocated` reports),
//! resetting that peak, and emptying the cache (`torch.cuda.empty_cache`).
//!
//! libtorch has these only as inline C++ (`at::accelerator::getDeviceStats`,
//! `emptyCache`, `resetPeakStats` call virtual methods of `c10::DeviceAllocator`),
//! so they are reached here through the allocator object's vtable: the object
//! comes from the exported `c10::GetAllocator(DeviceType::CUDA)`, and the slots
//! follow from the class declarations of libtorch 2.11 (`c10/core/Allocator.h`,
//! `c10/core/CachingDeviceAllocator.h`, Itanium C++ ABI):
//!
//! | slot | `c10::Allocator` / `c10::DeviceAllocator` |
//! |---|---|
//! | 0, 1 | destructors |
//! | 2 | `allocate` |
//! | 3 | `is_simple_data_ptr` |
//! | 4 | `raw_deleter` |
//! | 5 | `copy_data` |
//! | 6 | `initialized` |
//! | 7 | `emptyCache(MempoolId_t)` |
//! | 8 | `recordStream` |
//! | 9 | `getDeviceStats(DeviceIndex)` → `DeviceStats` (returned through a hidden pointer) |
//! | 10 | `resetAccumulatedStats` |
//! | 11 | `resetPeakStats(DeviceIndex)` |
//!
//! Beside the allocator's figures, the driver's view (`cuMemGetInfo`) is
//! sampled now and then: [`Memory::driver_peak`].
//!
//! Before any figure is used, the object's vtable is checked to live in
//! `libc10_cuda.so` (through `dladdr`; the wheels export no vtable symbol for
//! it), the allocator backend to be the native one, the libtorch version to be
//! 2.11, and a 32 MiB allocation to move the figures by that much; otherwise
//! (or with `GPUCTL_NO_ALLOC_STATS=1`)
//! nothing is called and the figures fall back to the driver's used memory
//! (`cuMemGetInfo`, all processes on the GPU), sampled.

use std::ffi::{c_void, CStr, CString};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::device::DeviceInfo;

/// `DeviceStats` offsets (bytes): `allocated_bytes[AGGREGATE]` is the 5th
/// `StatArray` (3 × `Stat{current, peak, allocated, freed}` of i64 = 96 bytes).
const ALLOCATED_CURRENT: usize = 4 * 96;
const ALLOCATED_PEAK: usize = 4 * 96 + 8;
const RESERVED_CURRENT: usize = 5 * 96;
const RESERVED_PEAK: usize = 5 * 96 + 8;
/// `sizeof(DeviceStats)` is 976 in 2.11; the buffer is larger to be safe.
const STATS_BUF: usize = 4096;

const SLOT_EMPTY_CACHE: usize = 7;
const SLOT_GET_DEVICE_STATS: usize = 9;
const SLOT_RESET_PEAK: usize = 11;

type GetAllocator = unsafe extern "C" fn(*const i8) -> *mut c_void;
type EmptyCache = unsafe extern "C" fn(*mut c_void, u64, u64);
type GetStats = unsafe extern "C" fn(*mut u8, *mut c_void, i8);
type ResetPeak = unsafe extern "C" fn(*mut c_void, i8);

/// Allocator statistics from the caching allocator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocStats {
    pub allocated: u64,
    pub allocated_peak: u64,
    pub reserved: u64,
    pub reserved_peak: u64,
}

/// Memory of one rank's device. On a CPU every call is a no-op and the peak
/// is the process's peak resident memory.
pub struct Memory<'a> {
    dev: Option<&'a DeviceInfo>,
    alloc: Option<*mut c_void>,
    /// Driver figure fallback: highest used memory seen.
    sampled_peak: AtomicU64,
}

fn symbol(name: &str) -> *mut c_void {
    let c = CString::new(name).unwrap();
    // SAFETY: dlsym on the already loaded libraries.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, c.as_ptr()) }
}

/// The CUDA caching allocator object, when it is safe to call into.
fn cuda_allocator() -> Result<*mut c_void, String> {
    if std::env::var("GPUCTL_NO_ALLOC_STATS").is_ok_and(|v| v == "1") {
        return Err("GPUCTL_NO_ALLOC_STATS=1".into());
    }
    let v = crate::device::torch_version();
    if !v.starts_with("2.11") {
        return Err(format!(
            "the vtable layout is known for libtorch 2.11, this is {v}"
        ));
    }
    let f = symbol("_ZN3c1012GetAllocatorERKNS_10DeviceTypeE");
    if f.is_null() {
        return Err("c10::GetAllocator not found".into());
    }
    // SAFETY: `c10::Allocator* c10::GetAllocator(const c10::DeviceType&)`;
    // DeviceType::CUDA is 1 (an int8 enum).
    let get: GetAllocator = unsafe { std::mem::transmute(f) };
    let cuda: i8 = 1;
    let obj = unsafe { get(&cuda) };
    if obj.is_null() {
        return Err("no CUDA allocator registered".into());
    }
    // The caching allocator's vtable is not an exported symbol in the 2.11
    // wheels (checked: `nm -D libc10_cuda.so` lists none), so the object is
    // identified by where its vtable lives and by the backend it reports;
    // `self_test` then checks that the figures move as allocations do.
    if std::env::var("PYTORCH_CUDA_ALLOC_CONF").is_ok_and(|v| v.contains("cudaMallocAsync")) {
        return Err("PYTORCH_CUDA_ALLOC_CONF selects cudaMallocAsync".into());
    }
    // SAFETY: a C++ polymorphic object starts with its vtable pointer.
    let lib = unsafe {
        let vptr = *(obj as *const *const c_void);
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(vptr, &mut info) == 0 || info.dli_fname.is_null() {
            return Err("the allocator's vtable is in no loaded library".into());
        }
        CStr::from_ptr(info.dli_fname)
            .to_string_lossy()
            .into_owned()
    };
    let name = lib.rsplit('/').next().unwrap_or(&lib).to_string();
    if !name.starts_with("libc10_cuda.so") {
        return Err(format!(
            "the allocator's vtable is in {name}, not libc10_cuda.so"
        ));
    }
    tracing::debug!(library = %lib, "CUDA caching allocator found");
    Ok(obj)
}

/// Function pointer in `slot` of the object's vtable.
///
/// # Safety
/// `obj` must be a live polymorphic C++ object with at least `slot + 1` slots.
unsafe fn vslot(obj: *mut c_void, slot: usize) -> *const c_void {
    let vptr = *(obj as *const *const *const c_void);
    *vptr.add(slot)
}

/// Allocates 32 MiB through libtorch and checks that the allocator's
/// figures grow by that much: a wrong vtable slot or layout shows here
/// before any figure is reported.
fn self_test(obj: *mut c_void, dev: &DeviceInfo) -> Result<*mut c_void, String> {
    let probe = Memory {
        dev: Some(dev),
        alloc: Some(obj),
        sampled_peak: AtomicU64::new(0),
    };
    let before = probe.stats().ok_or("no statistics")?;
    const N: i64 = 8 << 20; // 32 MiB of f32
    let t = tch::Tensor::f_zeros([N], (tch::Kind::Float, dev.device)).map_err(|e| e.to_string())?;
    let during = probe.stats().ok_or("no statistics")?;
    drop(t);
    let after = probe.stats().ok_or("no statistics")?;
    let grew = during.allocated.saturating_sub(before.allocated);
    if !(N as u64 * 4..=N as u64 * 4 + (2 << 20)).contains(&grew)
        || after.allocated != before.allocated
        || during.allocated_peak < during.allocated
        || during.reserved < during.allocated
    {
        return Err(format!(
            "its figures did not follow a 32 MiB allocation (allocated {} → {} → {})",
            before.allocated, during.allocated, after.allocated
        ));
    }
    Ok(obj)
}

impl<'a> Memory<'a> {
    pub fn new(dev: &'a DeviceInfo) -> Self {
        let alloc = if dev.is_cuda() {
            match cuda_allocator().and_then(|a| self_test(a, dev)) {
                Ok(a) => Some(a),
                Err(e) => {
                    tracing::warn!(
                        "libtorch allocator statistics are off ({e}); peak memory is the \
                         driver's used memory of the whole GPU"
                    );
                    None
                }
            }
        } else {
            None
        };
        Memory {
            dev: dev.is_cuda().then_some(dev),
            alloc,
            sampled_peak: AtomicU64::new(0),
        }
    }

    /// For CPU ranks without a DeviceInfo at hand (tests).
    pub fn cpu() -> Memory<'static> {
        Memory {
            dev: None,
            alloc: None,
            sampled_peak: AtomicU64::new(0),
        }
    }

    pub fn has_allocator_stats(&self) -> bool {
        self.alloc.is_some()
    }

    fn ordinal(&self) -> i8 {
        self.dev.map(|d| d.ordinal as i8).unwrap_or(0)
    }

    /// The caching allocator's statistics (GPU with allocator access only).
    pub fn stats(&self) -> Option<AllocStats> {
        let obj = self.alloc?;
        let mut buf = vec![0u8; STATS_BUF];
        // SAFETY: slot 9 is getDeviceStats (module docs); the result is written
        // through the hidden return pointer into buf, larger than DeviceStats.
        unsafe {
            let f: GetStats = std::mem::transmute(vslot(obj, SLOT_GET_DEVICE_STATS));
            f(buf.as_mut_ptr(), obj, self.ordinal());
        }
        let rd = |o: usize| i64::from_ne_bytes(buf[o..o + 8].try_into().unwrap()).max(0) as u64;
        Some(AllocStats {
            allocated: rd(ALLOCATED_CURRENT),
            allocated_peak: rd(ALLOCATED_PEAK),
            reserved: rd(RESERVED_CURRENT),
            reserved_peak: rd(RESERVED_PEAK),
        })
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
        if let Some(s) = self.stats() {
            return s.allocated_peak;
        }
        if self.dev.is_some() {
            self.sample();
            return self.sampled_peak.load(Ordering::Relaxed);
        }
        crate::device::peak_rss_bytes()
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
        if let Some(obj) = self.alloc {
            // SAFETY: slot 11 is resetPeakStats(DeviceIndex).
            unsafe {
                let f: ResetPeak = std::mem::transmute(vslot(obj, SLOT_RESET_PEAK));
                f(obj, self.ordinal());
            }
        }
        self.sampled_peak.store(0, Ordering::Relaxed);
    }

    /// Gives cached, unused blocks back to the driver.
    pub fn empty_cache(&self) {
        if let Some(obj) = self.alloc {
            if let Some(d) = self.dev {
                d.synchronize();
            }
            // SAFETY: slot 7 is emptyCache(MempoolId_t = pair<u64,u64>), the
            // pair passed in two registers; {0,0} means the default pool.
            unsafe {
                let f: EmptyCache = std::mem::transmute(vslot(obj, SLOT_EMPTY_CACHE));
                f(obj, 0, 0);
            }
        }
    }
}

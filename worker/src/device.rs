//! The device this rank runs on, and facts about the host and the libraries.

use std::ffi::{CStr, CString};
use std::net::{IpAddr, UdpSocket};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use cudarc::driver::CudaContext;
use tch::Device;

/// `dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_GLOBAL)`: registers libtorch's
/// CUDA hooks in a binary linked only against the CPU libraries (DESIGN.md).
pub fn load_torch_cuda() -> Result<()> {
    let name = CString::new("libtorch_cuda.so").unwrap();
    // SAFETY: plain dlopen of a library by name.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        // SAFETY: dlerror returns a C string or null.
        let e = unsafe { libc::dlerror() };
        let msg = if e.is_null() {
            "unknown error".to_string()
        } else {
            unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
        };
        bail!("dlopen libtorch_cuda.so: {msg}");
    }
    Ok(())
}

/// The device a rank computes on.
pub struct DeviceInfo {
    pub device: Device,
    /// "cpu" or "cuda:N" (N = CUDA ordinal in this process).
    pub label: String,
    /// GPU model, or the CPU model.
    pub name: String,
    pub uuid: String,
    pub ordinal: usize,
    /// The CUDA primary context (GPU only), kept for the life of the process.
    pub cuda: Option<Arc<CudaContext>>,
}

impl DeviceInfo {
    pub fn is_cuda(&self) -> bool {
        self.cuda.is_some()
    }

    /// Memory in use on the GPU (all processes) and its total, in bytes.
    pub fn gpu_memory(&self) -> Option<(u64, u64)> {
        let ctx = self.cuda.as_ref()?;
        ctx.bind_to_thread().ok()?;
        let (free, total) = ctx.mem_get_info().ok()?;
        Some(((total - free) as u64, total as u64))
    }

    pub fn synchronize(&self) {
        if self.is_cuda() {
            tch::Cuda::synchronize(self.ordinal as i64);
        }
    }

    pub fn cpu() -> Self {
        DeviceInfo {
            device: Device::Cpu,
            label: "cpu".into(),
            name: cpu_model(),
            uuid: String::new(),
            ordinal: 0,
            cuda: None,
        }
    }

    /// Opens CUDA ordinal `ordinal`: loads libtorch_cuda, checks that libtorch
    /// sees CUDA, and opens the primary context (name, UUID, memory).
    pub fn cuda(ordinal: usize, expected_uuid: &str) -> Result<Self> {
        let loaded = load_torch_cuda();
        if !tch::Cuda::is_available() {
            let why = match loaded {
                Err(e) => format!("{e:#}"),
                Ok(()) => "libtorch_cuda.so loaded but libtorch sees no CUDA device".into(),
            };
            bail!(
                "--gpu-index given but CUDA is not available ({why}); check the driver, \
                 CUDA_VISIBLE_DEVICES and that LD_LIBRARY_PATH holds site-packages/torch/lib, \
                 nvidia/nccl/lib and nvidia/cu13/lib"
            );
        }
        let count = tch::Cuda::device_count() as usize;
        if ordinal >= count {
            bail!("CUDA ordinal {ordinal} does not exist: this process sees {count} GPU(s)");
        }
        // SAFETY: only probes for libcuda.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            bail!("libcuda.so could not be loaded although libtorch sees CUDA");
        }
        let ctx = CudaContext::new(ordinal).context("opening the CUDA primary context")?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let uuid = ctx
            .uuid()
            .map(|u| format_uuid(&u.bytes))
            .unwrap_or_default();
        if !expected_uuid.is_empty()
            && !uuid.is_empty()
            && !expected_uuid.eq_ignore_ascii_case(&uuid)
        {
            tracing::warn!(
                "cuda:{ordinal} is {uuid}, not the planned {expected_uuid}; check CUDA_VISIBLE_DEVICES"
            );
        }
        Ok(DeviceInfo {
            device: Device::Cuda(ordinal),
            label: format!("cuda:{ordinal}"),
            name,
            uuid,
            ordinal,
            cuda: Some(ctx),
        })
    }
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, the form NVML and nvidia-smi print.
pub fn format_uuid(b: &[std::ffi::c_char; 16]) -> String {
    let h: Vec<String> = b.iter().map(|c| format!("{:02x}", *c as u8)).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

/// The CPU model from /proc/cpuinfo.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| format!("{} CPU", std::env::consts::ARCH))
}

/// Peak resident memory of this process (VmHWM), in bytes.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// The version of the libtorch that was loaded: `torch/version.py` beside the
/// loaded `libtorch_cpu.so` (a wheel's layout), else the version built against.
pub fn torch_version() -> String {
    const BUILT: &str = "2.11.0";
    let sym = CString::new("_ZN2at13globalContextEv").unwrap();
    // SAFETY: dlsym/dladdr on the already loaded libtorch.
    let path = unsafe {
        let p = libc::dlsym(libc::RTLD_DEFAULT, sym.as_ptr());
        let mut info: libc::Dl_info = std::mem::zeroed();
        if p.is_null() || libc::dladdr(p, &mut info) == 0 || info.dli_fname.is_null() {
            None
        } else {
            Some(
                CStr::from_ptr(info.dli_fname)
                    .to_string_lossy()
                    .into_owned(),
            )
        }
    };
    let from_file = path.and_then(|p| {
        let lib = std::fs::canonicalize(p).ok()?;
        let text = std::fs::read_to_string(lib.parent()?.parent()?.join("version.py")).ok()?;
        let line = text.lines().find(|l| l.starts_with("__version__"))?;
        Some(
            line.split_once('=')?
                .1
                .trim()
                .trim_matches(['\'', '"'])
                .to_string(),
        )
    });
    from_file.unwrap_or_else(|| BUILT.to_string())
}

/// Turns TF32 for cuBLAS matmuls on or off (`torch.backends.cuda.matmul.allow_tf32`)
/// through libtorch's `at::Context::setAllowTF32CuBLAS`, which tch does not wrap.
pub fn set_allow_tf32(on: bool) -> Result<()> {
    type GlobalContext = unsafe extern "C" fn() -> *mut libc::c_void;
    type SetAllow = unsafe extern "C" fn(*mut libc::c_void, bool);
    let g = CString::new("_ZN2at13globalContextEv").unwrap();
    let s = CString::new("_ZN2at7Context18setAllowTF32CuBLASEb").unwrap();
    // SAFETY: symbols of the loaded libtorch with these C++ signatures
    // (`at::Context& at::globalContext()`, `void at::Context::setAllowTF32CuBLAS(bool)`).
    unsafe {
        let gp = libc::dlsym(libc::RTLD_DEFAULT, g.as_ptr());
        let sp = libc::dlsym(libc::RTLD_DEFAULT, s.as_ptr());
        if gp.is_null() || sp.is_null() {
            bail!("this libtorch has no at::Context::setAllowTF32CuBLAS");
        }
        let global: GlobalContext = std::mem::transmute(gp);
        let set: SetAllow = std::mem::transmute(sp);
        set(global(), on);
    }
    Ok(())
}

/// The address other ranks reach this node at: 127.0.0.1 when MASTER_ADDR is
/// loopback, else the local address the kernel routes MASTER_ADDR through
/// (falling back to the first non-loopback address).
pub fn advertise_host(master_addr: &str, master_port: u16) -> String {
    let loopback = master_addr.is_empty()
        || master_addr == "localhost"
        || master_addr.parse::<IpAddr>().is_ok_and(|a| a.is_loopback());
    if loopback {
        return "127.0.0.1".into();
    }
    let port = if master_port == 0 { 29500 } else { master_port };
    let routed = UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect((master_addr, port)).map(|_| s))
        .and_then(|s| s.local_addr())
        .map(|a| a.ip())
        .ok()
        .filter(|ip| !ip.is_unspecified() && !ip.is_loopback());
    if let Some(ip) = routed {
        return ip.to_string();
    }
    first_non_loopback().unwrap_or_else(|| "127.0.0.1".into())
}

fn first_non_loopback() -> Option<String> {
    // SAFETY: getifaddrs/freeifaddrs pair; entries read while the list lives.
    unsafe {
        let mut ifs: *mut libc::ifaddrs = std::ptr::null_mut();
        if libc::getifaddrs(&mut ifs) != 0 {
            return None;
        }
        let mut cur = ifs;
        let mut found = None;
        while !cur.is_null() {
            let a = (*cur).ifa_addr;
            if !a.is_null() && (*a).sa_family as i32 == libc::AF_INET {
                let sin = &*(a as *const libc::sockaddr_in);
                let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                if !ip.is_loopback() {
                    found = Some(ip.to_string());
                    break;
                }
            }
            cur = (*cur).ifa_next;
        }
        libc::freeifaddrs(ifs);
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_master_advertises_loopback() {
        assert_eq!(advertise_host("127.0.0.1", 29500), "127.0.0.1");
        assert_eq!(advertise_host("localhost", 0), "127.0.0.1");
    }

    #[test]
    fn uuid_is_printed_like_nvml() {
        let mut b = [0 as std::ffi::c_char; 16];
        for (i, x) in b.iter_mut().enumerate() {
            *x = i as std::ffi::c_char;
        }
        assert_eq!(format_uuid(&b), "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f");
    }
}

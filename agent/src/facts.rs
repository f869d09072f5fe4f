//! Host facts: what the coordinator needs to know about this machine to plan a
//! job on it (addresses for `MASTER_ADDR`, CPU and memory, `/dev/shm` size,
//! InfiniBand devices for the NCCL plan, OS and kernel).
//!
//! Everything is read from files under one root (`/` normally), so that tests
//! can point the reader at a fixture tree and a containerised agent can read
//! the host's `/proc` and `/sys` mounted elsewhere (`--host-root`).

use std::ffi::CString;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use gpuctl_proto::pb::{HostFacts, NetInterface};

/// Where the host's `/proc`, `/sys`, `/etc` and `/dev/shm` are found.
#[derive(Debug, Clone)]
pub struct HostRoot {
    root: PathBuf,
}

impl Default for HostRoot {
    fn default() -> Self {
        HostRoot {
            root: PathBuf::from("/"),
        }
    }
}

impl HostRoot {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        HostRoot { root: root.into() }
    }

    /// `rel` is written without its leading slash: `proc/meminfo`.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// True when this is the machine the agent runs on (not a fixture or a
    /// mounted host root): only then do the process-level calls (affinity,
    /// network interfaces) describe the same host as the files.
    pub fn is_live(&self) -> bool {
        self.root == Path::new("/")
    }

    /// The file's text, or `None` when it cannot be read.
    pub fn read(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.path(rel)).ok()
    }

    pub fn exists(&self, rel: &str) -> bool {
        self.path(rel).exists()
    }

    /// Names of the entries of a folder, sorted; empty when it cannot be read.
    pub fn list(&self, rel: &str) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.path(rel))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }
}

/// Reads every fact that does not come from NVML or the command line; the
/// caller fills `labels`, `cpu_ranks`, `libtorch` and the NVML fields.
pub fn gather(root: &HostRoot) -> HostFacts {
    let cpuinfo = root.read("proc/cpuinfo").unwrap_or_default();
    let (cpu_model, cpuinfo_count) = parse_cpuinfo(&cpuinfo);
    let mut cpu_count = cpuinfo_count;
    if root.is_live() {
        // The CPUs this agent (and so its workers) may run on: affinity and
        // cgroup limits make this smaller than /proc/cpuinfo in containers.
        if let Ok(n) = std::thread::available_parallelism() {
            let n = n.get() as u32;
            cpu_count = if cpu_count == 0 { n } else { cpu_count.min(n) };
        }
    }
    let hostname = root
        .read("proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(libc_hostname);
    let addresses = if root.is_live() {
        local_addresses()
    } else {
        vec![Ipv4Addr::LOCALHOST.to_string()]
    };
    // Only the live host's addresses are known (getifaddrs describes this
    // process's network, not a mounted root's).
    let up = if root.is_live() {
        up_ipv4_addrs()
    } else {
        Vec::new()
    };
    let boot_id = root
        .read("proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    // Root-only on most hosts: unreadable is unknown (empty), not a failure.
    let dmi = |name: &str| {
        root.read(&format!("sys/class/dmi/id/{name}"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    HostFacts {
        hostname,
        boot_id,
        product_serial: dmi("product_serial"),
        board_serial: dmi("board_serial"),
        addresses,
        cpu_count,
        memory_total_bytes: root
            .read("proc/meminfo")
            .and_then(|m| parse_meminfo_total(&m))
            .unwrap_or(0),
        shm_bytes: fs_size(&root.path("dev/shm")).unwrap_or(0),
        cpu_model,
        ib_devices: ib_devices(&root.path("sys/class/infiniband")),
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
        os: root
            .read("etc/os-release")
            .and_then(|s| parse_os_release(&s))
            .unwrap_or_else(|| "Linux".to_string()),
        kernel: root
            .read("proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        interfaces: interfaces(root, &up),
        memlock_bytes: memlock_limit(),
        nvidia_peermem: nvidia_peermem_loaded(root),
        ..Default::default()
    }
}

/// `NetInterface`s for the given up, non-loopback IPv4 addresses (from
/// `up_ipv4_addrs`), with MTU and link speed from `/sys/class/net/<if>/`
/// (0 where the kernel does not say, e.g. virtual links report speed -1).
pub fn interfaces(root: &HostRoot, up: &[(String, Ipv4Addr)]) -> Vec<NetInterface> {
    let num = |rel: String| -> u64 {
        root.read(&rel)
            .and_then(|s| s.trim().parse::<i64>().ok())
            .filter(|v| *v > 0)
            .unwrap_or(0) as u64
    };
    let mut out: Vec<NetInterface> = up
        .iter()
        .map(|(name, ip)| NetInterface {
            name: name.clone(),
            ipv4: ip.to_string(),
            mtu: num(format!("sys/class/net/{name}/mtu")) as u32,
            speed_mbps: num(format!("sys/class/net/{name}/speed")),
        })
        .collect();
    out.sort_by(|a, b| (interface_rank(&a.name), &a.name).cmp(&(interface_rank(&b.name), &b.name)));
    out
}

/// This process's `RLIMIT_MEMLOCK` (which the workers inherit): `u64::MAX`
/// when unlimited. RDMA (InfiniBand, GPUDirect) pins memory and needs it
/// unlimited.
pub fn memlock_limit() -> u64 {
    // SAFETY: rlimit is plain old data; getrlimit fills it or fails.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: a valid resource and out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) } != 0 {
        return 0;
    }
    if rl.rlim_cur == libc::RLIM_INFINITY {
        u64::MAX
    } else {
        rl.rlim_cur as u64
    }
}

/// GPUDirect RDMA: the `nvidia_peermem` module (or the older `nv_peer_mem`)
/// is loaded, per `/proc/modules` or `/sys/module`.
pub fn nvidia_peermem_loaded(root: &HostRoot) -> bool {
    const NAMES: [&str; 2] = ["nvidia_peermem", "nv_peer_mem"];
    let in_proc = root.read("proc/modules").is_some_and(|m| {
        m.lines()
            .filter_map(|l| l.split_whitespace().next())
            .any(|name| NAMES.contains(&name))
    });
    in_proc
        || NAMES
            .iter()
            .any(|n| root.exists(&format!("sys/module/{n}")))
}

/// One port of an InfiniBand (or RoCE) device, from
/// `/sys/class/infiniband/<dev>/ports/<n>/{state,rate,link_layer}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IbPort {
    pub device: String,
    pub port: String,
    /// `ACTIVE`, `DOWN`, `INIT`, ... (the kernel's `4: ACTIVE` without the number).
    pub state: String,
    /// e.g. `400 Gb/sec (4X NDR)`; empty when unknown.
    pub rate: String,
    /// `InfiniBand` or `Ethernet` (RoCE); empty when unknown.
    pub link_layer: String,
}

impl IbPort {
    pub fn active(&self) -> bool {
        self.state == "ACTIVE"
    }
}

/// Every port of every InfiniBand device, sorted by device and port.
pub fn ib_ports(root: &HostRoot) -> Vec<IbPort> {
    let mut out = Vec::new();
    for device in root.list("sys/class/infiniband") {
        for port in root.list(&format!("sys/class/infiniband/{device}/ports")) {
            let field = |f: &str| {
                root.read(&format!("sys/class/infiniband/{device}/ports/{port}/{f}"))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default()
            };
            let state = field("state");
            // `4: ACTIVE` → `ACTIVE`
            let state = match state.split_once(':') {
                Some((_, name)) => name.trim().to_string(),
                None => state,
            };
            let (rate, link_layer) = (field("rate"), field("link_layer"));
            out.push(IbPort {
                device: device.clone(),
                port,
                state,
                rate,
                link_layer,
            });
        }
    }
    out
}

/// The machine's host name, through the system call (fallback when
/// `/proc/sys/kernel/hostname` cannot be read).
pub fn libc_hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its whole length; gethostname writes at most that.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".to_string();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// `MemTotal:  1234 kB` → bytes.
pub fn parse_meminfo_total(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let rest = line.strip_prefix("MemTotal:")?;
        let mut parts = rest.split_whitespace();
        let value: u64 = parts.next()?.parse().ok()?;
        let mult = match parts.next().map(|u| u.to_ascii_lowercase()) {
            Some(u) if u == "kb" => 1024,
            Some(u) if u == "mb" => 1024 * 1024,
            None => 1,
            Some(_) => 1024,
        };
        Some(value * mult)
    })
}

/// CPU model and number of logical CPUs from `/proc/cpuinfo`. x86 names the
/// model in `model name`; arm64 kernels may only give `Model` or `Hardware`.
pub fn parse_cpuinfo(cpuinfo: &str) -> (String, u32) {
    let mut model = None;
    let mut fallback = None;
    let mut count = 0u32;
    for line in cpuinfo.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        match key {
            "processor" => count += 1,
            "model name" if model.is_none() && !value.is_empty() => model = Some(value.to_string()),
            "Model" | "Hardware" | "cpu model" if fallback.is_none() && !value.is_empty() => {
                fallback = Some(value.to_string())
            }
            _ => {}
        }
    }
    let model = model
        .or(fallback)
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    (model, count)
}

/// `PRETTY_NAME="Ubuntu 22.04.4 LTS"` from `/etc/os-release`.
pub fn parse_os_release(text: &str) -> Option<String> {
    let field = |name: &str| {
        text.lines().find_map(|l| {
            let v = l.strip_prefix(name)?.strip_prefix('=')?;
            let v = v.trim().trim_matches('"').trim_matches('\'');
            (!v.is_empty()).then(|| v.to_string())
        })
    };
    field("PRETTY_NAME").or_else(|| field("NAME"))
}

/// Size of the file system holding `path` (for `/dev/shm`: what NCCL's shared
/// memory transport can use; Docker's default is only 64 MiB).
pub fn fs_size(path: &Path) -> Option<u64> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs is plain old data; the call fills it or fails.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a valid out-pointer.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    (rc == 0).then(|| st.f_blocks as u64 * st.f_frsize as u64)
}

/// InfiniBand (and RoCE) devices that NCCL could use: those with at least one
/// ACTIVE port. A device whose ports are all down is left out, because the
/// coordinator plans `NCCL_IB_DISABLE` from this list and NCCL would otherwise
/// try a dead link. Devices without a `ports` folder are listed as they are.
pub fn ib_devices(class_dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(class_dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let ports = entry.path().join("ports");
        let states: Vec<String> = std::fs::read_dir(&ports)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|p| std::fs::read_to_string(p.path().join("state")).ok())
                    .collect()
            })
            .unwrap_or_default();
        if states.is_empty() || states.iter().any(|s| s.contains("ACTIVE")) {
            out.push(name);
        } else {
            tracing::warn!(device = %name, "InfiniBand device has no ACTIVE port; not offered to NCCL");
        }
    }
    out.sort();
    out
}

/// IPv4 addresses of this host, best first: up, non-loopback, non-link-local
/// interfaces (container bridges last, since other hosts cannot reach them),
/// then 127.0.0.1 so that a single-host fleet on loopback always works.
pub fn local_addresses() -> Vec<String> {
    let mut found: Vec<(u8, String, Ipv4Addr)> = up_ipv4_addrs()
        .into_iter()
        .filter(|(_, ip)| !ip.is_link_local())
        .map(|(name, ip)| (interface_rank(&name), name, ip))
        .collect();
    found.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    let mut out: Vec<String> = Vec::new();
    for (_, _, ip) in found {
        let s = ip.to_string();
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out.push(Ipv4Addr::LOCALHOST.to_string());
    out
}

/// (interface, IPv4 address) of every up, non-loopback interface of this
/// process's network, through getifaddrs.
pub fn up_ipv4_addrs() -> Vec<(String, Ipv4Addr)> {
    let mut found: Vec<(String, Ipv4Addr)> = Vec::new();
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs allocates a list we walk read-only and free below.
    if unsafe { libc::getifaddrs(&mut ifap) } == 0 {
        let mut cur = ifap;
        while !cur.is_null() {
            // SAFETY: `cur` is a node of the list getifaddrs returned.
            let ifa = unsafe { &*cur };
            cur = ifa.ifa_next;
            if ifa.ifa_addr.is_null() {
                continue;
            }
            // SAFETY: ifa_addr is non-null and points at a sockaddr.
            let family = unsafe { (*ifa.ifa_addr).sa_family } as i32;
            if family != libc::AF_INET {
                continue;
            }
            let flags = ifa.ifa_flags;
            if flags & libc::IFF_UP as u32 == 0 || flags & libc::IFF_LOOPBACK as u32 != 0 {
                continue;
            }
            // SAFETY: family is AF_INET, so the sockaddr is a sockaddr_in.
            let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            if ip.is_loopback() || ip.is_unspecified() {
                continue;
            }
            // SAFETY: ifa_name is a NUL-terminated C string owned by the list.
            let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
                .to_string_lossy()
                .into_owned();
            found.push((name, ip));
        }
        // SAFETY: frees the list allocated above, once.
        unsafe { libc::freeifaddrs(ifap) };
    }
    found
}

/// Bridges and virtual links of container runtimes come after real NICs.
fn interface_rank(name: &str) -> u8 {
    const VIRTUAL: &[&str] = &[
        "docker", "br-", "virbr", "veth", "cni", "flannel", "cali", "tun", "tap",
    ];
    if VIRTUAL.iter().any(|p| name.starts_with(p)) {
        1
    } else {
        0
    }
}

/// Fixture trees for the tests of this crate that read a host root.
#[cfg(test)]
pub(crate) mod fixture {
    use std::path::Path;

    pub fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// Port 1 of an InfiniBand device, as sysfs shows it.
    pub fn ib_port(root: &Path, dev: &str, state: &str, rate: &str, link_layer: &str) {
        let base = format!("sys/class/infiniband/{dev}/ports/1");
        write(root, &format!("{base}/state"), &format!("{state}\n"));
        write(root, &format!("{base}/rate"), &format!("{rate}\n"));
        write(
            root,
            &format!("{base}/link_layer"),
            &format!("{link_layer}\n"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use fixture::{ib_port, write};

    const CPUINFO: &str = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n\nprocessor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n\nprocessor\t: 2\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n";

    #[test]
    fn fixture_tree_gives_every_fact() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        write(
            r,
            "proc/meminfo",
            "MemFree:   100 kB\nMemTotal:       2097152 kB\nSwapTotal: 0 kB\n",
        );
        write(r, "proc/cpuinfo", CPUINFO);
        write(r, "proc/sys/kernel/hostname", "gpu-node-07\n");
        write(r, "proc/sys/kernel/osrelease", "6.8.0-45-generic\n");
        write(
            r,
            "etc/os-release",
            "NAME=\"Ubuntu\"\nPRETTY_NAME=\"Ubuntu 24.04.1 LTS\"\n",
        );
        write(r, "sys/class/infiniband/mlx5_1/ports/1/state", "1: DOWN\n");
        write(
            r,
            "sys/class/infiniband/mlx5_0/ports/1/state",
            "4: ACTIVE\n",
        );
        write(
            r,
            "sys/class/infiniband/mlx5_2/ports/1/state",
            "4: ACTIVE\n",
        );
        std::fs::create_dir_all(r.join("dev/shm")).unwrap();

        let f = gather(&HostRoot::new(r));
        assert_eq!(f.hostname, "gpu-node-07");
        assert_eq!(f.memory_total_bytes, 2097152 * 1024);
        assert_eq!(f.cpu_count, 3);
        assert_eq!(f.cpu_model, "Intel(R) Xeon(R) Platinum 8480+");
        assert_eq!(
            f.ib_devices,
            vec!["mlx5_0", "mlx5_2"],
            "mlx5_1 has no ACTIVE port"
        );
        assert_eq!(f.os, "Ubuntu 24.04.1 LTS");
        assert_eq!(f.kernel, "6.8.0-45-generic");
        assert_eq!(f.addresses, vec!["127.0.0.1"]);
        assert!(f.shm_bytes > 0, "statvfs of the fixture's dev/shm");
    }

    #[test]
    fn missing_files_give_empty_facts_not_errors() {
        let dir = tempfile::tempdir().unwrap();
        let f = gather(&HostRoot::new(dir.path()));
        assert_eq!(f.memory_total_bytes, 0);
        assert_eq!(f.cpu_count, 0);
        assert!(f.ib_devices.is_empty());
        assert_eq!(f.shm_bytes, 0);
        assert!(!f.hostname.is_empty(), "falls back to gethostname");
    }

    #[test]
    fn arm_cpuinfo_and_meminfo_units() {
        let (model, n) =
            parse_cpuinfo("processor : 0\nBogoMIPS : 50\n\nprocessor : 1\nModel : NVIDIA Grace\n");
        assert_eq!((model.as_str(), n), ("NVIDIA Grace", 2));
        assert_eq!(parse_meminfo_total("MemTotal: 3 kB"), Some(3072));
        assert_eq!(parse_meminfo_total("MemFree: 3 kB"), None);
    }

    #[test]
    fn interfaces_peermem_and_ib_ports_from_fixtures() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        write(r, "sys/class/net/eth0/mtu", "9000\n");
        write(r, "sys/class/net/eth0/speed", "100000\n");
        write(r, "sys/class/net/docker0/mtu", "1500\n");
        write(r, "sys/class/net/docker0/speed", "-1\n");
        let root = HostRoot::new(r);
        let up = vec![
            ("docker0".to_string(), Ipv4Addr::new(172, 17, 0, 1)),
            ("eth0".to_string(), Ipv4Addr::new(10, 0, 0, 7)),
        ];
        let got = interfaces(&root, &up);
        assert_eq!(got.len(), 2);
        assert_eq!(
            (
                got[0].name.as_str(),
                got[0].ipv4.as_str(),
                got[0].mtu,
                got[0].speed_mbps
            ),
            ("eth0", "10.0.0.7", 9000, 100_000),
            "real NICs first"
        );
        assert_eq!((got[1].mtu, got[1].speed_mbps), (1500, 0), "speed -1 → 0");

        assert!(!nvidia_peermem_loaded(&root));
        write(
            r,
            "proc/modules",
            "nvidia_uvm 1 0 - Live 0x0\nnvidia 2 1 nvidia_uvm, Live 0x0\n",
        );
        assert!(!nvidia_peermem_loaded(&root), "nvidia alone is not peermem");
        write(
            r,
            "proc/modules",
            "nvidia_peermem 16384 0 - Live 0x0\nnvidia 2 1 nvidia_peermem, Live 0x0\n",
        );
        assert!(nvidia_peermem_loaded(&root));
        std::fs::remove_file(r.join("proc/modules")).unwrap();
        std::fs::create_dir_all(r.join("sys/module/nvidia_peermem")).unwrap();
        assert!(nvidia_peermem_loaded(&root), "/sys/module is enough");

        ib_port(
            r,
            "mlx5_0",
            "4: ACTIVE",
            "400 Gb/sec (4X NDR)",
            "InfiniBand",
        );
        write(r, "sys/class/infiniband/mlx5_1/ports/1/state", "1: DOWN\n");
        let ports = ib_ports(&root);
        assert_eq!(ports.len(), 2);
        assert!(ports[0].active());
        assert_eq!(ports[0].rate, "400 Gb/sec (4X NDR)");
        assert_eq!(ports[0].link_layer, "InfiniBand");
        assert_eq!(
            (ports[1].device.as_str(), ports[1].state.as_str()),
            ("mlx5_1", "DOWN")
        );
        assert!(!ports[1].active());
    }

    #[test]
    fn live_addresses_end_with_loopback() {
        let a = local_addresses();
        assert_eq!(a.last().map(String::as_str), Some("127.0.0.1"));
        assert_eq!(a.iter().filter(|s| *s == "127.0.0.1").count(), 1);
    }
}

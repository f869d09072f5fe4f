//! The checks themselves: pure functions of a `Snapshot`, so that every
//! verdict is tested with hand-made hosts (IB ports up and down, small
//! `/dev/shm`, GPUs with NVLinks down, ...).

use std::collections::BTreeMap;

use gpuctl_core::pb::{PreflightCheck, Verdict};
use gpuctl_core::units::format_bytes;

use super::{NcclState, Snapshot};
use crate::facts::IbPort;
use crate::libtorch::TORCH_VERSION;

/// `/dev/shm` below this gets a warning: NCCL's shared-memory transport and
/// data loaders need more than Docker's default 64 MiB.
pub const MIN_SHM_BYTES: u64 = 1 << 30;
/// The NCCL the worker is built for (cudarc's `nccl-02028`).
pub const MIN_NCCL: (u32, u32) = (2, 28);

fn check(node: &str, name: &str, verdict: Verdict, detail: String, fix: &str) -> PreflightCheck {
    PreflightCheck {
        node: node.to_string(),
        name: name.to_string(),
        verdict: verdict as i32,
        detail,
        fix: if verdict == Verdict::Pass {
            String::new()
        } else {
            fix.to_string()
        },
    }
}

/// Every check, in the order people read them.
pub fn evaluate(s: &Snapshot) -> Vec<PreflightCheck> {
    let has_ib = s.ib_ports.iter().any(IbPort::active);
    vec![
        driver(s),
        gpus(s),
        topology(s),
        libtorch(s),
        nccl(s),
        shm(&s.node, s.shm_bytes),
        memlock(&s.node, s.memlock_bytes, has_ib),
        infiniband(&s.node, &s.ib_ports),
        gpudirect_rdma(&s.node, s.peermem, has_ib, !s.gpus.is_empty()),
        persistence_mode(s),
        ecc_mode(s),
        gpu_processes(s),
    ]
}

pub fn driver(s: &Snapshot) -> PreflightCheck {
    const NAME: &str = "driver";
    let n = &s.node;
    if s.gpus.is_empty() {
        if s.nvml_status.starts_with("not used") {
            return check(
                n,
                NAME,
                Verdict::Pass,
                format!("GPUs {}", s.nvml_status),
                "",
            );
        }
        if s.nvml_status.starts_with("ok") {
            return check(
                n,
                NAME,
                Verdict::Warn,
                format!("driver {} loaded, but NVML lists no GPU: the node offers CPU ranks only", s.driver_version),
                "check `nvidia-smi`; in a container, expose the GPUs (--gpus all, or the NVIDIA device plugin)",
            );
        }
        if s.driver_loaded {
            return check(
                n,
                NAME,
                Verdict::Warn,
                format!("the NVIDIA driver is loaded but NVML cannot be used ({}): the node offers CPU ranks only", s.nvml_status),
                "make libnvidia-ml.so.1 loadable by the agent (in a container: the NVIDIA container toolkit, --gpus all)",
            );
        }
        return check(
            n,
            NAME,
            Verdict::Pass,
            "no NVIDIA driver: CPU-only host".into(),
            "",
        );
    }
    let mut detail = format!(
        "driver {}, CUDA {}",
        dash(&s.driver_version),
        dash(&s.cuda_driver_version)
    );
    let torch_cuda = s.torch.as_ref().ok().and_then(|t| t.cuda.clone());
    if let (Some(tc), Some(dc)) = (
        torch_cuda.as_deref().and_then(super::libs::major_minor),
        super::libs::major_minor(&s.cuda_driver_version),
    ) {
        detail.push_str(&format!("; torch is built for CUDA {}.{}", tc.0, tc.1));
        // CUDA's minor-version compatibility: the same major is enough.
        if dc.0 < tc.0 {
            return check(
                n,
                NAME,
                Verdict::Fail,
                format!("{detail}, which this driver (CUDA {}.{}) cannot run", dc.0, dc.1),
                &format!("install an NVIDIA driver that supports CUDA {}.{} (CUDA 13 needs R580 or newer), or use a torch built for CUDA {}", tc.0, tc.1, dc.0),
            );
        }
    }
    check(n, NAME, Verdict::Pass, detail, "")
}

pub fn gpus(s: &Snapshot) -> PreflightCheck {
    const NAME: &str = "gpus";
    if s.gpus.is_empty() {
        return check(
            &s.node,
            NAME,
            Verdict::Pass,
            format!("no GPU: {} CPU ranks", s.cpu_ranks),
            "",
        );
    }
    let mut by_model: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for g in &s.gpus {
        by_model.entry(g.name.as_str()).or_default().push(g.index);
    }
    if by_model.len() == 1 {
        let (model, idx) = by_model.iter().next().unwrap();
        return check(
            &s.node,
            NAME,
            Verdict::Pass,
            format!("{} × {model}", idx.len()),
            "",
        );
    }
    let detail = by_model
        .iter()
        .map(|(m, idx)| format!("GPU {}: {m}", list(idx)))
        .collect::<Vec<_>>()
        .join("; ");
    check(
        &s.node,
        NAME,
        Verdict::Warn,
        format!("mixed GPU models: {detail}"),
        "results are compared within one model; keep one model per node, or select nodes with --selector gpu=MODEL",
    )
}

pub fn topology(s: &Snapshot) -> PreflightCheck {
    const NAME: &str = "topology";
    let n = &s.node;
    match s.gpus.len() {
        0 => return check(n, NAME, Verdict::Pass, "no GPU".into(), ""),
        1 => {
            return check(
                n,
                NAME,
                Verdict::Pass,
                "one GPU: no GPU-to-GPU link to check".into(),
                "",
            )
        }
        _ => {}
    }
    let mut pcie: BTreeMap<&str, u32> = BTreeMap::new();
    for p in &s.pairs {
        *pcie.entry(p.pcie.as_str()).or_default() += 1;
    }
    let pcie_text = if pcie.is_empty() {
        "PCIe paths unknown".to_string()
    } else {
        format!(
            "PCIe paths between GPU pairs: {}",
            pcie.iter()
                .map(|(k, v)| format!("{v}×{k}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let with_links: Vec<_> = s.gpus.iter().filter(|g| g.nvlinks_present > 0).collect();
    if with_links.is_empty() {
        return check(
            n,
            NAME,
            Verdict::Pass,
            format!("no NVLink: GPUs talk over PCIe; {pcie_text}"),
            "",
        );
    }
    let best = with_links
        .iter()
        .map(|g| g.nvlinks_active)
        .max()
        .unwrap_or(0);
    // A GPU some of whose links did not answer is not compared: unknown is
    // never down.
    let answered = with_links
        .iter()
        .map(|g| g.nvlinks_present)
        .max()
        .unwrap_or(0);
    let dead: Vec<u32> = with_links
        .iter()
        .filter(|g| g.nvlinks_active == 0 && g.nvlinks_present == answered)
        .map(|g| g.index)
        .collect();
    let short: Vec<String> = with_links
        .iter()
        .filter(|g| {
            g.nvlinks_active > 0 && g.nvlinks_active < best && g.nvlinks_present == answered
        })
        .map(|g| format!("GPU {} has {}", g.index, g.nvlinks_active))
        .collect();
    let counts: Vec<String> = s
        .gpus
        .iter()
        .map(|g| format!("{}/{}", g.nvlinks_active, g.nvlinks_present))
        .collect();
    let summary = if counts.iter().all(|c| *c == counts[0]) {
        format!("NVLink {} active on every GPU", counts[0])
    } else {
        format!("NVLinks active per GPU: {}", counts.join(" "))
    };
    const FIX: &str = "check the NVLink fabric: `nvidia-smi nvlink -s`; on NVSwitch systems start nvidia-fabricmanager (same version as the driver); reseat or RMA a GPU whose links stay down";
    if !dead.is_empty() {
        return check(
            n,
            NAME,
            Verdict::Warn,
            format!("GPU {} has NVLink but no active link (traffic falls back to PCIe); {summary}; {pcie_text}", list(&dead)),
            FIX,
        );
    }
    if !short.is_empty() {
        return check(
            n,
            NAME,
            Verdict::Warn,
            format!(
                "{} of {best} active NVLinks; {summary}; {pcie_text}",
                short.join(", ")
            ),
            FIX,
        );
    }
    check(
        n,
        NAME,
        Verdict::Pass,
        format!("{summary}; {pcie_text}"),
        "",
    )
}

pub fn libtorch(s: &Snapshot) -> PreflightCheck {
    const NAME: &str = "libtorch";
    let n = &s.node;
    let t = match &s.torch {
        Err(e) => {
            return check(
                n,
                NAME,
                Verdict::Fail,
                format!("{e}: workers cannot start"),
                "run scripts/install-libtorch.sh, or pass --libtorch DIR (a site-packages holding torch/, or a libtorch folder)",
            )
        }
        Ok(t) => t,
    };
    let Some(v) = &t.version else {
        return check(
            n,
            NAME,
            Verdict::Warn,
            format!(
                "found in {}, but without torch/version.py or build-version: version unknown",
                t.location
            ),
            &format!(
                "point --libtorch at a torch {TORCH_VERSION} install (scripts/install-libtorch.sh)"
            ),
        );
    };
    let base = v.split('+').next().unwrap_or(v);
    if base != TORCH_VERSION {
        return check(
            n,
            NAME,
            Verdict::Warn,
            format!("torch {v} in {}; the worker is built for {TORCH_VERSION}", t.location),
            &format!("install torch {TORCH_VERSION} (scripts/install-libtorch.sh) and pass --libtorch to it"),
        );
    }
    if !s.gpus.is_empty() && !t.has_cuda_lib {
        return check(
            n,
            NAME,
            Verdict::Fail,
            format!("torch {v} in {} has no libtorch_cuda.so: GPU workers cannot use CUDA", t.location),
            &format!("pass --libtorch with a full CUDA build of torch {TORCH_VERSION} (pip install torch=={TORCH_VERSION} into a folder)"),
        );
    }
    check(
        n,
        NAME,
        Verdict::Pass,
        format!("torch {v} in {}", t.location),
        "",
    )
}

pub fn nccl(s: &Snapshot) -> PreflightCheck {
    const NAME: &str = "nccl";
    let n = &s.node;
    let gpu_host = !s.gpus.is_empty();
    const FIX_INSTALL: &str = "pip install nvidia-nccl-cu13 into libtorch's site-packages (pip install --target), or pass --libtorch with a full torch install";
    match &s.nccl {
        NcclState::NotFound if gpu_host => check(
            n,
            NAME,
            Verdict::Warn,
            "no libnccl.so.2 in libtorch's folders: GPU workers may load another NCCL than libtorch_cuda, or none".into(),
            FIX_INSTALL,
        ),
        NcclState::NotFound => check(
            n,
            NAME,
            Verdict::Pass,
            "not needed on a CPU-only host (workers use the TCP ring)".into(),
            "",
        ),
        NcclState::Broken { path, error } => check(
            n,
            NAME,
            if gpu_host { Verdict::Fail } else { Verdict::Warn },
            format!("{path}: {error}"),
            FIX_INSTALL,
        ),
        NcclState::Loaded { path, version } => {
            let old = super::libs::major_minor(version).is_some_and(|v| v < MIN_NCCL);
            if old && gpu_host {
                check(
                    n,
                    NAME,
                    Verdict::Warn,
                    format!("NCCL {version} ({path}); the worker is built for NCCL {}.{} or newer", MIN_NCCL.0, MIN_NCCL.1),
                    "install the NCCL that torch 2.11 ships (pip install nvidia-nccl-cu13) into libtorch's site-packages",
                )
            } else {
                check(n, NAME, Verdict::Pass, format!("NCCL {version} ({path})"), "")
            }
        }
    }
}

/// `bytes` is the size of `/dev/shm` (0: missing or unreadable).
pub fn shm(node: &str, bytes: u64) -> PreflightCheck {
    const FIX: &str = "give the agent's container more shared memory: docker run --shm-size=16g (or --ipc=host); Kubernetes: an emptyDir with medium: Memory mounted at /dev/shm";
    if bytes == 0 {
        return check(
            node,
            "shm",
            Verdict::Warn,
            "/dev/shm is missing or unreadable".into(),
            FIX,
        );
    }
    if bytes < MIN_SHM_BYTES {
        return check(
            node,
            "shm",
            Verdict::Warn,
            format!(
                "/dev/shm is {}, under {}: NCCL's shared-memory transport can fail",
                format_bytes(bytes),
                format_bytes(MIN_SHM_BYTES)
            ),
            FIX,
        );
    }
    check(
        node,
        "shm",
        Verdict::Pass,
        format!("/dev/shm is {}", format_bytes(bytes)),
        "",
    )
}

/// `limit` is RLIMIT_MEMLOCK (`u64::MAX`: unlimited).
pub fn memlock(node: &str, limit: u64, has_ib: bool) -> PreflightCheck {
    let shown = if limit == u64::MAX {
        "unlimited".to_string()
    } else {
        format_bytes(limit)
    };
    if limit != u64::MAX && has_ib {
        return check(
            node,
            "memlock",
            Verdict::Warn,
            format!("locked-memory limit is {shown}: RDMA over InfiniBand needs it unlimited"),
            "run the agent with `ulimit -l unlimited` (systemd: LimitMEMLOCK=infinity; Docker: --ulimit memlock=-1)",
        );
    }
    let why = if has_ib || limit == u64::MAX {
        ""
    } else {
        " (no InfiniBand: enough)"
    };
    check(
        node,
        "memlock",
        Verdict::Pass,
        format!("locked-memory limit is {shown}{why}"),
        "",
    )
}

pub fn infiniband(node: &str, ports: &[IbPort]) -> PreflightCheck {
    const NAME: &str = "infiniband";
    if ports.is_empty() {
        return check(
            node,
            NAME,
            Verdict::Pass,
            "no InfiniBand/RoCE device: NCCL uses TCP sockets between nodes".into(),
            "",
        );
    }
    let describe = |p: &IbPort| {
        let mut s = format!("{}/{} {}", p.device, p.port, dash(&p.state));
        if !p.rate.is_empty() {
            s.push_str(&format!(" {}", p.rate));
        }
        if !p.link_layer.is_empty() {
            s.push_str(&format!(" {}", p.link_layer));
        }
        s
    };
    let all = ports.iter().map(describe).collect::<Vec<_>>().join(", ");
    let down: Vec<String> = ports
        .iter()
        .filter(|p| !p.active())
        .map(|p| format!("{}/{} is {}", p.device, p.port, dash(&p.state)))
        .collect();
    if !down.is_empty() {
        let none_up = down.len() == ports.len();
        return check(
            node,
            NAME,
            Verdict::Warn,
            format!(
                "{}{}; ports: {all}",
                down.join(", "),
                if none_up { " (no ACTIVE port: NCCL will not use InfiniBand)" } else { "" }
            ),
            "check cables, switch ports and the subnet manager (`ibstat`, `ibv_devinfo`); leave unused devices out with NCCL_IB_HCA",
        );
    }
    let mut rates: Vec<&str> = ports
        .iter()
        .map(|p| p.rate.as_str())
        .filter(|r| !r.is_empty())
        .collect();
    rates.sort();
    rates.dedup();
    if rates.len() > 1 {
        return check(
            node,
            NAME,
            Verdict::Warn,
            format!("active ports run at different rates ({}); ports: {all}", rates.join(" / ")),
            "a port below its rated speed has a bad cable or transceiver: check with `ibstat` and `mlxlink`",
        );
    }
    check(node, NAME, Verdict::Pass, all, "")
}

pub fn gpudirect_rdma(node: &str, peermem: bool, has_ib: bool, gpu_host: bool) -> PreflightCheck {
    const NAME: &str = "gpudirect_rdma";
    if peermem {
        return check(
            node,
            NAME,
            Verdict::Pass,
            "nvidia_peermem is loaded".into(),
            "",
        );
    }
    if !gpu_host {
        return check(
            node,
            NAME,
            Verdict::Pass,
            "not needed without GPUs".into(),
            "",
        );
    }
    if !has_ib {
        return check(
            node,
            NAME,
            Verdict::Pass,
            "not needed without an active InfiniBand port".into(),
            "",
        );
    }
    check(
        node,
        NAME,
        Verdict::Warn,
        "InfiniBand is up but nvidia_peermem is not loaded: GPU memory crosses the network through host memory (slower)".into(),
        "modprobe nvidia_peermem, and list it in /etc/modules-load.d/ so that it loads at boot",
    )
}

pub fn persistence_mode(s: &Snapshot) -> PreflightCheck {
    mode_check(
        s,
        "persistence_mode",
        |g| g.persistence,
        "nvidia-smi -pm 1 (or run nvidia-persistenced): without it the driver re-initialises the GPUs for every job",
    )
}

pub fn ecc_mode(s: &Snapshot) -> PreflightCheck {
    mode_check(
        s,
        "ecc_mode",
        |g| g.ecc,
        "nvidia-smi -e 1, then reboot (or reset the GPUs): without ECC, memory errors go unnoticed",
    )
}

fn mode_check(
    s: &Snapshot,
    name: &str,
    get: fn(&super::GpuState) -> Option<bool>,
    fix: &str,
) -> PreflightCheck {
    if s.gpus.is_empty() {
        return check(&s.node, name, Verdict::Pass, "no GPU".into(), "");
    }
    let off: Vec<u32> = s
        .gpus
        .iter()
        .filter(|g| get(g) == Some(false))
        .map(|g| g.index)
        .collect();
    let unknown: Vec<u32> = s
        .gpus
        .iter()
        .filter(|g| get(g).is_none())
        .map(|g| g.index)
        .collect();
    if !off.is_empty() {
        return check(
            &s.node,
            name,
            Verdict::Warn,
            format!("off on GPU {}", list(&off)),
            fix,
        );
    }
    let mut detail = if unknown.len() == s.gpus.len() {
        "not reported by NVML (not supported on these GPUs)".to_string()
    } else {
        format!("on for {} GPU(s)", s.gpus.len() - unknown.len())
    };
    if !unknown.is_empty() && unknown.len() < s.gpus.len() {
        detail.push_str(&format!("; unknown on GPU {}", list(&unknown)));
    }
    check(&s.node, name, Verdict::Pass, detail, "")
}

/// The check that lists other processes holding GPU memory.
pub const GPU_PROCESSES: &str = "gpu_processes";

pub fn gpu_processes(s: &Snapshot) -> PreflightCheck {
    const NAME: &str = GPU_PROCESSES;
    if s.gpus.is_empty() {
        return check(&s.node, NAME, Verdict::Pass, "no GPU".into(), "");
    }
    let mut found = Vec::new();
    for g in &s.gpus {
        for p in &g.foreign {
            let mem = p
                .used_bytes
                .map(|b| format!("{} MiB", b / (1024 * 1024)))
                .unwrap_or_else(|| "memory unknown".into());
            let cmd = if p.command.is_empty() {
                String::new()
            } else {
                format!(" ({})", p.command)
            };
            found.push(format!("GPU {}: pid {}{cmd} {mem}", g.index, p.pid));
        }
    }
    if found.is_empty() {
        return check(
            &s.node,
            NAME,
            Verdict::Pass,
            "no other process holds GPU memory".into(),
            "",
        );
    }
    check(
        &s.node,
        NAME,
        Verdict::Warn,
        format!("other processes hold GPU memory: {}", found.join("; ")),
        "stop them (`nvidia-smi` lists them) before a run: they take memory and compute from the workers",
    )
}

fn dash(s: &str) -> &str {
    if s.is_empty() {
        "?"
    } else {
        s
    }
}

/// `0, 1, 3`.
fn list(idx: &[u32]) -> String {
    idx.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

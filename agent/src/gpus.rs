//! The GPUs of this host, read through NVML.
//!
//! `nvml-wrapper` loads `libnvidia-ml.so.1` at run time, so the same agent
//! binary runs on a host without a driver: NVML is then simply absent, the
//! reason goes into `HostFacts.nvml_status`, and the agent offers CPU ranks.
//! The `Nvml` handle is kept so that telemetry sampling (a later issue) can
//! reuse it without initialising NVML again.

use std::sync::Arc;

use gpuctl_proto::pb::GpuInfo;
use nvml_wrapper::Nvml;

/// NVML's `NVML_NVLINK_MAX_LINKS` (18 on Hopper), not re-exported by nvml-wrapper.
const NVLINK_MAX_LINKS: u32 = 18;

/// What NVML said about this host.
pub struct GpuInventory {
    pub gpus: Vec<GpuInfo>,
    pub driver_version: String,
    /// `13.0` style, from the driver's CUDA version.
    pub cuda_driver_version: String,
    /// `ok`, or why NVML could not be used.
    pub status: String,
    /// Kept for telemetry; `None` without NVML.
    pub nvml: Option<Arc<Nvml>>,
}

impl GpuInventory {
    /// A host without NVML (or told to ignore its GPUs): `reason` says why.
    pub fn none(reason: impl Into<String>) -> Self {
        GpuInventory {
            gpus: Vec::new(),
            driver_version: String::new(),
            cuda_driver_version: String::new(),
            status: reason.into(),
            nvml: None,
        }
    }

    /// UUID of the GPU with this NVML index, for placements that give only
    /// the index.
    pub fn uuid_of(&self, index: u32) -> Option<&str> {
        self.gpus
            .iter()
            .find(|g| g.index == index)
            .map(|g| g.uuid.as_str())
    }
}

/// Initialises NVML and lists every GPU. Never fails: a host without NVML is a
/// CPU host, and a GPU that cannot be read is logged and left out.
pub fn probe() -> GpuInventory {
    let nvml = match Nvml::init() {
        Ok(n) => n,
        Err(e) => return GpuInventory::none(format!("unavailable: {e}")),
    };
    let driver_version = nvml.sys_driver_version().unwrap_or_default();
    let cuda_driver_version = nvml
        .sys_cuda_driver_version()
        .map(|v| {
            format!(
                "{}.{}",
                nvml_wrapper::cuda_driver_version_major(v),
                nvml_wrapper::cuda_driver_version_minor(v)
            )
        })
        .unwrap_or_default();
    let count = match nvml.device_count() {
        Ok(c) => c,
        Err(e) => {
            let mut inv = GpuInventory::none(format!("NVML cannot count devices: {e}"));
            inv.driver_version = driver_version;
            inv.cuda_driver_version = cuda_driver_version;
            return inv;
        }
    };
    let mut gpus = Vec::new();
    for index in 0..count {
        match read_gpu(&nvml, index) {
            Ok(g) => gpus.push(g),
            Err(e) => {
                tracing::warn!(index, error = %e, "cannot read GPU through NVML; leaving it out")
            }
        }
    }
    pcie_paths(&nvml, &mut gpus);
    let status = if gpus.is_empty() {
        "ok: NVML found no GPU".to_string()
    } else {
        "ok".to_string()
    };
    GpuInventory {
        gpus,
        driver_version,
        cuda_driver_version,
        status,
        nvml: Some(Arc::new(nvml)),
    }
}

fn read_gpu(nvml: &Nvml, index: u32) -> Result<GpuInfo, nvml_wrapper::error::NvmlError> {
    let d = nvml.device_by_index(index)?;
    // Name, UUID and memory are required to place a rank; the rest is
    // best effort, because older GPUs and vGPUs do not answer every query.
    let mut g = GpuInfo {
        index,
        uuid: d.uuid()?,
        name: d.name()?,
        memory_total_bytes: d.memory_info()?.total,
        ..Default::default()
    };
    g.pci_bus_id = d.pci_info().map(|p| p.bus_id).unwrap_or_default();
    // Identity for acceptance certificates: unreadable is empty (unknown).
    g.serial = d.serial().unwrap_or_default();
    g.board_part_number = d.board_part_number().unwrap_or_default();
    g.vbios_version = d.vbios_version().unwrap_or_default();
    g.inforom_image_version = d.info_rom_image_version().unwrap_or_default();
    g.pcie_gen_max = d.max_pcie_link_gen().unwrap_or(0);
    g.pcie_width_max = d.max_pcie_link_width().unwrap_or(0);
    let active: Vec<u32> = (0..NVLINK_MAX_LINKS)
        .filter(|&l| d.link_wrapper_for(l).is_active().unwrap_or(false))
        .collect();
    g.nvlinks_active = active.len() as u32;
    // A remote end NVML cannot name is unknown (empty), not a failure.
    let remotes = active.iter().map(|&l| {
        d.link_wrapper_for(l)
            .remote_pci_info()
            .map(|p| p.bus_id)
            .unwrap_or_default()
    });
    g.nvlink_remotes = nvlink_ends(remotes);
    if let Ok(cc) = d.cuda_compute_capability() {
        g.compute_capability = format!("{}.{}", cc.major, cc.minor);
        // NVML reports CUDA cores, not SMs; divide by cores per SM where the
        // architecture is known, otherwise leave 0 (unknown).
        if let (Ok(cores), Some(per_sm)) = (d.num_cores(), cores_per_sm(cc.major, cc.minor)) {
            g.sm_count = cores / per_sm;
        }
    }
    Ok(g)
}

/// Links to one remote end counted together, `<bus id>x<links>` by bus id:
/// an H200's 18 links to 4 NVSwitches are 4 short strings, which keeps an
/// 8-GPU host's registration near 4 KiB (`limits::NODE_SHARE_BYTES`).
pub fn nvlink_ends(remotes: impl Iterator<Item = String>) -> Vec<String> {
    let mut count = std::collections::BTreeMap::<String, u32>::new();
    for r in remotes {
        *count.entry(r).or_default() += 1;
    }
    count
        .into_iter()
        .map(|(bus, n)| format!("{bus}x{n}"))
        .collect()
}

/// Each GPU's PCIe path to every other, `<index> <level>` with NVML's
/// topology level: what `gpuctl cert check` compares (indices, not UUIDs,
/// to keep the registration small; the UUIDs are compared beside). A pair
/// NVML cannot place is left out.
fn pcie_paths(nvml: &Nvml, gpus: &mut [GpuInfo]) {
    use nvml_wrapper::enum_wrappers::device::TopologyLevel;
    let word = |l: TopologyLevel| match l {
        TopologyLevel::Internal => "internal",
        TopologyLevel::Single => "single",
        TopologyLevel::Multiple => "multiple",
        TopologyLevel::HostBridge => "hostbridge",
        TopologyLevel::Node => "node",
        TopologyLevel::System => "system",
    };
    let ids: Vec<u32> = gpus.iter().map(|g| g.index).collect();
    for g in gpus.iter_mut() {
        let Ok(d) = nvml.device_by_index(g.index) else {
            continue;
        };
        for index in ids.iter().filter(|i| **i != g.index) {
            let level = nvml
                .device_by_index(*index)
                .and_then(|other| d.topology_common_ancestor(other));
            if let Ok(level) = level {
                g.pcie_paths.push(format!("{index} {}", word(level)));
            }
        }
    }
}

/// FP32 cores per SM by compute capability (CUDA programming guide table).
pub fn cores_per_sm(major: i32, minor: i32) -> Option<u32> {
    match (major, minor) {
        (6, 0) => Some(64),
        (6, _) => Some(128),
        (7, _) => Some(64),
        (8, 0) => Some(64),
        (8, _) => Some(128),
        (9, _) | (10, _) | (11, _) | (12, _) => Some(128),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvlink_ends_count_the_links_to_each_remote() {
        let links = ["b", "a", "b", "a", "b", ""].map(String::from);
        assert_eq!(nvlink_ends(links.into_iter()), ["x1", "ax2", "bx3"]);
    }

    #[test]
    fn sm_count_of_known_parts() {
        // H100/H200 SXM: 132 SMs × 128 cores; A100: 108 SMs × 64 cores.
        assert_eq!(16896 / cores_per_sm(9, 0).unwrap(), 132);
        assert_eq!(6912 / cores_per_sm(8, 0).unwrap(), 108);
        assert_eq!(cores_per_sm(5, 2), None);
    }

    #[test]
    fn probe_never_panics() {
        // On a host without a driver this exercises the "absent" path; on a
        // GPU host every listed GPU must have a UUID.
        let inv = probe();
        assert!(!inv.status.is_empty());
        for g in &inv.gpus {
            assert!(
                g.uuid.starts_with("GPU-") || g.uuid.starts_with("MIG-"),
                "{}",
                g.uuid
            );
        }
        if inv.nvml.is_none() {
            assert!(inv.gpus.is_empty());
        }
    }
}

//! What preflight reads from NVML: per-GPU modes, NVLinks and foreign
//! processes, and the PCIe/NVLink topology between GPU pairs.

use std::collections::BTreeSet;

use gpuctl_proto::pb::GpuInfo;
use nvml_wrapper::enum_wrappers::device::TopologyLevel;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;

use crate::facts::HostRoot;
use crate::telemetry::nvml::nvlinks;

/// One GPU as preflight sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuState {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    /// `None` when NVML does not say.
    pub persistence: Option<bool>,
    pub ecc: Option<bool>,
    pub nvlinks_active: u32,
    /// Links the GPU has, active or not.
    pub nvlinks_present: u32,
    /// Compute processes that are not this agent's workers.
    pub foreign: Vec<GpuProcess>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuProcess {
    pub pid: u32,
    /// `None` when NVML cannot say (e.g. no permission).
    pub used_bytes: Option<u64>,
    /// `/proc/<pid>/comm`, empty when unknown.
    pub command: String,
}

/// How two GPUs are connected (NVML's common PCIe ancestor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuPair {
    pub a: u32,
    pub b: u32,
    /// nvidia-smi topo's words: PIX, PXB, PHB, NODE, SYS, or "same board".
    pub pcie: String,
}

/// nvidia-smi `topo -m` names for NVML's topology levels.
pub fn level_name(l: &TopologyLevel) -> &'static str {
    match l {
        TopologyLevel::Internal => "same board",
        TopologyLevel::Single => "PIX",
        TopologyLevel::Multiple => "PXB",
        TopologyLevel::HostBridge => "PHB",
        TopologyLevel::Node => "NODE",
        TopologyLevel::System => "SYS",
    }
}

/// Reads every listed GPU. `own` holds the process ids (= process group ids)
/// of this agent's workers; their processes, and the agent's, are not
/// foreign.
pub fn read_gpus(
    nvml: &Nvml,
    gpus: &[GpuInfo],
    own: &BTreeSet<u32>,
    root: &HostRoot,
) -> (Vec<GpuState>, Vec<GpuPair>) {
    let me = std::process::id();
    let ours = |pid: u32| -> bool {
        if pid == me || own.contains(&pid) {
            return true;
        }
        // A process a worker started (its group is the worker's pid).
        // SAFETY: getpgid has no memory effects; -1 for unknown pids.
        let pgid = unsafe { libc::getpgid(pid as libc::pid_t) };
        pgid > 0 && own.contains(&(pgid as u32))
    };
    let mut states = Vec::new();
    for g in gpus {
        let mut s = GpuState {
            index: g.index,
            uuid: g.uuid.clone(),
            name: g.name.clone(),
            ..Default::default()
        };
        if let Ok(d) = nvml.device_by_index(g.index) {
            s.persistence = d.is_in_persistent_mode().ok();
            s.ecc = d.is_ecc_enabled().ok().map(|m| m.currently_enabled);
            // A failed read is unknown, not down: read again before a
            // GPU is compared with its peers on links that did not answer.
            let mut l = nvlinks(&d);
            for _ in 0..2 {
                if l.errors.is_empty() {
                    break;
                }
                l = nvlinks(&d);
            }
            s.nvlinks_active = l.active();
            s.nvlinks_present = l.present();
            for p in d.running_compute_processes().unwrap_or_default() {
                if ours(p.pid) {
                    continue;
                }
                s.foreign.push(GpuProcess {
                    pid: p.pid,
                    used_bytes: match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => Some(b),
                        UsedGpuMemory::Unavailable => None,
                    },
                    command: root
                        .read(&format!("proc/{}/comm", p.pid))
                        .map(|c| c.trim().to_string())
                        .unwrap_or_default(),
                });
            }
        }
        states.push(s);
    }
    let mut pairs = Vec::new();
    for (i, a) in gpus.iter().enumerate() {
        for b in &gpus[i + 1..] {
            let (Ok(da), Ok(db)) = (nvml.device_by_index(a.index), nvml.device_by_index(b.index))
            else {
                continue;
            };
            if let Ok(level) = da.topology_common_ancestor(db) {
                pairs.push(GpuPair {
                    a: a.index,
                    b: b.index,
                    pcie: level_name(&level).to_string(),
                });
            }
        }
    }
    (states, pairs)
}

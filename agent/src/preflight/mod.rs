//! Preflight: checks that a host can run workers well, each a
//! `PreflightCheck` with a verdict (pass, warn, fail), what was found and, when
//! not pass, the fix in words.
//!
//! The agent runs them at start (sent with `Register`) and again for every
//! `Assignment`: any failing check then refuses the assignment.
//! `gpuctl doctor` runs the same checks locally, without a coordinator.
//!
//! Reading (`Preflight::snapshot`: files under the `HostRoot`, NVML, the
//! libraries) is kept apart from judging (`checks::evaluate`, pure), so that
//! every verdict is tested on hand-made hosts.

pub mod checks;
pub mod gpu;
pub mod libs;

pub use checks::evaluate;
pub use gpu::{GpuPair, GpuProcess, GpuState};
pub use libs::TorchInfo;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use gpuctl_proto::pb::{GpuInfo, HostFacts, PreflightCheck, Verdict};
use nvml_wrapper::Nvml;

use crate::facts::{self, HostRoot, IbPort};
use crate::gpus::GpuInventory;
use crate::libtorch::{self, Libtorch};

/// The NCCL the workers would load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NcclState {
    NotFound,
    Loaded { path: String, version: String },
    Broken { path: String, error: String },
}

/// Everything the checks judge.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub node: String,
    /// `ok`, or why NVML is not used.
    pub nvml_status: String,
    pub driver_version: String,
    pub cuda_driver_version: String,
    /// `/proc/driver/nvidia/version` exists: the kernel driver is loaded.
    pub driver_loaded: bool,
    pub gpus: Vec<GpuState>,
    pub pairs: Vec<GpuPair>,
    pub cpu_ranks: u32,
    pub torch: Result<TorchInfo, String>,
    pub nccl: NcclState,
    /// Size of `/dev/shm`; 0 when missing.
    pub shm_bytes: u64,
    /// RLIMIT_MEMLOCK; `u64::MAX` = unlimited.
    pub memlock_bytes: u64,
    pub ib_ports: Vec<IbPort>,
    pub peermem: bool,
}

impl Snapshot {
    /// A host with nothing: no GPU, no libraries, no InfiniBand (tests start
    /// from this and change what they check).
    pub fn empty(node: &str) -> Snapshot {
        Snapshot {
            node: node.to_string(),
            nvml_status: "unavailable".into(),
            driver_version: String::new(),
            cuda_driver_version: String::new(),
            driver_loaded: false,
            gpus: Vec::new(),
            pairs: Vec::new(),
            cpu_ranks: 1,
            torch: Err("not found".into()),
            nccl: NcclState::NotFound,
            shm_bytes: 0,
            memlock_bytes: u64::MAX,
            ib_ports: Vec::new(),
            peermem: false,
        }
    }

    /// Writes what preflight learnt into the host facts (the rest of the new
    /// fields come from `facts::gather`).
    pub fn apply_to_facts(&self, f: &mut HostFacts) {
        f.nccl_version = match &self.nccl {
            NcclState::Loaded { version, .. } => version.clone(),
            _ => String::new(),
        };
        f.torch_version = self
            .torch
            .as_ref()
            .ok()
            .and_then(|t| t.version.clone())
            .unwrap_or_default();
        f.memlock_bytes = self.memlock_bytes;
        f.nvidia_peermem = self.peermem;
        if f.shm_bytes == 0 {
            f.shm_bytes = self.shm_bytes;
        }
    }
}

/// The inputs that do not change while the agent runs, and a cache of the
/// NCCL version (loading NCCL once is enough).
pub struct Preflight {
    pub node: String,
    pub root: HostRoot,
    pub libtorch: Result<Libtorch, String>,
    pub nvml: Option<Arc<Nvml>>,
    pub gpus: Vec<GpuInfo>,
    pub nvml_status: String,
    pub driver_version: String,
    pub cuda_driver_version: String,
    pub cpu_ranks: u32,
    nccl_cache: Mutex<HashMap<PathBuf, Result<String, String>>>,
}

impl std::fmt::Debug for Preflight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Preflight")
            .field("node", &self.node)
            .field("root", &self.root)
            .field("libtorch", &self.libtorch)
            .field("gpus", &self.gpus.len())
            .field("nvml_status", &self.nvml_status)
            .finish()
    }
}

impl Preflight {
    pub fn new(
        node: impl Into<String>,
        root: HostRoot,
        libtorch: Result<Libtorch, String>,
        inventory: &GpuInventory,
        cpu_ranks: u32,
    ) -> Preflight {
        Preflight {
            node: node.into(),
            root,
            libtorch,
            nvml: inventory.nvml.clone(),
            gpus: inventory.gpus.clone(),
            nvml_status: inventory.status.clone(),
            driver_version: inventory.driver_version.clone(),
            cuda_driver_version: inventory.cuda_driver_version.clone(),
            cpu_ranks,
            nccl_cache: Mutex::new(HashMap::new()),
        }
    }

    /// Reads the host now. `own_pids`: this agent's workers, whose GPU
    /// memory is not "another process". Blocking (files, NVML, dlopen).
    pub fn snapshot(&self, own_pids: &BTreeSet<u32>) -> Snapshot {
        let (gpus, pairs) = match &self.nvml {
            Some(nvml) if !self.gpus.is_empty() => {
                gpu::read_gpus(nvml, &self.gpus, own_pids, &self.root)
            }
            _ => (Vec::new(), Vec::new()),
        };
        Snapshot {
            node: self.node.clone(),
            nvml_status: self.nvml_status.clone(),
            driver_version: self.driver_version.clone(),
            cuda_driver_version: self.cuda_driver_version.clone(),
            driver_loaded: self.root.exists("proc/driver/nvidia/version"),
            gpus,
            pairs,
            cpu_ranks: self.cpu_ranks,
            torch: self
                .libtorch
                .as_ref()
                .map(libs::torch_info)
                .map_err(Clone::clone),
            nccl: self.nccl(),
            shm_bytes: facts::fs_size(&self.root.path("dev/shm")).unwrap_or(0),
            memlock_bytes: facts::memlock_limit(),
            ib_ports: facts::ib_ports(&self.root),
            peermem: facts::nvidia_peermem_loaded(&self.root),
        }
    }

    /// Snapshot and verdicts.
    pub fn run(&self, own_pids: &BTreeSet<u32>) -> (Snapshot, Vec<PreflightCheck>) {
        let s = self.snapshot(own_pids);
        let checks = evaluate(&s);
        (s, checks)
    }

    fn nccl(&self) -> NcclState {
        let Ok(lt) = &self.libtorch else {
            return NcclState::NotFound;
        };
        let Some(path) = libs::nccl_candidates(lt).into_iter().next() else {
            return NcclState::NotFound;
        };
        let result = self
            .nccl_cache
            .lock()
            .unwrap()
            .entry(path.clone())
            .or_insert_with(|| libs::nccl_version(&path))
            .clone();
        let shown = path.display().to_string();
        match result {
            Ok(version) => NcclState::Loaded {
                path: shown,
                version,
            },
            Err(error) => NcclState::Broken { path: shown, error },
        }
    }
}

pub fn verdict_of(c: &PreflightCheck) -> Verdict {
    Verdict::try_from(c.verdict).unwrap_or(Verdict::Unspecified)
}

/// `pass`, `warn`, `fail`.
pub fn verdict_word(v: Verdict) -> &'static str {
    match v {
        Verdict::Pass => "pass",
        Verdict::Warn => "warn",
        Verdict::Fail => "fail",
        Verdict::Incomplete => "incomplete",
        Verdict::Unspecified => "unknown",
    }
}

/// The refusal text for an assignment, or `None` when no check fails:
/// `node N: preflight failed: libtorch: ... (fix: ...); driver: ...`.
pub fn failures(node: &str, checks: &[PreflightCheck]) -> Option<String> {
    let failed: Vec<String> = checks
        .iter()
        .filter(|c| verdict_of(c) == Verdict::Fail)
        .map(|c| {
            if c.fix.is_empty() {
                format!("{}: {}", c.name, c.detail)
            } else {
                format!("{}: {} (fix: {})", c.name, c.detail, c.fix)
            }
        })
        .collect();
    (!failed.is_empty()).then(|| format!("node {node}: preflight failed: {}", failed.join("; ")))
}

/// Under `--exclusive` a job must have its GPUs to itself: another process
/// holding GPU memory fails the node instead of warning.
pub fn exclusive(checks: &mut [PreflightCheck]) {
    for c in checks
        .iter_mut()
        .filter(|c| c.name == checks::GPU_PROCESSES && verdict_of(c) == Verdict::Warn)
    {
        c.verdict = Verdict::Fail as i32;
        c.detail.push_str(" (the job asked for --exclusive GPUs)");
    }
}

/// Logs every check once (pass at debug, warn at warn, fail at error), then
/// a one-line count.
pub fn log_checks(checks: &[PreflightCheck]) {
    let mut counts = [0usize; 3];
    for c in checks {
        match verdict_of(c) {
            Verdict::Fail => {
                counts[2] += 1;
                tracing::error!(check = %c.name, fix = %c.fix, "preflight FAIL: {}", c.detail)
            }
            Verdict::Warn => {
                counts[1] += 1;
                tracing::warn!(check = %c.name, fix = %c.fix, "preflight warn: {}", c.detail)
            }
            _ => {
                counts[0] += 1;
                tracing::debug!(check = %c.name, "preflight pass: {}", c.detail)
            }
        }
    }
    tracing::info!(
        "preflight: {} pass, {} warn, {} fail",
        counts[0],
        counts[1],
        counts[2]
    );
}

/// A local run, as `gpuctl doctor` does it: the host's facts (with the
/// preflight fields filled), its GPUs and the checks.
pub struct LocalRun {
    pub facts: HostFacts,
    pub gpus: Vec<GpuInfo>,
    pub checks: Vec<PreflightCheck>,
}

/// Runs preflight on this machine without a coordinator. `libtorch`: the
/// folder to use (`--libtorch`), else the default install folder.
pub fn run_local(host_root: &Path, libtorch_dir: Option<&Path>, cpu_ranks: u32) -> LocalRun {
    let root = HostRoot::new(host_root);
    let mut facts = facts::gather(&root);
    let inventory = crate::gpus::probe();
    facts.nvml_status = inventory.status.clone();
    facts.driver_version = inventory.driver_version.clone();
    facts.cuda_driver_version = inventory.cuda_driver_version.clone();
    facts.cpu_ranks = cpu_ranks;
    let torch = libtorch::find(libtorch_dir);
    facts.libtorch = match &torch {
        Ok(t) => t.describe(),
        Err(e) => e.clone(),
    };
    let node = facts.hostname.clone();
    let pf = Preflight::new(node, root, torch, &inventory, cpu_ranks);
    let (snapshot, checks) = pf.run(&BTreeSet::new());
    snapshot.apply_to_facts(&mut facts);
    LocalRun {
        facts,
        gpus: inventory.gpus,
        checks,
    }
}

#[cfg(test)]
mod tests;

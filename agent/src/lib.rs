//! gpuctl-agent: runs on every host of the fleet. It reads the host's facts
//! and GPUs, registers with the coordinator, holds a session with it, and runs
//! one `gpuctl-worker` process per rank it is assigned.
//!
//! - `facts`: host facts from `/proc`, `/sys`, `/etc` (under a root tests can move)
//! - `gpus`: the GPUs through NVML (absent NVML → CPU ranks)
//! - `libtorch`: finding libtorch and the workers' `LD_LIBRARY_PATH`
//! - `workers`: spawning, supervising and killing worker processes
//! - `session`: register, heartbeats, assignments, reconnecting
//! - `relay`: the workers' calls to the coordinator, over the agent's connection
//! - `traces`: pieces of profiled ranks' Chrome traces, for `gpuctl profile --trace`
//! - `telemetry`: NVML samples per GPU (and XID events) for jobs and `/metrics`
//! - `metrics`: the HTTP `/metrics` endpoint (Prometheus text, dcgm-exporter names)
//! - `preflight`: host checks at start and before every assignment (`gpuctl doctor`)

pub mod facts;
pub mod gpus;
pub mod libtorch;
pub mod metrics;
pub mod preflight;
pub mod relay;
pub mod session;
pub mod telemetry;
pub mod traces;
pub mod workers;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use gpuctl_core::shutdown::Shutdown;

/// Everything the command line decides.
#[derive(Debug, Clone)]
pub struct Config {
    /// `http://host:port` of the coordinator, or of each of a leader and its
    /// standbys (the one that leads is used).
    pub coordinator: Vec<String>,
    /// Node name; the host name when `None`.
    pub name: Option<String>,
    /// Ranks offered when there is no GPU.
    pub cpu_ranks: u32,
    /// `--libtorch` / `GPUCTL_LIBTORCH`.
    pub libtorch: Option<PathBuf>,
    pub worker_bin: PathBuf,
    /// Default: `default_work_dir(name)`.
    pub work_dir: Option<PathBuf>,
    pub labels: BTreeMap<String, String>,
    pub heartbeat_interval: Duration,
    /// Where the host's `/proc`, `/sys`, `/etc` and `/dev/shm` are (`/`).
    pub host_root: PathBuf,
    /// Offer CPU ranks even where NVML finds GPUs.
    pub no_gpu: bool,
    /// `--gpus`: NVML indices or UUIDs to offer; empty = all.
    pub gpus: Vec<String>,
    /// Time between telemetry samples.
    pub sample_interval: Duration,
    /// Address of the `/metrics` endpoint; `None` disables it.
    pub metrics_listen: Option<String>,
    /// `/metrics` over TLS (`--metrics-tls`).
    pub metrics_tls: Option<gpuctl_core::metrics_tls::TlsConfig>,
    /// How long workers keep running while the coordinator is away
    /// (`--coordinator-grace`); zero kills them as soon as it is lost.
    pub coordinator_grace: Duration,
    /// `--prestart-workers`: keep a started, idle worker per free slot.
    pub prestart_workers: bool,
    /// `--worker-connections`: through the agent's relay, or each its own.
    pub worker_connections: relay::WorkerConnections,
}

/// `$XDG_STATE_HOME/gpuctl/agent-NAME`, else `~/.local/state/gpuctl/agent-NAME`,
/// else a folder under the temp dir. Per agent, so that several agents on one
/// host (tests, `gpuctl local up`) never share job folders.
pub fn default_work_dir(name: &str) -> PathBuf {
    let leaf = format!("agent-{name}");
    if let Some(x) = std::env::var_os("XDG_STATE_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("gpuctl").join(leaf);
    }
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h).join(".local/state/gpuctl").join(leaf);
    }
    std::env::temp_dir().join(format!("gpuctl-{leaf}"))
}

/// Runs the agent until `shutdown` trips; on return no worker is left.
pub async fn run(cfg: Config, shutdown: Shutdown) -> anyhow::Result<()> {
    let root = facts::HostRoot::new(&cfg.host_root);
    let mut host = facts::gather(&root);
    let name = cfg.name.clone().unwrap_or_else(|| host.hostname.clone());

    let inventory = if cfg.no_gpu {
        gpus::GpuInventory::none("not used: --no-gpu")
    } else {
        let mut inv = gpus::probe();
        if !cfg.gpus.is_empty() {
            inv.gpus.retain(|g| {
                cfg.gpus
                    .iter()
                    .any(|w| *w == g.index.to_string() || *w == g.uuid)
            });
            tracing::info!("offering only GPUs {:?} (--gpus)", cfg.gpus);
        }
        inv
    };
    if inventory.gpus.is_empty() {
        // Said once, here: a CPU host is a normal case, not an error.
        tracing::warn!(
            "NVML not available ({}): offering {} CPU ranks",
            inventory.status,
            cfg.cpu_ranks
        );
    }
    host.nvml_status = inventory.status.clone();
    host.driver_version = inventory.driver_version.clone();
    host.cuda_driver_version = inventory.cuda_driver_version.clone();
    host.cpu_ranks = cfg.cpu_ranks;
    host.labels = cfg.labels.clone().into_iter().collect();

    let work_dir = cfg
        .work_dir
        .clone()
        .unwrap_or_else(|| default_work_dir(&name));
    std::fs::create_dir_all(&work_dir).map_err(|e| {
        anyhow::anyhow!(
            "cannot create the work dir {}: {e}; pass --work-dir DIR",
            work_dir.display()
        )
    })?;

    let torch = libtorch::find(cfg.libtorch.as_deref());
    host.libtorch = match &torch {
        Ok(t) => t.describe(),
        Err(e) => e.clone(),
    };
    if let Err(e) = &torch {
        tracing::warn!("libtorch {e}; workers get the agent's own LD_LIBRARY_PATH");
    }
    if let Ok(t) = &torch {
        if !inventory.gpus.is_empty() && t.nccl().is_none() {
            tracing::warn!(
                "no PyTorch NCCL in {}/nvidia/nccl/lib: GPU workers may load a different NCCL than libtorch_cuda (pip install nvidia-nccl-cu13 there, or pass --libtorch with a full torch install)",
                t.describe()
            );
        }
    }
    let ld_library_path = match libtorch::ld_library_path(
        torch.as_ref().ok(),
        &work_dir.join("nccl-shim"),
        std::env::var_os("LD_LIBRARY_PATH").as_deref(),
    ) {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::warn!(
                "cannot build the workers' LD_LIBRARY_PATH ({e}); they get the agent's own"
            );
            None
        }
    };
    check_worker_bin(&cfg.worker_bin);

    for g in &inventory.gpus {
        tracing::info!(
            "GPU {}: {} {} {} memory, PCI {} (max gen {} x{}), {} NVLinks, compute {} with {} SMs",
            g.index,
            g.name,
            g.uuid,
            gpuctl_core::units::format_bytes(g.memory_total_bytes),
            g.pci_bus_id,
            g.pcie_gen_max,
            g.pcie_width_max,
            g.nvlinks_active,
            g.compute_capability,
            g.sm_count
        );
    }
    let gpu_list = inventory
        .gpus
        .iter()
        .map(|g| format!("{}:{}", g.index, g.name))
        .collect::<Vec<_>>()
        .join(", ");
    tracing::info!(
        node = %name,
        gpus = inventory.gpus.len(),
        cpu_ranks = if inventory.gpus.is_empty() { cfg.cpu_ranks } else { 0 },
        libtorch = %host.libtorch,
        worker = %cfg.worker_bin.display(),
        work_dir = %work_dir.display(),
        "gpuctl-agent {} starting{}",
        env!("CARGO_PKG_VERSION"),
        if gpu_list.is_empty() { String::new() } else { format!(" with GPUs {gpu_list}") }
    );

    let settings = workers::WorkerSettings {
        node: name.clone(),
        worker_bin: cfg.worker_bin.clone(),
        work_dir,
        ld_library_path,
        gpu_uuids: inventory
            .gpus
            .iter()
            .map(|g| (g.index, g.uuid.clone()))
            .collect::<HashMap<_, _>>(),
        kill_grace: workers::KILL_GRACE,
    };
    let (workers, events) = workers::Workers::new(settings, cfg.coordinator.join(","));
    let slots = if inventory.gpus.is_empty() {
        cfg.cpu_ranks as usize
    } else {
        inventory.gpus.len()
    };
    let relay = match cfg.worker_connections {
        relay::WorkerConnections::Direct => None,
        relay::WorkerConnections::Relay => {
            let relay = relay::Relay::new(&name);
            let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
            let url = relay.clone().serve(loopback).await.map_err(|e| {
                anyhow::anyhow!(
                    "cannot open the workers' relay on 127.0.0.1: {e}; pass --worker-connections direct to let workers connect themselves"
                )
            })?;
            tracing::info!("workers reach the coordinator through {url}");
            if slots > relay::RANKS_PER_CONNECTION {
                tracing::warn!(
                    "{slots} ranks would share this agent's one connection to the coordinator, which takes {} calls at once on a connection; their calls may queue (pass --worker-connections direct for a connection per worker)",
                    relay::COORDINATOR_STREAMS
                );
            }
            workers.relay_through(url);
            Some(relay)
        }
    };
    if cfg.prestart_workers {
        workers.prestart(slots);
    }

    // Preflight at start: the verdicts go with Register, the facts they
    // read into HostFacts; the same checks run again for every assignment.
    let checker = Arc::new(preflight::Preflight::new(
        name.clone(),
        root.clone(),
        torch.clone(),
        &inventory,
        cfg.cpu_ranks,
    ));
    let start_checks = {
        let checker = checker.clone();
        let (snapshot, checks) =
            tokio::task::spawn_blocking(move || checker.run(&BTreeSet::new())).await?;
        snapshot.apply_to_facts(&mut host);
        checks
    };
    preflight::log_checks(&start_checks);
    if let Some(e) = preflight::failures(&name, &start_checks) {
        tracing::error!("{e}; assignments will be refused until this is fixed");
    }

    // Telemetry: sampled every interval (also idle, for /metrics); batches
    // go to the coordinator while jobs run on the GPUs.
    let telemetry = telemetry::Telemetry::new(
        inventory.nvml.clone(),
        inventory
            .gpus
            .iter()
            .map(|g| (g.index, g.uuid.clone(), g.name.clone()))
            .collect(),
    );
    if let (Some(nvml), false) = (&inventory.nvml, inventory.gpus.is_empty()) {
        telemetry::spawn_xid_listener(
            nvml.clone(),
            inventory.gpus.iter().map(|g| g.index).collect(),
            telemetry.xid_log(),
            shutdown.clone(),
        );
    }
    let pace = Arc::new(gpuctl_core::pace::Pace::default());
    tokio::spawn(telemetry.clone().run(
        name.clone(),
        cfg.sample_interval,
        workers.clone(),
        pace.clone(),
        shutdown.clone(),
    ));

    let connected = Arc::new(AtomicBool::new(false));
    if let Some(listen) = &cfg.metrics_listen {
        let source = Arc::new(metrics::MetricsSource {
            node: name.clone(),
            hostname: host.hostname.clone(),
            gpus: inventory.gpus.len() as u32,
            cpu_ranks: if inventory.gpus.is_empty() {
                cfg.cpu_ranks
            } else {
                0
            },
            telemetry: telemetry.clone(),
            workers: Some(workers.clone()),
            connected: connected.clone(),
        });
        let scheme = if cfg.metrics_tls.is_some() {
            "https"
        } else {
            "http"
        };
        match metrics::serve(listen, source, shutdown.clone(), cfg.metrics_tls.clone()).await {
            Ok(addr) => tracing::info!("metrics on {scheme}://{addr}/metrics"),
            // Not fatal: the agent's job is to run workers (and several
            // agents on one host would fight for one port).
            Err(e) => tracing::warn!(
                "cannot serve /metrics on {listen}: {e}; pass --metrics-listen ADDR:PORT or off"
            ),
        }
    }

    let session_cfg = session::SessionConfig {
        coordinator: cfg.coordinator.join(","),
        name,
        facts: host,
        gpus: inventory.gpus.clone(),
        heartbeat_interval: cfg.heartbeat_interval,
        pace,
        preflight: start_checks,
        checker: Some(checker),
        connected,
        coordinator_grace: cfg.coordinator_grace,
        relay,
    };
    session::run(session_cfg, workers, events, shutdown).await;
    tracing::info!("gpuctl-agent stopped");
    Ok(())
}

/// A missing worker binary is not fatal (the agent still registers and shows
/// up in `gpuctl nodes`), but the operator should hear about it at start.
fn check_worker_bin(path: &Path) {
    if !path.is_file() {
        tracing::warn!(
            "worker binary {} not found: assignments will fail until it exists (cargo build -p gpuctl-worker, or --worker-bin PATH)",
            path.display()
        );
    }
}

//! The `gpuctl-agent` binary: parses the command line, sets up logging and the
//! shutdown signal (SIGINT/SIGTERM), and runs the agent until told to stop.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

/// Runs on every GPU host: registers with the coordinator and runs one
/// gpuctl-worker per assigned rank.
#[derive(Debug, Parser)]
#[command(name = "gpuctl-agent", version)]
struct Args {
    /// Coordinator URL, or several separated by commas (a leader and its
    /// standbys with `--store etcd`): the agent registers with the one that leads.
    #[arg(
        long,
        env = "GPUCTL_COORDINATOR",
        default_value = "http://127.0.0.1:7070"
    )]
    coordinator: String,

    /// Node name, unique in the fleet (default: the host name).
    #[arg(long)]
    name: Option<String>,

    /// Ranks to offer when the host has no GPU (or NVML is absent).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    cpu_ranks: u32,

    /// libtorch: an install-libtorch.sh folder, a site-packages, a torch
    /// folder, or a libtorch folder (default: ~/.cache/gpuctl/libtorch-2.11.0).
    #[arg(long, env = "GPUCTL_LIBTORCH")]
    libtorch: Option<PathBuf>,

    /// Worker binary (default: gpuctl-worker next to this executable).
    #[arg(long)]
    worker_bin: Option<PathBuf>,

    /// Folder for job folders and the NCCL link (default:
    /// ~/.local/state/gpuctl/agent-NAME).
    #[arg(long)]
    work_dir: Option<PathBuf>,

    /// Node label key=value, used by job selectors (repeatable).
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,

    /// Time between heartbeats (e.g. 1s, 500ms).
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    heartbeat_interval: Duration,

    /// Where the host's /proc, /sys and /etc are (for an agent in a container
    /// with the host's mounted elsewhere).
    #[arg(long, env = "GPUCTL_HOST_ROOT", default_value = "/")]
    host_root: PathBuf,

    /// Ignore the GPUs NVML finds and offer --cpu-ranks CPU ranks.
    #[arg(long)]
    no_gpu: bool,

    /// Offer only these GPUs: NVML indices or UUIDs, comma-separated (default all).
    /// For keeping GPUs out of tests, or a one-GPU baseline on a bigger host.
    #[arg(long, value_delimiter = ',')]
    gpus: Vec<String>,

    /// Time between GPU telemetry samples (e.g. 1s, 500ms).
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    sample_interval: Duration,

    /// Address of the Prometheus /metrics endpoint (host:port), or `off`.
    #[arg(long, env = "GPUCTL_METRICS_LISTEN", default_value = gpuctl_agent::metrics::DEFAULT_LISTEN)]
    metrics_listen: String,

    /// CA of the coordinator's certificate (PEM), for an https:// --coordinator;
    /// handed to the workers too.
    #[arg(long, value_name = "FILE", env = gpuctl_core::client::TLS_CA_ENV)]
    tls_ca: Option<PathBuf>,

    /// This node's client certificate (PEM; its name is the node name), for a
    /// coordinator with --client-ca. `gpuctl certs init` makes one per node.
    #[arg(long, value_name = "FILE", env = gpuctl_core::client::TLS_CERT_ENV, requires = "tls_key")]
    tls_cert: Option<PathBuf>,

    /// The key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", env = gpuctl_core::client::TLS_KEY_ENV, requires = "tls_cert")]
    tls_key: Option<PathBuf>,

    /// Serve `/metrics` over TLS with --tls-cert/--tls-key (a node
    /// certificate of `gpuctl certs init`); with --tls-ca a scraper must
    /// present a certificate that CA signed.
    #[arg(long, requires = "tls_cert")]
    metrics_tls: bool,

    /// How long workers keep running while the coordinator is unreachable
    /// (e.g. 60s, 5m; 0 stops them at once): a coordinator restarted (or a
    /// standby taking over) within it adopts the running jobs.
    #[arg(long, default_value = "60s", value_parser = parse_grace)]
    coordinator_grace: Duration,

    /// Keep one worker started and idle per free GPU (or CPU rank), so that
    /// a rank starts without waiting for libtorch to load.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    prestart_workers: bool,

    /// How workers reach the coordinator: `relay` through this agent (on
    /// 127.0.0.1, over the agent's own connection: one connection per node),
    /// or `direct`, each worker its own connection.
    #[arg(long, value_enum, default_value_t)]
    worker_connections: gpuctl_agent::relay::WorkerConnections,
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(format!(
            "`{s}` is not a label; write key=value, e.g. --label rack=a7"
        )),
    }
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    gpuctl_core::units::parse_duration(s)
}

fn parse_grace(s: &str) -> Result<Duration, String> {
    if matches!(s.trim(), "0" | "0s" | "0ms") {
        return Ok(Duration::ZERO);
    }
    gpuctl_core::units::parse_duration(s)
}

/// A bare `host:port` is taken as plain HTTP, the way operators type it.
fn normalize_url(url: &str) -> String {
    if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    }
}

/// `--coordinator` as a list of URLs, each with a scheme.
fn coordinator_urls(arg: &str) -> anyhow::Result<Vec<String>> {
    let urls: Vec<String> = gpuctl_core::leader::split_urls(arg)
        .iter()
        .map(|u| normalize_url(u))
        .collect();
    if urls.is_empty() {
        anyhow::bail!("--coordinator `{arg}` names no URL; write it like http://127.0.0.1:7070");
    }
    Ok(urls)
}

fn default_worker_bin() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("gpuctl-worker")))
        .unwrap_or_else(|| PathBuf::from("gpuctl-worker"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, not for journald or files.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let labels: BTreeMap<String, String> = args.labels.into_iter().collect();
    let nonempty = |p: Option<PathBuf>| p.filter(|p| !p.as_os_str().is_empty());
    let (ca, cert, key) = (
        nonempty(args.tls_ca),
        nonempty(args.tls_cert),
        nonempty(args.tls_key),
    );
    let metrics_tls = match (&cert, &key) {
        (Some(cert), Some(key)) if args.metrics_tls => Some(
            gpuctl_core::metrics_tls::MetricsTlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: ca.clone(),
            }
            .config()
            .map_err(|e| anyhow::anyhow!("--metrics-tls: {e}"))?,
        ),
        _ => None,
    };
    gpuctl_core::client::set_tls(gpuctl_core::client::TlsFiles { ca, cert, key });
    let cfg = gpuctl_agent::Config {
        coordinator: coordinator_urls(&args.coordinator)?,
        name: args.name.filter(|n| !n.is_empty()),
        cpu_ranks: args.cpu_ranks,
        libtorch: args.libtorch.filter(|p| !p.as_os_str().is_empty()),
        worker_bin: args.worker_bin.unwrap_or_else(default_worker_bin),
        work_dir: args.work_dir,
        labels,
        heartbeat_interval: args.heartbeat_interval,
        host_root: args.host_root,
        no_gpu: args.no_gpu,
        gpus: args.gpus,
        sample_interval: args.sample_interval,
        metrics_listen: match args.metrics_listen.trim() {
            "" | "off" | "none" => None,
            l => Some(l.to_string()),
        },
        metrics_tls,
        coordinator_grace: args.coordinator_grace,
        prestart_workers: args.prestart_workers,
        worker_connections: args.worker_connections,
    };

    // The one shutdown signal: every loop watches it, and the agent kills
    // its workers before it exits.
    let shutdown = gpuctl_core::shutdown::on_signals()?;

    gpuctl_agent::run(cfg, shutdown).await
}

//! Command-line configuration of the coordinator process (docs/architecture.md,
//! "Coordinator process"). Parsed once in `main` and handed to [`crate::server::run`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

/// Where the coordinator keeps its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StoreKind {
    /// A redb file under `--data-dir`: no server to run.
    Embedded,
    /// An etcd cluster (`--etcd`), for a standby coordinator that can take over.
    Etcd,
}

#[derive(Debug, Clone, Parser)]
#[command(
    name = "gpuctl-coordinator",
    version,
    about = "gpuctl coordinator: node inventory, job planning, rendezvous, results and reports"
)]
pub struct Config {
    /// Address to serve gRPC on; port 0 picks a free port (printed on stdout).
    #[arg(long, default_value = "127.0.0.1:7070", env = "GPUCTL_LISTEN")]
    pub listen: SocketAddr,

    /// Folder for the embedded store.
    #[arg(long, default_value = "gpuctl-data", env = "GPUCTL_DATA_DIR")]
    pub data_dir: PathBuf,

    /// State store: `embedded` (redb file in --data-dir) or `etcd`.
    #[arg(long, value_enum, default_value = "embedded")]
    pub store: StoreKind,

    /// etcd endpoint, with `--store etcd`.
    #[arg(long, env = "GPUCTL_ETCD")]
    pub etcd: Option<String>,

    /// Prefix of every key in etcd, with `--store etcd`; coordinators on one
    /// prefix share the state and one leader (`{prefix}leader`).
    #[arg(long, default_value = "/gpuctl/", env = "GPUCTL_ETCD_PREFIX")]
    pub etcd_prefix: String,

    /// A node without a heartbeat for this long is lost and its job fails.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub node_timeout: Duration,

    /// After a restart (or a standby taking over), jobs that were running wait
    /// this long for their nodes' agents to come back and adopt them; a job
    /// with a node still missing then fails naming it. Longer than the agents'
    /// `--coordinator-grace` (60 s), so an agent gives up first.
    #[arg(long, default_value = "70s", value_parser = parse_duration)]
    pub adopt_grace: Duration,

    /// Fleet history: runs kept per node (`gpuctl fleet`).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub history_keep: u32,

    /// Fleet history: runs older than this are deleted.
    #[arg(long, default_value = "180d", value_parser = parse_duration)]
    pub history_max_age: Duration,

    /// Ended jobs kept in the store, newest first: each keeps its record,
    /// results, report, logs and telemetry (at 4,096 nodes × 8 GPUs ~160 MB
    /// a job). Older ones are deleted whole; their nodes' fleet history
    /// (`--history-keep`) and baselines saved from them stay.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub keep_jobs: u32,

    /// Bytes the ended jobs kept may hold in the store together (their
    /// records, results, reports, logs and telemetry; `1T`, `64GiB`, or
    /// bytes): past it the jobs that ended first are deleted whole, as
    /// past --keep-jobs, the one that ended last kept whatever its size.
    /// At 16,384 nodes × 8 GPUs a job holds ~300 MB; the embedded store's
    /// file is up to ~2.2× its data (docs/operations.md, "Store size").
    #[arg(long, value_name = "SIZE", default_value = DEFAULT_KEEP_JOBS_BYTES, value_parser = parse_keep_bytes)]
    pub keep_jobs_bytes: u64,

    /// Connections one peer address may hold at once (a host runs one
    /// agent, holding one, and a worker per GPU, one each; the CLI opens one
    /// per call). One more from an address at the cap is closed at once,
    /// with a warning. Raise it for fleets behind NAT, which share an
    /// address, and for simulated fleets on one host.
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS_PER_PEER, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub max_connections_per_peer: u32,

    /// Connections all peers together may hold at once; the last eighth go
    /// only to addresses holding fewer than 4 (an operator's CLI, an agent
    /// coming back) [default: the open-files limit less what the
    /// coordinator needs besides: limit − max(limit/16, 256), at least half].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub max_connections: Option<u32>,

    /// A new connection must finish its TLS handshake and send its HTTP/2
    /// preface within this long of its accept, or it is closed, however
    /// many bytes it sends meanwhile.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub handshake_timeout: Duration,

    /// Tell each connection to go this long after it opened (an HTTP/2
    /// GOAWAY; its calls under way, an agent's session too, end on it):
    /// clients open a new one and make again a call the GOAWAY refused.
    /// Off by default; e.g. `1h` lets a fleet spread back over
    /// coordinators behind a balancer.
    #[arg(long, value_name = "DURATION", value_parser = parse_age)]
    pub max_connection_age: Option<Duration>,

    /// With `--store etcd`: the CA of etcd's server certificate; etcd is
    /// then spoken to over TLS (give `https://` URLs).
    #[arg(long, value_name = "FILE")]
    pub etcd_ca: Option<PathBuf>,

    /// With `--store etcd`: this coordinator's client certificate for an
    /// etcd started with `--client-cert-auth`; with --etcd-key.
    #[arg(long, value_name = "FILE", requires = "etcd_key")]
    pub etcd_cert: Option<PathBuf>,

    /// The key of --etcd-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,

    /// With `--store etcd`: the etcd user (etcd's authentication); the
    /// password is read from --etcd-password-file.
    #[arg(long, value_name = "NAME", requires = "etcd_password_file")]
    pub etcd_user: Option<String>,

    /// The file holding --etcd-user's password (one line, owner-only).
    #[arg(long, value_name = "FILE", requires = "etcd_user")]
    pub etcd_password_file: Option<PathBuf>,

    /// With `--store etcd`: the file holding the key that workers' secrets
    /// derive from (hex, owner-only; made by the first coordinator when
    /// missing, then copied to every other coordinator of the prefix).
    /// Without it the key sits in etcd, where any reader of the prefix can
    /// forge results. The embedded store keeps it in `--data-dir/rank.key`.
    #[arg(long, value_name = "FILE")]
    pub rank_key_file: Option<PathBuf>,

    /// Nodes that may be registered at once; a registration under a new
    /// name past it is refused (RESOURCE_EXHAUSTED) saying so. Lost nodes
    /// count until `gpuctl nodes remove`.
    #[arg(long, default_value_t = gpuctl_core::limits::DEFAULT_MAX_NODES as u32, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_nodes: u32,

    /// Threads that read the agents' sessions and run the scheduler, apart
    /// from those that serve connections and people's calls (one per CPU,
    /// or TOKIO_WORKER_THREADS). The scheduler is one task, so more help
    /// only in reading sessions; one carried 4,096 nodes × 8 GPUs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub fleet_threads: u32,

    /// Heartbeats, and telemetry batches, the fleet's agents send a second
    /// at most: each node sends once a second up to this many nodes, less
    /// often past it (a fleet of 16,384 beats every 8 s at 2,048; never
    /// less often than a third of `--node-timeout`). Raise it on a
    /// coordinator with cores to spare for fresher telemetry.
    #[arg(long, default_value_t = 2_048, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub agent_messages_per_s: u32,

    /// Agents' registrations taken in any one second at most; those past it
    /// are refused (RESOURCE_EXHAUSTED) and the agent tries again after its
    /// jittered backoff. A fleet coming back to a new leader after a
    /// failover (16,384 nodes within seconds) is thus let in at a bounded
    /// rate instead of all at once.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(10..=1_000_000))]
    pub max_registrations_per_s: u32,

    /// URL that workers use to reach this coordinator (default: the address
    /// each agent connected to).
    #[arg(long, env = "GPUCTL_ADVERTISE_URL")]
    pub advertise_url: Option<String>,

    /// Log filter, e.g. `info` or `gpuctl_coordinator=debug` (default: RUST_LOG, else info).
    #[arg(long)]
    pub log: Option<String>,

    /// GPU health rules overriding the defaults, TOML or JSON (`.json`);
    /// format in docs/reports.md.
    #[arg(long, value_name = "FILE", env = "GPUCTL_HEALTH_RULES")]
    pub health_rules: Option<PathBuf>,

    /// Performance rules (ratios per metric, floors per GPU model) laid over
    /// the built-in ones, TOML; format in docs/reports.md.
    #[arg(long, value_name = "FILE", env = "GPUCTL_RULES")]
    pub rules: Option<PathBuf>,

    /// Address for Prometheus `/metrics`, or `off` [default: 127.0.0.1:7071; if
    /// that port is taken the coordinator logs it and runs without metrics].
    #[arg(long, value_name = "ADDR|off", value_parser = parse_metrics_listen)]
    pub metrics_listen: Option<MetricsListen>,

    /// This coordinator's TLS certificate (PEM): serve gRPC over TLS
    /// (`gpuctl certs init` makes one); with --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// CA of the agents' client certificates: an agent must then present a
    /// certificate whose name is its node name.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub client_ca: Option<PathBuf>,

    /// Serve `/metrics` over TLS with --tls-cert/--tls-key; with --client-ca
    /// a scraper must present a certificate that CA signed (Prometheus'
    /// `tls_config: {cert_file, key_file}`).
    #[arg(long, requires = "tls_cert")]
    pub metrics_tls: bool,

    /// CLI tokens, lines `ROLE TOKEN [NAME]` with ROLE `read` or `operate`;
    /// without it the JobService is open to anyone who reaches the port.
    #[arg(long, value_name = "FILE", env = "GPUCTL_TOKENS")]
    pub tokens: Option<PathBuf>,
}

/// Where `/metrics` is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsListen {
    Off,
    At(SocketAddr),
}

/// `--max-connections-per-peer`: a real host holds about one connection
/// per GPU and one more, so this leaves room for a login node's CLIs and a
/// few hosts behind one NAT address, while three flooding addresses hold
/// 3,072, not every descriptor (issue 46).
pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: u32 = 1024;

/// The default `/metrics` address: next to the gRPC port (7070), and clear
/// of the exporters' 9400s (dcgm-exporter has 9400, the agent 9401), which
/// often run on the same host. Loopback: `/metrics` is not authenticated,
/// so reaching it from elsewhere is the operator's choice
/// (`--metrics-listen 0.0.0.0:7071`).
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:7071";

fn parse_metrics_listen(text: &str) -> Result<MetricsListen, String> {
    if text.eq_ignore_ascii_case("off") {
        return Ok(MetricsListen::Off);
    }
    text.parse().map(MetricsListen::At).map_err(|_| {
        format!("`{text}` is neither HOST:PORT (e.g. 0.0.0.0:7071, 127.0.0.1:0) nor `off`")
    })
}

/// `--keep-jobs-bytes`: 32 GiB keeps ~100 jobs of a 16,384 × 8 fleet (~300
/// MB each) and the 200 of `--keep-jobs` up to ~8,000 nodes × 8 GPUs, in a
/// redb file of up to ~70 GB.
pub const DEFAULT_KEEP_JOBS_BYTES: &str = "32GiB";

/// Less than this and the job that ended last would be the only one kept
/// even of a small fleet's jobs.
const MIN_KEEP_JOBS_BYTES: u64 = 1 << 20;

fn parse_keep_bytes(text: &str) -> Result<u64, String> {
    let bytes = gpuctl_core::units::parse_bytes(text)?;
    if bytes < MIN_KEEP_JOBS_BYTES {
        return Err(format!(
            "`{text}` is under 1MiB; give the store's room for ended jobs, like 64GiB"
        ));
    }
    Ok(bytes)
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    gpuctl_core::units::parse_duration(text)
}

/// `--max-connection-age`: at least 100 ms, so that a connection carries
/// some calls before it goes.
fn parse_age(text: &str) -> Result<Duration, String> {
    let age = parse_duration(text)?;
    if age < Duration::from_millis(100) {
        return Err(format!(
            "`{text}` is under 100ms: a connection must live long enough to carry a call"
        ));
    }
    Ok(age)
}

impl Config {
    /// Config for tests and embedding: listen on a free loopback port.
    pub fn for_dir(data_dir: impl Into<PathBuf>) -> Config {
        Config {
            listen: "127.0.0.1:0".parse().expect("loopback address"),
            data_dir: data_dir.into(),
            store: StoreKind::Embedded,
            etcd: None,
            etcd_prefix: "/gpuctl/".into(),
            etcd_ca: None,
            etcd_cert: None,
            etcd_key: None,
            etcd_user: None,
            etcd_password_file: None,
            node_timeout: Duration::from_secs(15),
            adopt_grace: Duration::from_secs(70),
            history_keep: 200,
            history_max_age: Duration::from_secs(180 * 86_400),
            keep_jobs: 200,
            keep_jobs_bytes: parse_keep_bytes(DEFAULT_KEEP_JOBS_BYTES).expect("a size"),
            max_nodes: gpuctl_core::limits::DEFAULT_MAX_NODES as u32,
            rank_key_file: None,
            max_connections_per_peer: DEFAULT_MAX_CONNECTIONS_PER_PEER,
            max_connections: None,
            handshake_timeout: gpuctl_core::conn::OPENING,
            max_connection_age: None,
            fleet_threads: 1,
            agent_messages_per_s: 2_048,
            max_registrations_per_s: 1_000,
            advertise_url: None,
            log: None,
            health_rules: None,
            rules: None,
            // Tests run many coordinators at once: none takes the fixed port.
            metrics_listen: Some(MetricsListen::Off),
            tls_cert: None,
            tls_key: None,
            client_ca: None,
            metrics_tls: false,
            tokens: None,
        }
    }

    /// How long the fleet history is kept.
    pub fn retention(&self) -> crate::history::Retention {
        crate::history::Retention {
            keep: self.history_keep as usize,
            max_age: self.history_max_age,
        }
    }

    /// What the gRPC port's connections may hold (`--max-connections*`,
    /// `--handshake-timeout`), the total from the open-files limit as it is
    /// now (main raises it first).
    pub fn connection_limits(&self) -> gpuctl_core::conn::Limits {
        let total = match self.max_connections {
            Some(n) => n as usize,
            None => {
                gpuctl_core::server::max_connections_for(gpuctl_core::server::open_files_limit().0)
            }
        };
        gpuctl_core::conn::Limits {
            per_peer: self.max_connections_per_peer as usize,
            total,
            opening: self.handshake_timeout,
        }
    }

    /// How often agents should heartbeat: often enough that a few missed beats
    /// fit inside the node timeout.
    pub fn heartbeat_interval(&self) -> Duration {
        (self.node_timeout / 3).clamp(Duration::from_millis(100), Duration::from_secs(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_listen_takes_an_address_or_off() {
        let c = Config::try_parse_from(["c", "--metrics-listen", "127.0.0.1:0"]).unwrap();
        assert_eq!(
            c.metrics_listen,
            Some(MetricsListen::At("127.0.0.1:0".parse().unwrap()))
        );
        let c = Config::try_parse_from(["c", "--metrics-listen", "off"]).unwrap();
        assert_eq!(c.metrics_listen, Some(MetricsListen::Off));
        let c = Config::try_parse_from(["c"]).unwrap();
        assert_eq!(c.metrics_listen, None);
        let err = Config::try_parse_from(["c", "--metrics-listen", "9400"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("neither HOST:PORT"), "{err}");
    }

    #[test]
    fn keep_jobs_bytes_takes_a_size_and_names_itself_when_wrong() {
        let c = Config::try_parse_from(["c", "--keep-jobs-bytes", "64GiB"]).unwrap();
        assert_eq!(c.keep_jobs_bytes, 64 << 30);
        let c = Config::try_parse_from(["c"]).unwrap();
        assert_eq!(c.keep_jobs_bytes, 32 << 30);
        for (bad, why) in [
            ("lots", "not a size"),
            ("512K", "under 1MiB"),
            ("-1G", "negative"),
        ] {
            let err = Config::try_parse_from(["c".into(), format!("--keep-jobs-bytes={bad}")])
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("--keep-jobs-bytes") && err.contains(why),
                "{bad}: {err}"
            );
        }
    }
}

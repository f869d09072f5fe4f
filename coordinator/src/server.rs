//! Wires the coordinator together and serves it: opens the store (with etcd,
//! standing by until it leads while crate::standby answers on the bound
//! port), loads the scheduler, prints the `listening on` line, serves the three services
//! until the shutdown signal, then stops in order (server, scheduler, log
//! writer) so that everything acknowledged is on disk.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use gpuctl_core::server::MAX_MESSAGE_BYTES;
use gpuctl_core::shutdown::Shutdown;
use gpuctl_proto::pb::agent_service_server::AgentServiceServer;
use gpuctl_proto::pb::job_service_server::JobServiceServer;
use gpuctl_proto::pb::worker_service_server::WorkerServiceServer;
use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::config::{Config, MetricsListen, StoreKind, DEFAULT_METRICS_LISTEN};
use crate::judge::checks::health::HealthRules;
use crate::judge::checks::perf::rules::PerfRules;
use crate::logs::LogSink;
use crate::rendezvous::Rendezvous;
use crate::runtime::FleetRuntime;
use crate::scheduler::{Clock, Scheduler, SchedulerConfig};
use crate::service::auth::Security;
use crate::service::gate::{ResultGate, RESULTS_IN_FLIGHT};
use crate::service::pieces::InPieces;
use crate::service::{agent::AgentSvc, job::JobSvc, worker::WorkerSvc};
use crate::standby::{self, Standby};
use crate::store::{RedbStore, StateStore, Store};

/// How long in-flight calls (long rendezvous waits, sessions) get to end.
const DRAIN: Duration = Duration::from_secs(3);

/// The file of the embedded store inside `--data-dir`.
pub const STORE_FILE: &str = "gpuctl.redb";
/// The workers' key beside it (owner-only, hex).
pub const RANK_KEY_FILE: &str = "rank.key";

pub fn open_store(cfg: &Config) -> anyhow::Result<Arc<dyn Store>> {
    match cfg.store {
        StoreKind::Embedded => {
            std::fs::create_dir_all(&cfg.data_dir)
                .with_context(|| format!("cannot create --data-dir {}", cfg.data_dir.display()))?;
            // The store holds the key every rank secret derives from: owner
            // only, whatever the umask (a 0644 store let any local user
            // forge results).
            private(&cfg.data_dir, 0o700)?;
            let file = cfg.data_dir.join(STORE_FILE);
            let store = RedbStore::open(&file)?;
            private(&file, 0o600)?;
            Ok(Arc::new(store))
        }
        // It waits for the leader key, so `run_with` opens it (standby::open_leader).
        StoreKind::Etcd => bail!("--store etcd is opened by server::run, not open_store"),
    }
}

/// Sets `path`'s mode to `mode` (owner only) unless it is that already.
fn private(path: &std::path::Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta =
        std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    if meta.permissions().mode() & 0o777 != mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).with_context(
            || {
                format!(
                    "cannot make {} private (mode {mode:o}): the coordinator must own it",
                    path.display()
                )
            },
        )?;
    }
    Ok(())
}

/// A rules file when one is given, else the built-in rules.
fn load_rules<T: Default>(
    path: Option<&std::path::Path>,
    what: &str,
    load: impl FnOnce(&std::path::Path) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let Some(path) = path else {
        return Ok(T::default());
    };
    let rules = load(path)?;
    info!(file = %path.display(), "{what} rules loaded");
    Ok(rules)
}

/// Runs the coordinator on `--listen` until `shutdown`.
pub async fn run(cfg: Config, shutdown: Shutdown) -> anyhow::Result<()> {
    let listener = gpuctl_core::listen::bind(cfg.listen)
        .with_context(|| format!("cannot listen on {}", cfg.listen))?;
    run_on(cfg, listener, shutdown).await
}

/// Binds `--metrics-listen`. The default port may be taken (another
/// coordinator or an exporter on the host): that costs the metrics, not the
/// coordinator. An address the operator named must work.
pub async fn bind_metrics(cfg: &Config) -> anyhow::Result<Option<TcpListener>> {
    match cfg.metrics_listen {
        Some(MetricsListen::Off) => Ok(None),
        Some(MetricsListen::At(addr)) => {
            Ok(Some(TcpListener::bind(addr).await.with_context(|| {
                format!("cannot serve /metrics on --metrics-listen {addr}")
            })?))
        }
        None => match TcpListener::bind(DEFAULT_METRICS_LISTEN).await {
            Ok(l) => Ok(Some(l)),
            Err(e) => {
                warn!("no /metrics: cannot listen on {DEFAULT_METRICS_LISTEN} ({e}); pass --metrics-listen ADDR or off");
                Ok(None)
            }
        },
    }
}

/// Runs the coordinator on a bound listener (tests bind first to learn the port).
pub async fn run_on(cfg: Config, listener: TcpListener, shutdown: Shutdown) -> anyhow::Result<()> {
    let metrics = bind_metrics(&cfg).await?;
    run_with(cfg, listener, metrics, shutdown).await
}

/// Runs the coordinator on bound gRPC and (optionally) `/metrics` listeners.
pub async fn run_with(
    cfg: Config,
    listener: TcpListener,
    metrics: Option<TcpListener>,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let addr = listener.local_addr()?;
    let health_rules = load_rules(cfg.health_rules.as_deref(), "health", HealthRules::load)?;
    let perf_rules = load_rules(cfg.rules.as_deref(), "performance", PerfRules::load)?;
    let tls = Security::server_tls(&cfg)?;
    let advertise = cfg
        .advertise_url
        .clone()
        .or_else(|| (!addr.ip().is_unspecified()).then(|| format!("http://{addr}")));
    // The standby server and then the real one accept on it in turn.
    let listener = Arc::new(listener);
    // With etcd: stand by (answering UNAVAILABLE, naming the leader) until
    // this coordinator leads; `shutdown` then also trips when the
    // leadership is lost.
    let (store, shutdown, standby) = match cfg.store {
        StoreKind::Embedded => (open_store(&cfg)?, shutdown, None),
        StoreKind::Etcd => {
            let standby = Standby::serve(listener.clone(), cfg.connection_limits());
            info!(%addr, "standby: answering every call with UNAVAILABLE until this coordinator leads");
            let value = standby::leader_value(advertise.as_deref(), addr);
            let access = crate::store::etcd_access::EtcdAccess {
                ca: cfg.etcd_ca.clone(),
                cert: cfg.etcd_cert.clone(),
                key: cfg.etcd_key.clone(),
                user: cfg.etcd_user.clone(),
                password_file: cfg.etcd_password_file.clone(),
            };
            let opened = standby::open_leader(
                cfg.etcd.as_deref(),
                &cfg.etcd_prefix,
                &access,
                &value,
                &standby,
                shutdown,
            )
            .await;
            match opened? {
                Some((store, shutdown)) => {
                    standby.taking_over();
                    (store, shutdown, Some(standby))
                }
                None => return Ok(()), // stopped while standing by
            }
        }
    };
    // The workers' key lives apart from the state, owner-only: beside the
    // embedded store, or where --rank-key-file says (etcd: every
    // coordinator of the prefix is given the same file).
    let key_file = match cfg.store {
        StoreKind::Embedded => Some(cfg.data_dir.join(RANK_KEY_FILE)),
        StoreKind::Etcd => cfg.rank_key_file.clone(),
    };
    let store = match key_file {
        Some(path) => StateStore::new(store).with_key_file(path),
        None => {
            warn!("the workers' key is kept in etcd: anyone who reads the prefix can forge results; give every coordinator --rank-key-file");
            StateStore::new(store)
        }
    };
    let security = Security::load(&cfg, &store, addr).await?;
    let rdv = Rendezvous::default();
    let (logs, log_task) = LogSink::spawn(store.clone());
    let perf_rules = Arc::new(perf_rules);
    // Beside the store, never in it (crate::cert::KEY_FILE).
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let issuer = format!(
        "{} {}",
        host.trim(),
        advertise
            .clone()
            .unwrap_or_else(|| format!("http://{addr}"))
    );
    let certs = Arc::new(
        crate::cert::Authority::load(&cfg.data_dir, issuer)
            .context("the certificates' signing key")?,
    );
    let sched_cfg = SchedulerConfig {
        certs: Some(certs.clone()),
        node_timeout: cfg.node_timeout,
        adopt_grace: cfg.adopt_grace,
        heartbeat_interval: cfg.heartbeat_interval(),
        agent_messages_per_s: cfg.agent_messages_per_s,
        health_rules: Arc::new(health_rules),
        perf_rules: perf_rules.clone(),
        keep_jobs: cfg.keep_jobs as usize,
        keep_jobs_bytes: cfg.keep_jobs_bytes,
        max_nodes: cfg.max_nodes as usize,
        clock: Clock::system(),
        refusals: Default::default(),
    };
    let scheduler = Scheduler::load(sched_cfg, store.clone(), rdv.clone(), logs)
        .await
        .context("loading the stored state")?;

    let fleet = FleetRuntime::start(cfg.fleet_threads as usize).context("--fleet-threads")?;
    // `gpuctl fleet`'s answer, kept built for it and `/metrics`; the
    // scheduler folds its jobs' runs into it.
    let fleet_view = scheduler.fleet_view();
    let (sched, sched_task) = scheduler.spawn(shutdown.clone(), &fleet.handle());
    let fetches = crate::service::trace::Fetches::default();
    let agents = InPieces(
        AgentServiceServer::new(AgentSvc::new(
            sched.clone(),
            advertise,
            security.clone(),
            fleet.handle(),
            fetches.clone(),
            cfg.node_timeout,
            crate::service::admission::Registrations::new(cfg.max_registrations_per_s),
        ))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES),
    );
    let history_task = tokio::spawn(crate::history::keep_bounded(
        store.clone(),
        cfg.retention(),
        sched.clock().clone(),
        shutdown.clone(),
    ));
    let fleet_view_task = tokio::spawn(fleet_view.clone().keep(shutdown.clone()));
    let jobs = JobServiceServer::new(JobSvc::new(
        sched.clone(),
        store.clone(),
        fleet_view.clone(),
        security.clone(),
        fetches,
        certs,
    ))
    .max_decoding_message_size(MAX_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let workers = WorkerServiceServer::new(WorkerSvc::new(sched.clone(), rdv, security))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let metrics_tls = match (&cfg.tls_cert, &cfg.tls_key) {
        (Some(cert), Some(key)) if cfg.metrics_tls => Some(
            gpuctl_core::metrics_tls::MetricsTlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: cfg.client_ca.clone(),
            }
            .config()
            .map_err(|e| anyhow::anyhow!("--metrics-tls: {e}"))?,
        ),
        _ => None,
    };
    let metrics_task = match metrics {
        Some(l) => {
            let bound = l.local_addr()?;
            let scheme = if metrics_tls.is_some() {
                "https"
            } else {
                "http"
            };
            info!(addr = %bound, "serving Prometheus metrics at {scheme}://{bound}/metrics");
            Some(tokio::spawn(crate::metrics::serve(
                l,
                sched.clone(),
                fleet_view,
                shutdown.clone(),
                metrics_tls,
            )))
        }
        None => None,
    };
    drop(sched);

    let scheme = if tls.is_some() { "https" } else { "http" };
    let limits = cfg.connection_limits();
    info!(
        per_peer = limits.per_peer,
        total = limits.total,
        handshake_timeout = ?limits.opening,
        listen_queue = ?gpuctl_core::listen::queue(),
        "connection limits"
    );
    let router =
        gpuctl_core::server::with_max_age(gpuctl_core::server::builder(), cfg.max_connection_age)
            .layer(ResultGate::new(RESULTS_IN_FLIGHT))
            .add_service(agents)
            .add_service(jobs)
            .add_service(workers);
    let stop = shutdown.clone().cancelled_owned();
    // Stopped only now: it answered through the load (Standby::taking_over).
    if let Some(standby) = standby {
        standby.stop();
    }
    let mut server = match tls {
        Some(tls) => tokio::spawn(router.serve_with_incoming_shutdown(
            standby::incoming_tls(listener, shutdown.clone(), limits, tls),
            stop,
        )),
        None => tokio::spawn(router.serve_with_incoming_shutdown(
            standby::incoming(listener, shutdown.clone(), limits),
            stop,
        )),
    };

    // The one line on stdout: tests and scripts wait for it.
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on {scheme}://{addr}")?;
        out.flush()?;
    }
    info!(%addr, data_dir = %cfg.data_dir.display(), node_timeout = %humantime::format_duration(cfg.node_timeout), "coordinator serving");

    let early = tokio::select! {
        // A server that ended because of the stop request did not stop by itself.
        biased;
        _ = shutdown.cancelled() => None,
        r = &mut server => Some(r),
    };
    if let Some(r) = early {
        r.context("server task")?.context("gRPC server")?;
        bail!("the gRPC server stopped by itself");
    }
    info!("shutting down");
    if let Some(t) = metrics_task {
        let _ = t.await;
    }
    let _ = sched_task.await;
    let _ = history_task.await;
    let _ = fleet_view_task.await;
    match tokio::time::timeout(DRAIN, &mut server).await {
        Ok(r) => r.context("server task")?.context("gRPC server")?,
        Err(_) => {
            warn!("calls still open after {DRAIN:?}; closing them");
            server.abort();
        }
    }
    // The scheduler owned the log sink; the writer drains what is queued and ends.
    let _ = log_task.await;
    // Connection tasks may still hold the store; release the file regardless.
    store.close().await?;
    drop(fleet);
    info!("stopped");
    Ok(())
}

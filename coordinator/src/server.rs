//! Wires the coordinator together and serves it: opens the store, loads the
//! scheduler, binds, prints the `listening on` line, serves the three services
//! until the shutdown signal, then stops in order (server, scheduler, log
//! writer) so that everything acknowledged is on disk.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use gpuctl_proto::pb::agent_service_server::AgentServiceServer;
use gpuctl_proto::pb::job_service_server::JobServiceServer;
use gpuctl_proto::pb::worker_service_server::WorkerServiceServer;
use gpuctl_proto::server::MAX_MESSAGE_BYTES;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tracing::{info, warn};

use crate::config::{Config, StoreKind};
use crate::logs::LogSink;
use crate::rendezvous::Rendezvous;
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::service::{agent::AgentSvc, job::JobSvc, worker::WorkerSvc};
use crate::store::{RedbStore, StateStore, Store};

/// How long in-flight calls (long rendezvous waits, sessions) get to end.
const DRAIN: Duration = Duration::from_secs(3);

/// The file of the embedded store inside `--data-dir`.
pub const STORE_FILE: &str = "gpuctl.redb";

pub fn open_store(cfg: &Config) -> anyhow::Result<Arc<dyn Store>> {
    match cfg.store {
        StoreKind::Embedded => {
            std::fs::create_dir_all(&cfg.data_dir)
                .with_context(|| format!("cannot create --data-dir {}", cfg.data_dir.display()))?;
            let store = RedbStore::open(&cfg.data_dir.join(STORE_FILE))?;
            Ok(Arc::new(store))
        }
        StoreKind::Etcd => bail!(
            "--store etcd is not supported by this build yet; run with --store embedded (the default) and --data-dir DIR"
        ),
    }
}

async fn stop_requested(mut shutdown: watch::Receiver<bool>) {
    // A dropped sender also means stop.
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// Runs the coordinator on `--listen` until `shutdown` turns true.
pub async fn run(cfg: Config, shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
    let listener = TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("cannot listen on {}", cfg.listen))?;
    run_on(cfg, listener, shutdown).await
}

/// Runs the coordinator on a bound listener (tests bind first to learn the port).
pub async fn run_on(
    cfg: Config,
    listener: TcpListener,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let addr = listener.local_addr()?;
    let store = StateStore::new(open_store(&cfg)?);
    let rdv = Rendezvous::default();
    let (logs, log_task) = LogSink::spawn(store.clone());
    let sched_cfg = SchedulerConfig {
        node_timeout: cfg.node_timeout,
        heartbeat_interval: cfg.heartbeat_interval(),
    };
    let scheduler = Scheduler::load(sched_cfg, store.clone(), rdv.clone(), logs)
        .await
        .context("loading the stored state")?;

    let advertise = cfg
        .advertise_url
        .clone()
        .or_else(|| (!addr.ip().is_unspecified()).then(|| format!("http://{addr}")));

    let (sched, sched_task) = scheduler.spawn(shutdown.clone());
    let agents = AgentServiceServer::new(AgentSvc::new(sched.clone(), advertise))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let jobs = JobServiceServer::new(JobSvc::new(sched.clone(), store.clone()))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let workers = WorkerServiceServer::new(WorkerSvc::new(sched.clone(), rdv))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    drop(sched);

    let serve = gpuctl_proto::server::builder()
        .add_service(agents)
        .add_service(jobs)
        .add_service(workers)
        .serve_with_incoming_shutdown(
            TcpListenerStream::new(listener),
            stop_requested(shutdown.clone()),
        );
    let mut server = tokio::spawn(serve);

    // The one line on stdout: tests and scripts wait for it.
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on http://{addr}")?;
        out.flush()?;
    }
    info!(%addr, data_dir = %cfg.data_dir.display(), node_timeout = %humantime::format_duration(cfg.node_timeout), "coordinator serving");

    let early = tokio::select! {
        r = &mut server => Some(r),
        _ = stop_requested(shutdown.clone()) => None,
    };
    if let Some(r) = early {
        r.context("server task")?.context("gRPC server")?;
        bail!("the gRPC server stopped by itself");
    }
    info!("shutting down");
    let _ = sched_task.await;
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
    info!("stopped");
    Ok(())
}

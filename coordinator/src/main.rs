//! `gpuctl-coordinator`: flags, logging and signals; the work is in the library.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use gpuctl_coordinator::Config;
use tokio::sync::watch;
use tracing_subscriber::EnvFilter;

fn init_tracing(filter: Option<&str>) {
    let filter = match filter {
        Some(f) => EnvFilter::try_new(f).unwrap_or_else(|e| {
            eprintln!("--log `{f}` is not a log filter ({e}); using info");
            EnvFilter::new("info")
        }),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    // stdout carries only the `listening on` line; logs go to stderr.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

async fn signalled() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => tracing::info!("SIGTERM"),
                    _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT"),
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cfg = Config::parse();
    init_tracing(cfg.log.as_deref());
    let (stop, shutdown) = watch::channel(false);
    tokio::spawn(async move {
        signalled().await;
        let _ = stop.send(true);
    });
    match gpuctl_coordinator::server::run(cfg, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuctl-coordinator: {e:#}");
            ExitCode::FAILURE
        }
    }
}

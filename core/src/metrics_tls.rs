//! The connections of the `/metrics` listener, plain or behind TLS when
//! asked (`--metrics-tls`): the process's own certificate and key, and,
//! given a CA, only scrapers that present a certificate it signed
//! (Prometheus' `tls_config: {cert_file, key_file}`). The same files and
//! rules as the gRPC port, so that a fleet protected by mutual TLS does not
//! hand its node inventory and figures to whoever reaches the metrics port.
//! (Both ports' rustls configurations come from the same files: crate::server_tls.)
//!
//! The listener shares the process's descriptors with gRPC, so it has caps
//! of its own ([`LIMITS`]), and every connection must open in time
//! (crate::conn): TLS handshake, then an HTTP request whose headers come
//! within [`crate::conn::OPENING`]. Partial `GET /metrics` requests from a
//! few addresses once held every descriptor and starved gRPC (issue 46).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::TokioTimer;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_stream::StreamExt as _;

use crate::conn::{Limits, Opening, OPENING};
use crate::server::Caps;
use crate::shutdown::Shutdown;

/// What the `/metrics` listener's connections may hold: a scraper or two
/// per address (a Prometheus pair, someone's curl), and few in all, so that
/// its floods cannot take the gRPC port's descriptors.
pub const LIMITS: Limits = Limits {
    per_peer: 16,
    total: 256,
    opening: OPENING,
};

/// A metrics server's TLS, as [`MetricsTlsFiles::config`] makes it.
pub type TlsConfig = Arc<ServerConfig>;

/// Where the metrics server's TLS comes from: the same files as the gRPC
/// port's.
pub use crate::server_tls::ServerTlsFiles as MetricsTlsFiles;

impl MetricsTlsFiles {
    /// The rustls configuration of `/metrics`, or a sentence naming the
    /// file at fault.
    pub fn config(&self) -> Result<TlsConfig, String> {
        self.server_config(false, &[b"h2", b"http/1.1"])
    }
}

/// Serves `app` on `listener` until `shutdown`, over TLS when `tls` is
/// given; connections still open get `grace` to finish.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<TlsConfig>,
    shutdown: Shutdown,
    grace: Duration,
) -> std::io::Result<()> {
    let acceptor = tls.map(TlsAcceptor::from);
    let mut incoming = std::pin::pin!(crate::server::accepted(listener, LIMITS, Caps::Metrics));
    loop {
        let tcp = tokio::select! {
            c = incoming.next() => match c {
                Some(c) => c,
                None => return Ok(()),
            },
            _ = shutdown.cancelled() => return Ok(()),
        };
        // The deadline runs from the accept, through a TLS handshake, to
        // the request's first bytes.
        let deadline = tokio::time::Instant::now() + LIMITS.opening;
        let (acceptor, app, shutdown) = (acceptor.clone(), app.clone(), shutdown.clone());
        tokio::spawn(async move {
            let served = async {
                match acceptor {
                    None => {
                        serve_connection(Opening::until(tcp, deadline, LIMITS.opening), app).await
                    }
                    Some(acceptor) => {
                        let handshake = acceptor.accept(tcp);
                        let tls = match tokio::time::timeout_at(deadline, handshake).await {
                            Ok(Ok(tls)) => tls,
                            Ok(Err(e)) => {
                                tracing::debug!("metrics TLS handshake refused: {e}");
                                return;
                            }
                            Err(_) => return,
                        };
                        let tls = Opening::until(tls, deadline, LIMITS.opening);
                        serve_connection(tls, app).await
                    }
                }
            };
            tokio::select! {
                _ = served => {}
                _ = async { shutdown.cancelled().await; tokio::time::sleep(grace).await } => {}
            }
        });
    }
}

/// One connection, HTTP/1 or HTTP/2: headers must come within
/// [`OPENING`] of the start of each request (which also closes a
/// keep-alive connection idle that long), and an HTTP/2 peer that stops
/// answering pings is closed.
async fn serve_connection<I>(io: I, app: Router)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(LIMITS.opening);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(10));
    let conn = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
    if let Err(e) = conn.await {
        tracing::debug!("metrics connection: {e}");
    }
}

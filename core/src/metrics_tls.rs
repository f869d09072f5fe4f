//! `/metrics` behind TLS, when asked (`--metrics-tls`): the process's own
//! certificate and key, and, given a CA, only scrapers that present a
//! certificate it signed (Prometheus' `tls_config: {cert_file, key_file}`).
//! The same files and rules as the gRPC port, so that a fleet protected by
//! mutual TLS does not hand its node inventory and figures to whoever
//! reaches the metrics port.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::shutdown::Shutdown;

/// A handshake not done in this long is dropped: a connection that never
/// speaks must not hold a task and a descriptor.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// A metrics server's TLS, as [`MetricsTlsFiles::config`] makes it.
pub type TlsConfig = Arc<ServerConfig>;

/// Where the metrics server's TLS comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsTlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Scrapers must present a certificate this CA signed.
    pub client_ca: Option<PathBuf>,
}

fn certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{what} {}: {e}", path.display()))?
        .collect();
    let certs = certs.map_err(|e| format!("{what} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{what} {}: no PEM certificate in it",
            path.display()
        ));
    }
    Ok(certs)
}

impl MetricsTlsFiles {
    /// The rustls configuration, or a sentence naming the file at fault.
    pub fn config(&self) -> Result<TlsConfig, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = certs(&self.cert, "--tls-cert")?;
        let key = PrivateKeyDer::from_pem_file(&self.key)
            .map_err(|e| format!("--tls-key {}: {e}", self.key.display()))?;
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?;
        let builder = match &self.client_ca {
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for c in certs(ca, "the client CA")? {
                    roots
                        .add(c)
                        .map_err(|e| format!("the client CA {}: {e}", ca.display()))?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| format!("the client CA {}: {e}", ca.display()))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(chain, key)
            .map_err(|e| format!("--tls-cert/--tls-key: {e}"))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// Serves `app` over TLS on `listener` until `shutdown`; connections still
/// open get `grace` to finish.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    tls: TlsConfig,
    shutdown: Shutdown,
    grace: Duration,
) -> std::io::Result<()> {
    let acceptor = TlsAcceptor::from(tls);
    loop {
        let tcp = tokio::select! {
            r = listener.accept() => match r {
                Ok((tcp, _)) => tcp,
                // Out of descriptors or a reset before accept: the next
                // connection may do better.
                Err(e) => {
                    tracing::debug!("metrics accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => return Ok(()),
        };
        let (acceptor, app, shutdown) = (acceptor.clone(), app.clone(), shutdown.clone());
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!("metrics TLS handshake refused: {e}");
                    return;
                }
                Err(_) => return,
            };
            let builder = Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(tls), TowerToHyperService::new(app));
            tokio::select! {
                _ = conn => {}
                _ = async { shutdown.cancelled().await; tokio::time::sleep(grace).await } => {}
            }
        });
    }
}

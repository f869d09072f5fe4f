//! A server's TLS from its files: its certificate and key and, given a CA,
//! the client certificates it verifies. The gRPC port (`server`) and
//! `/metrics` (`metrics_tls`) are configured from the same files, one way.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

/// Where a server's TLS comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Clients must present a certificate this CA signed (on `/metrics`;
    /// optional at the gRPC port's handshake).
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

impl ServerTlsFiles {
    /// A server's rustls configuration offering `alpn`; with a client CA,
    /// a client certificate is `optional` or required.
    pub fn server_config(
        &self,
        optional: bool,
        alpn: &[&[u8]],
    ) -> Result<Arc<ServerConfig>, String> {
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
                let mut verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
                if optional {
                    verifier = verifier.allow_unauthenticated();
                }
                let verifier = verifier
                    .build()
                    .map_err(|e| format!("the client CA {}: {e}", ca.display()))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(chain, key)
            .map_err(|e| format!("--tls-cert/--tls-key: {e}"))?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    }
}

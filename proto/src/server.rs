//! The one place that builds a gRPC server, so every listener gets the same
//! limits, and its TLS (tonic with rustls) when it has a certificate.

use std::path::Path;
use std::time::Duration;

use tonic::transport::{Certificate, Identity, ServerTlsConfig};

/// Largest message accepted or sent; reports of big fleets run to a few MiB.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// A tonic server builder with the keepalive and timeouts every gpuctl server uses.
/// Keepalive matters: an agent's session must notice a vanished peer even when idle.
pub fn builder() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(Duration::from_secs(5)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
}

/// [`builder`], serving TLS when `tls` is given.
pub fn builder_with_tls(
    tls: Option<ServerTlsConfig>,
) -> Result<tonic::transport::Server, tonic::transport::Error> {
    match tls {
        Some(tls) => builder().tls_config(tls),
        None => Ok(builder()),
    }
}

/// The server side of TLS: this server's certificate and key, and the CA
/// whose client certificates it reads. A client certificate stays optional
/// at the handshake (the CLI and workers authenticate otherwise); the
/// services that need one check `Request::peer_certs`.
pub fn tls_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<ServerTlsConfig, String> {
    let read = |p: &Path, flag: &str| {
        std::fs::read(p).map_err(|e| format!("{flag}: cannot read {}: {e}", p.display()))
    };
    let mut config = ServerTlsConfig::new().identity(Identity::from_pem(
        read(cert, "--tls-cert")?,
        read(key, "--tls-key")?,
    ));
    if let Some(ca) = client_ca {
        config = config
            .client_ca_root(Certificate::from_pem(read(ca, "--client-ca")?))
            .client_auth_optional(true);
    }
    Ok(config)
}

/// The accepted connections of `listener`, with TCP_NODELAY set: tonic's
/// `serve_with_incoming*` takes sockets as they come and ignores the
/// builder's `tcp_nodelay`, and small unary answers must not wait for Nagle.
pub fn incoming(
    listener: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt as _;
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(|conn| {
        let conn = conn?;
        conn.set_nodelay(true)?;
        Ok(conn)
    })
}

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt as _;

    #[tokio::test]
    async fn accepted_sockets_have_nodelay() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = std::pin::pin!(super::incoming(listener));
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let accepted = incoming.next().await.unwrap().unwrap();
        assert!(accepted.nodelay().unwrap());
    }
}

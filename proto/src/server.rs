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

/// The accepted connections of `listener`, each [`ready`]: tonic's
/// `serve_with_incoming*` takes sockets as they come and ignores the
/// builder's `tcp_nodelay`.
pub fn incoming(
    listener: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt as _;
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(|conn| {
        let conn = conn?;
        ready(&conn)?;
        Ok(conn)
    })
}

/// Sets up an accepted connection: TCP_NODELAY, since small unary answers
/// must not wait for Nagle; and on loopback the cubic congestion control.
/// With BBR (the default on many hosts) a 270 KB answer on loopback
/// stalled ~50 ms midway in 2-4 % of calls, the peer waiting with nothing
/// to read, while the coordinator had answered within 15 ms; with cubic
/// none did. Other links keep the host's choice.
pub fn ready(conn: &tokio::net::TcpStream) -> std::io::Result<()> {
    conn.set_nodelay(true)?;
    if conn.peer_addr().is_ok_and(|a| a.ip().is_loopback()) {
        set_congestion(conn, "cubic");
    }
    Ok(())
}

/// Sets the socket's congestion control; a kernel without it keeps its own.
fn set_congestion(conn: &tokio::net::TcpStream, name: &str) {
    let _ = socket2::SockRef::from(conn).set_tcp_congestion(name.as_bytes());
}

/// The congestion control a socket uses.
#[cfg(test)]
fn congestion(conn: &tokio::net::TcpStream) -> String {
    let name = socket2::SockRef::from(conn).tcp_congestion().unwrap();
    // The kernel pads the name with NULs to its longest.
    let name = name.split(|b| *b == 0).next().unwrap_or(&name);
    String::from_utf8_lossy(name).into_owned()
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
        assert_eq!(super::congestion(&accepted), "cubic", "a loopback peer");
    }
}

//! The one place that builds a gRPC server, so every listener gets the same
//! limits, and its TLS (tonic with rustls) when it has a certificate.

use std::path::Path;
use std::time::Duration;

use tonic::transport::{Certificate, Identity, ServerTlsConfig};

pub use crate::conn::Conn;
use crate::conn::{PeerSlots, FIRST_BYTES};

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
/// builder's `tcp_nodelay`. Never yields an error: see [`accept`].
/// `listener` owned or shared (`Arc`, the coordinator's standby hands it on).
/// Each must send its first bytes within [`crate::conn::FIRST_BYTES`].
pub fn incoming<L>(listener: L) -> impl tokio_stream::Stream<Item = std::io::Result<Conn>>
where
    L: std::borrow::Borrow<tokio::net::TcpListener>,
{
    incoming_capped(listener, usize::MAX)
}

/// [`incoming`], each peer address holding at most `per_peer` connections:
/// one more from an address at its cap is closed at once (a warning at most
/// every 10 s says so, naming the address and the cap).
pub fn incoming_capped<L>(
    listener: L,
    per_peer: usize,
) -> impl tokio_stream::Stream<Item = std::io::Result<Conn>>
where
    L: std::borrow::Borrow<tokio::net::TcpListener>,
{
    let state = (
        listener,
        AcceptBackoff::default(),
        PeerSlots::new(per_peer),
        None,
    );
    futures::stream::unfold(
        state,
        |(listener, mut backoff, slots, mut warned)| async move {
            loop {
                let conn = accept(listener.borrow(), &mut backoff).await;
                let Ok(peer) = conn.peer_addr() else {
                    continue; // gone already
                };
                match slots.take(peer.ip()) {
                    Some(slot) => {
                        let conn = Conn::new(conn, FIRST_BYTES).with_slot(slot);
                        return Some((Ok(conn), (listener, backoff, slots, warned)));
                    }
                    None => {
                        let now = std::time::Instant::now();
                        if warned
                            .is_none_or(|t: std::time::Instant| now - t >= Duration::from_secs(10))
                        {
                            warned = Some(now);
                            tracing::warn!(
                                peer = %peer.ip(),
                                cap = slots.max(),
                                "refusing connections from {}: it holds {} already (--max-connections-per-peer)",
                                peer.ip(),
                                slots.max()
                            );
                        }
                    }
                }
            }
        },
    )
}

/// The next connection on `listener`, made [`ready`]. An accept that fails
/// for want of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) is
/// tried again after a pause that doubles from 5 ms to 1 s, with a warning
/// naming the open-files limit: tonic's own loop retried at once, at 100 %
/// of a CPU, and said so only at `trace`. Other failures (a peer gone before
/// it was taken) are tried again at once, as before.
pub async fn accept(
    listener: &tokio::net::TcpListener,
    backoff: &mut AcceptBackoff,
) -> tokio::net::TcpStream {
    loop {
        match listener.accept().await {
            Ok((conn, _)) => {
                backoff.reset();
                // A socket that cannot be set up is one peer's problem.
                if let Err(e) = ready(&conn) {
                    tracing::debug!("setting up an accepted connection: {e}");
                }
                return conn;
            }
            Err(e) => match e.raw_os_error() {
                Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => {
                    tokio::time::sleep(backoff.failed(&e)).await;
                }
                _ => tracing::debug!("accepting a connection: {e}"),
            },
        }
    }
}

/// The pause between accepts that fail for want of resources, and when the
/// last warning about them was given.
#[derive(Debug, Default)]
pub struct AcceptBackoff {
    pause: Duration,
    failed: u64,
    warned: Option<std::time::Instant>,
}

impl AcceptBackoff {
    const FIRST: Duration = Duration::from_millis(5);
    const MOST: Duration = Duration::from_secs(1);
    /// At most one warning in this long, counting the failures between.
    const WARN_EVERY: Duration = Duration::from_secs(10);

    fn reset(&mut self) {
        self.pause = Duration::ZERO;
    }

    /// Notes a failed accept; the pause before the next.
    fn failed(&mut self, e: &std::io::Error) -> Duration {
        self.failed += 1;
        self.pause = (self.pause * 2).clamp(Self::FIRST, Self::MOST);
        if self.warned.is_none_or(|t| t.elapsed() >= Self::WARN_EVERY) {
            self.warned = Some(std::time::Instant::now());
            let (soft, _) = open_files_limit();
            tracing::warn!(
                failed = self.failed,
                open_files_limit = soft,
                "cannot accept connections: {e}. Each agent holds a connection, and each worker \
                 one for its job: a fleet of N nodes × G GPUs needs about N × (G + 1) open \
                 files. Raise the limit (`ulimit -n`, systemd `LimitNOFILE=`); waiting \
                 {:?} before trying again",
                self.pause
            );
            self.failed = 0;
        }
        self.pause
    }
}

/// The process's open-files limit, soft and hard; `(0, 0)` where it cannot be read.
pub fn open_files_limit() -> (u64, u64) {
    rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap_or((0, 0))
}

/// Raises the soft open-files limit to the hard one (a server's connections
/// outgrow the usual soft 1,024 long before a fleet is large); the soft
/// limit after.
pub fn raise_open_files_limit() -> std::io::Result<u64> {
    rlimit::increase_nofile_limit(u64::MAX)
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

    #[test]
    fn the_backoff_doubles_to_a_second_and_starts_over_after_an_accept() {
        let mut b = super::AcceptBackoff::default();
        let e = std::io::Error::from_raw_os_error(libc::EMFILE);
        let pauses: Vec<u64> = (0..10).map(|_| b.failed(&e).as_millis() as u64).collect();
        assert_eq!(pauses, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.reset();
        assert_eq!(b.failed(&e).as_millis(), 5);
    }

    #[tokio::test]
    async fn a_peer_past_its_cap_is_closed_at_once() {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = std::pin::pin!(super::incoming_capped(listener, 1));
        let _first = tokio::net::TcpStream::connect(addr).await.unwrap();
        let held = incoming.next().await.unwrap().unwrap();
        let mut second = tokio::net::TcpStream::connect(addr).await.unwrap();
        // The stream takes the second, finds the address at its cap, closes it.
        let pending = tokio::time::timeout(std::time::Duration::from_millis(300), incoming.next());
        assert!(pending.await.is_err(), "nothing yielded past the cap");
        let mut b = [0u8; 1];
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), second.read(&mut b))
            .await
            .expect("closed, not left hanging");
        assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
        drop(held);
    }

    #[tokio::test]
    async fn accepted_sockets_have_nodelay() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = std::pin::pin!(super::incoming(listener));
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let accepted = incoming.next().await.unwrap().unwrap();
        assert!(accepted.tcp().nodelay().unwrap());
        assert_eq!(
            super::congestion(accepted.tcp()),
            "cubic",
            "a loopback peer"
        );
    }
}

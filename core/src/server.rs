//! The one place that builds a gRPC server, so every listener gets the same
//! limits, and its TLS (rustls, the handshake ours: see [`incoming_tls`])
//! when it has a certificate.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use tokio_stream::Stream;

pub use crate::conn::{Conn, OPENING};
use crate::conn::{Full, Limits, Opening, PeerSlots, Tcp};

/// Largest message accepted or sent; reports of big fleets run to a few MiB.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// A tonic server builder with the keepalive and timeouts every gpuctl server uses.
/// Keepalive matters: an agent's session must notice a vanished peer even when idle,
/// and a connection past its opening that stops answering pings is closed.
pub fn builder() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(Duration::from_secs(5)))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
}

/// How long a ping's answer may take before the connection is closed
/// (hyper sends a GOAWAY, `NO_ERROR`). 10 s closed the busy simulator's
/// connection at 16,384 nodes × 8 on two shared cores (issue 51); a peer
/// that is gone is still found within 25 s, and an agent's within the
/// coordinator's `--node-timeout` by its heartbeats.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// `server` telling each connection to go `age` after its accept (an
/// HTTP/2 GOAWAY): the calls under way end on it, an agent's session
/// included (it stays until it ends by itself), and clients make new calls
/// on a new connection, again those the GOAWAY refused (crate::retry). So
/// a fleet spreads back over coordinators behind a balancer, and a test
/// can make the server close connections. No grace is set: tonic's grace
/// replaces the GOAWAY with a cut at age + grace.
pub fn with_max_age(
    server: tonic::transport::Server,
    age: Option<Duration>,
) -> tonic::transport::Server {
    match age {
        Some(age) => server.max_connection_age(age),
        None => server,
    }
}

/// A gRPC server's TLS: its certificate and key, and the CA whose client
/// certificates it reads. tonic's own TLS is not used: its handshake has a
/// timeout, but the HTTP/2 preface after it had none; [`incoming_tls`] holds
/// both to one deadline.
#[derive(Clone)]
pub struct ServerTls(Arc<rustls::ServerConfig>);

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerTls")
    }
}

/// The server side of TLS: this server's certificate and key, and the CA
/// whose client certificates it reads. A client certificate stays optional
/// at the handshake (the CLI and workers authenticate otherwise); the
/// services that need one check `Request::peer_certs`.
pub fn tls_config(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<ServerTls, String> {
    let files = crate::server_tls::ServerTlsFiles {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
        client_ca: client_ca.map(Path::to_path_buf),
    };
    files.server_config(true, &[b"h2"]).map(ServerTls)
}

/// A TLS connection of a gRPC server, open in time.
pub type TlsConn = Opening<tokio_rustls::server::TlsStream<Tcp>>;

/// The accepted connections of `listener`, each [`ready`]: tonic's
/// `serve_with_incoming*` takes sockets as they come and ignores the
/// builder's `tcp_nodelay`. Never yields an error: see [`accept`].
/// `listener` owned or shared (`Arc`, the coordinator's standby hands it on).
/// Each must open within [`OPENING`] ([`crate::conn`]).
pub fn incoming<L>(listener: L) -> impl Stream<Item = std::io::Result<Conn>>
where
    L: std::borrow::Borrow<tokio::net::TcpListener>,
{
    incoming_limited(listener, Limits::unlimited())
}

/// [`incoming`] under `limits`: one more from an address at its cap, or
/// past the total, is closed at once (a warning at most every 10 s says
/// so, naming the address, the cap and the flag); each must open within
/// `limits.opening`.
pub fn incoming_limited<L>(listener: L, limits: Limits) -> impl Stream<Item = std::io::Result<Conn>>
where
    L: std::borrow::Borrow<tokio::net::TcpListener>,
{
    accepted(listener, limits, Caps::Flags).map(move |tcp| Ok(Opening::new(tcp, limits.opening)))
}

/// [`incoming_limited`] over TLS: the handshakes run side by side, and a
/// connection whose handshake and HTTP/2 preface are not done within
/// `limits.opening` of its accept is closed; one whose handshake fails is
/// closed (logged at debug). Never yields an error.
pub fn incoming_tls<L>(
    listener: L,
    limits: Limits,
    tls: ServerTls,
) -> impl Stream<Item = std::io::Result<TlsConn>>
where
    L: std::borrow::Borrow<tokio::net::TcpListener>,
{
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.0);
    accepted(listener, limits, Caps::Flags)
        .map(move |tcp| {
            // From the accept, not from when the handshake is first polled.
            let deadline = tokio::time::Instant::now() + limits.opening;
            let handshake = acceptor.accept(tcp);
            async move {
                match tokio::time::timeout_at(deadline, handshake).await {
                    Ok(Ok(tls)) => Some(Ok(Opening::until(tls, deadline, limits.opening))),
                    Ok(Err(e)) => {
                        tracing::debug!("TLS handshake refused: {e}");
                        None
                    }
                    Err(_) => {
                        tracing::debug!("TLS handshake not done in {:?}: closed", limits.opening);
                        None
                    }
                }
            }
        })
        // Every connection holds a slot, so `total` bounds these already.
        .buffer_unordered(limits.total)
        .filter_map(futures::future::ready)
}

/// Where a listener's caps come from, for its warnings to name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caps {
    /// `--max-connections-per-peer`, `--max-connections`.
    Flags,
    /// Fixed: the `/metrics` listener's (crate::metrics_tls::LIMITS).
    Metrics,
}

/// The connections of `listener` that get a slot under `limits`.
pub(crate) fn accepted<L>(listener: L, limits: Limits, caps: Caps) -> impl Stream<Item = Tcp>
where
    L: std::borrow::Borrow<tokio::net::TcpListener>,
{
    let state = (
        listener,
        AcceptBackoff::default(),
        PeerSlots::new(limits),
        Warned {
            caps,
            ..Warned::default()
        },
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
                    Ok(slot) => {
                        let tcp = Tcp::new(conn, Some(slot));
                        return Some((tcp, (listener, backoff, slots, warned)));
                    }
                    Err(full) => warned.refused(full, peer.ip(), &slots),
                }
            }
        },
    )
}

/// When the last warning about refused connections was given, per reason.
#[derive(Debug)]
struct Warned {
    caps: Caps,
    peer: Option<std::time::Instant>,
    all: Option<std::time::Instant>,
    /// Refused since the last warning.
    refused: u64,
}

impl Default for Warned {
    fn default() -> Warned {
        Warned {
            caps: Caps::Flags,
            peer: None,
            all: None,
            refused: 0,
        }
    }
}

impl Warned {
    const EVERY: Duration = Duration::from_secs(10);

    fn refused(&mut self, full: Full, ip: std::net::IpAddr, slots: &PeerSlots) {
        self.refused += 1;
        let last = match full {
            Full::Peer => &mut self.peer,
            Full::All => &mut self.all,
        };
        if last.is_some_and(|t| t.elapsed() < Self::EVERY) {
            return;
        }
        *last = Some(std::time::Instant::now());
        let refused = std::mem::take(&mut self.refused);
        if self.caps == Caps::Metrics {
            tracing::warn!(
                peer = %ip,
                refused,
                "/metrics: refusing connections from {ip}: {} are open from it and {} in all; \
                 the listener takes at most {} per address and {} in all, so that it cannot \
                 take the gRPC port's descriptors",
                slots.held_by(ip),
                slots.held(),
                slots.per_peer(),
                slots.total(),
            );
            return;
        }
        match full {
            Full::Peer => tracing::warn!(
                peer = %ip,
                cap = slots.per_peer(),
                refused,
                "refusing connections from {ip}: it holds {} already (--max-connections-per-peer)",
                slots.per_peer()
            ),
            Full::All => {
                let (soft, _) = open_files_limit();
                tracing::warn!(
                    peer = %ip,
                    held = slots.held(),
                    cap = slots.total(),
                    open_files_limit = soft,
                    refused,
                    "cannot accept connections: {} are open, the most this server takes \
                     (--max-connections; by default the open-files limit less what the process \
                     needs for itself), and the last {} go only to addresses holding fewer \
                     than {}. Each agent holds a connection, and each worker one for its job: \
                     raise the limit (`ulimit -n`, systemd `LimitNOFILE=`) or --max-connections; \
                     closing the newest",
                    slots.held(),
                    slots.reserve(),
                    crate::conn::FEW,
                )
            }
        }
    }
}

/// The default `--max-connections` under an open-files limit of `soft`:
/// all but what the process needs besides (its store and logs, etcd,
/// `/metrics` and its own connections), at least half of it. Accepting
/// past the limit fails (EMFILE) and leaves the operator's CLI waiting in
/// the listen backlog behind the flood; refused under it, the newest is
/// closed at once and the reserve (crate::conn) stays open to others.
pub fn max_connections_for(soft: u64) -> usize {
    if soft == 0 {
        return usize::MAX; // unknown: the accept backoff is all there is
    }
    let soft = usize::try_from(soft).unwrap_or(usize::MAX);
    let besides = (soft / 16).max(256);
    soft.saturating_sub(besides).max(soft / 2).max(1)
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
        let limits = crate::conn::Limits {
            per_peer: 1,
            ..crate::conn::Limits::unlimited()
        };
        let mut incoming = std::pin::pin!(super::incoming_limited(listener, limits));
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
        let tcp = accepted.get_ref().tcp();
        assert!(tcp.nodelay().unwrap());
        assert_eq!(super::congestion(tcp), "cubic", "a loopback peer");
    }
}

//! An accepted connection must open within a deadline, and the descriptors
//! it holds are shared out so that a few addresses cannot take them all.
//!
//! Opening ([`Opening`]): a peer that has not sent [`OPENED_AFTER`] bytes
//! (past its TLS handshake: the HTTP/2 preface, or the start of an HTTP
//! request) within [`OPENING`] of its accept is closed, however slowly it
//! dribbles them. Once it has, HTTP/2 keepalive (`server::builder`) or
//! hyper's header timeout (`/metrics`) find the ones that stall. A deadline
//! that only waited for a first byte let 21,000 one-byte connections hold a
//! coordinator's every descriptor (issue 46), as silent ones had (issue 35).
//!
//! Sharing ([`PeerSlots`]): one address holds at most `per_peer`
//! connections, all together at most `total`, and the last eighth of
//! `total` goes only to addresses that hold fewer than [`FEW`]: an
//! operator's CLI or a reconnecting agent still gets in while a few
//! addresses hold everything else.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// How long a new connection has to open.
pub const OPENING: Duration = Duration::from_secs(10);

/// What a peer must have sent (after TLS) for its connection to be open:
/// the HTTP/2 client preface is 24 bytes, and every HTTP/1 request a
/// scraper sends is longer. Short of it, hyper still waits (for the rest of
/// the preface, or to tell HTTP/1 from HTTP/2) with no deadline of its own.
pub const OPENED_AFTER: usize = 24;

/// An address holding fewer than this may take the reserved slots.
pub const FEW: usize = 4;

/// What the connections of one listener may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections one peer address may hold at once.
    pub per_peer: usize,
    /// Connections all peers together may hold at once.
    pub total: usize,
    /// How long a new connection has to open.
    pub opening: Duration,
}

impl Limits {
    /// No caps, the usual opening deadline: listeners that only their own
    /// processes reach (an agent's relay).
    pub fn unlimited() -> Limits {
        Limits {
            per_peer: usize::MAX,
            total: usize::MAX,
            opening: OPENING,
        }
    }
}

/// Why a connection got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// Its address holds `per_peer` already.
    Peer,
    /// All peers together hold `total`, or all but the reserve and this
    /// address holds [`FEW`] or more.
    All,
}

#[derive(Debug, Default)]
struct Live {
    by_peer: HashMap<IpAddr, usize>,
    total: usize,
}

/// Live connections per peer address and in all, with their caps.
#[derive(Debug, Clone)]
pub struct PeerSlots {
    live: Arc<Mutex<Live>>,
    per_peer: usize,
    total: usize,
}

impl PeerSlots {
    pub fn new(limits: Limits) -> PeerSlots {
        PeerSlots {
            live: Arc::default(),
            per_peer: limits.per_peer.max(1),
            total: limits.total.max(1),
        }
    }

    /// Slots kept for addresses that hold fewer than [`FEW`].
    pub fn reserve(&self) -> usize {
        self.total / 8
    }

    /// A slot for one more connection from `ip`, or why there is none.
    pub fn take(&self, ip: IpAddr) -> Result<Slot, Full> {
        let mut live = self.live.lock().expect("peer slots");
        let held = live.by_peer.get(&ip).copied().unwrap_or(0);
        if held >= self.per_peer {
            return Err(Full::Peer);
        }
        let open_to_all = self.total - self.reserve();
        if live.total >= self.total || (live.total >= open_to_all && held >= FEW) {
            return Err(Full::All);
        }
        *live.by_peer.entry(ip).or_insert(0) += 1;
        live.total += 1;
        Ok(Slot {
            slots: self.clone(),
            ip,
        })
    }

    pub fn per_peer(&self) -> usize {
        self.per_peer
    }

    pub fn total(&self) -> usize {
        self.total
    }

    /// Connections held now, in all.
    pub fn held(&self) -> usize {
        self.live.lock().expect("peer slots").total
    }

    /// Connections `ip` holds now.
    pub fn held_by(&self, ip: IpAddr) -> usize {
        let live = self.live.lock().expect("peer slots");
        live.by_peer.get(&ip).copied().unwrap_or(0)
    }
}

/// One connection's place in the counts, given back when it closes.
#[derive(Debug)]
pub struct Slot {
    slots: PeerSlots,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut live = self.slots.live.lock().expect("peer slots");
        live.total -= 1;
        if let Some(n) = live.by_peer.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                live.by_peer.remove(&self.ip);
            }
        }
    }
}

/// An accepted TCP connection holding its slot for as long as it lives.
#[derive(Debug)]
pub struct Tcp {
    io: TcpStream,
    _slot: Option<Slot>,
}

impl Tcp {
    pub fn new(io: TcpStream, slot: Option<Slot>) -> Tcp {
        Tcp { io, _slot: slot }
    }

    /// The socket itself.
    pub fn tcp(&self) -> &TcpStream {
        &self.io
    }
}

/// A plain connection of a gRPC server: TCP that must open in time.
pub type Conn = Opening<Tcp>;

/// `io` until its peer has sent [`OPENED_AFTER`] bytes: a read past the
/// deadline fails (TimedOut), which closes the connection.
#[derive(Debug)]
pub struct Opening<T> {
    io: T,
    /// Until the connection is open: when the peer's time is up.
    deadline: Option<Pin<Box<Sleep>>>,
    /// Bytes still to come before it is.
    need: usize,
    within: Duration,
}

impl<T> Opening<T> {
    /// `io`, accepted just now, with `within` to open.
    pub fn new(io: T, within: Duration) -> Opening<T> {
        Opening::until(io, Instant::now() + within, within)
    }

    /// `io` with a deadline set earlier (at the accept, before a TLS
    /// handshake); `within` is for the error's words.
    pub fn until(io: T, deadline: Instant, within: Duration) -> Opening<T> {
        Opening {
            io,
            deadline: Some(Box::pin(tokio::time::sleep_until(deadline))),
            need: OPENED_AFTER,
            within,
        }
    }

    pub fn get_ref(&self) -> &T {
        &self.io
    }

    /// Whether the peer has sent what opens the connection.
    pub fn is_open(&self) -> bool {
        self.deadline.is_none()
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Opening<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = read {
            let got = buf.filled().len() - before;
            self.need = self.need.saturating_sub(got);
            if self.need == 0 {
                self.deadline = None;
            }
        }
        // Checked on every read, not only when the peer is quiet: one that
        // keeps sending a byte at a time is as closed as a silent one.
        if let Some(d) = self.deadline.as_mut() {
            // Polled here, the timer also wakes this task at the deadline.
            if d.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the peer did not open the connection (a TLS handshake, then an \
                         HTTP/2 preface or an HTTP request) within {:?}: closed",
                        self.within
                    ),
                )));
            }
        }
        read
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Opening<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<T: Connected> Connected for Opening<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> T::ConnectInfo {
        self.io.connect_info()
    }
}

impl AsyncRead for Tcp {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tcp {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl Connected for Tcp {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn pair(within: Duration) -> (Conn, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (io, _) = listener.accept().await.unwrap();
        (Opening::new(Tcp::new(io, None), within), client)
    }

    fn limits(per_peer: usize, total: usize) -> Limits {
        Limits {
            per_peer,
            total,
            opening: OPENING,
        }
    }

    #[test]
    fn a_peer_holds_at_most_its_slots_until_one_is_given_back() {
        let slots = PeerSlots::new(limits(2, 100));
        let ip: IpAddr = "10.0.0.7".parse().unwrap();
        let a = slots.take(ip).unwrap();
        let _b = slots.take(ip).unwrap();
        assert_eq!(slots.take(ip).unwrap_err(), Full::Peer, "a third");
        assert!(slots.take("10.0.0.8".parse().unwrap()).is_ok(), "another");
        drop(a);
        assert!(slots.take(ip).is_ok(), "a slot given back is taken again");
    }

    #[test]
    fn the_last_eighth_goes_to_addresses_that_hold_few() {
        let slots = PeerSlots::new(limits(100, 80));
        let flood: IpAddr = "10.0.0.7".parse().unwrap();
        let held: Vec<Slot> = std::iter::from_fn(|| slots.take(flood).ok()).collect();
        assert_eq!(held.len(), 80 - 10, "all but the reserve");
        let cli: IpAddr = "10.0.0.9".parse().unwrap();
        let cli_held: Vec<Slot> = std::iter::from_fn(|| slots.take(cli).ok()).collect();
        assert_eq!(
            cli_held.len(),
            FEW,
            "an address with few takes from the reserve"
        );
        let others: Vec<Slot> = (1..=6u8)
            .filter_map(|i| slots.take(IpAddr::from([10, 0, 1, i])).ok())
            .collect();
        assert_eq!(others.len(), 6, "the reserve is 10");
        assert_eq!(
            slots.take(IpAddr::from([10, 0, 2, 1])).unwrap_err(),
            Full::All
        );
        assert_eq!(slots.held(), 80);
        drop((held, cli_held, others));
        assert_eq!(slots.held(), 0);
    }

    #[tokio::test]
    async fn a_silent_peer_is_closed_and_one_that_opens_is_not() {
        let (mut silent, _client) = pair(Duration::from_millis(200)).await;
        let mut b = [0u8; 64];
        let t0 = std::time::Instant::now();
        let e = silent.read(&mut b).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(t0.elapsed() >= Duration::from_millis(190));

        let (mut talking, mut client) = pair(Duration::from_millis(200)).await;
        client.write_all(&[b'x'; OPENED_AFTER]).await.unwrap();
        let mut got = 0;
        while got < OPENED_AFTER {
            got += talking.read(&mut b).await.unwrap();
        }
        assert!(talking.is_open());
        // Open, it may then be quiet past the deadline.
        let quiet = tokio::time::timeout(Duration::from_millis(400), talking.read(&mut b)).await;
        assert!(quiet.is_err(), "still open, waiting: {quiet:?}");
    }

    #[tokio::test]
    async fn a_peer_that_dribbles_is_closed_at_the_deadline() {
        let (mut slow, mut client) = pair(Duration::from_millis(300)).await;
        let dribble = tokio::spawn(async move {
            for _ in 0..OPENED_AFTER - 1 {
                if client.write_all(b"P").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
        let mut b = [0u8; 64];
        let t0 = std::time::Instant::now();
        let e = loop {
            match slow.read(&mut b).await {
                Ok(n) => assert!(n > 0, "the peer holds on"),
                Err(e) => break e,
            }
        };
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        dribble.abort();
    }
}

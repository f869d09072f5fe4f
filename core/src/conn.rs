//! An accepted connection that must speak first: a peer that sends no byte
//! (no TLS ClientHello, no HTTP/2 preface) within [`FIRST_BYTES`] of its
//! accept is closed, and one address holds at most so many ([`PeerSlots`]). About 20,000 connections that sent nothing once held
//! every descriptor of a coordinator, and `gpuctl nodes` timed out until they
//! went (issue 35). Once a peer has spoken, HTTP/2 keepalive (`server::builder`)
//! finds the ones that vanish.

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
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// How long a new connection may stay silent.
pub const FIRST_BYTES: Duration = Duration::from_secs(10);

/// Live connections per peer address, and how many one address may hold: a
/// peer that speaks and then idles still holds a descriptor per connection.
#[derive(Debug, Clone)]
pub struct PeerSlots {
    live: Arc<Mutex<HashMap<IpAddr, usize>>>,
    max: usize,
}

impl PeerSlots {
    pub fn new(max: usize) -> PeerSlots {
        PeerSlots {
            live: Arc::default(),
            max: max.max(1),
        }
    }

    /// A slot for one more connection from `ip`, or `None` when it holds
    /// `max` already.
    pub fn take(&self, ip: IpAddr) -> Option<Slot> {
        let mut live = self.live.lock().expect("peer slots");
        let n = live.entry(ip).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(Slot {
            slots: self.clone(),
            ip,
        })
    }

    pub fn max(&self) -> usize {
        self.max
    }
}

/// One connection's place in its peer's count, given back when it closes.
#[derive(Debug)]
pub struct Slot {
    slots: PeerSlots,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut live = self.slots.live.lock().expect("peer slots");
        if let Some(n) = live.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                live.remove(&self.ip);
            }
        }
    }
}

/// A TCP connection whose first bytes must come within a deadline.
#[derive(Debug)]
pub struct Conn {
    io: TcpStream,
    /// Until the first byte: when the peer's time is up.
    deadline: Option<Pin<Box<Sleep>>>,
    _slot: Option<Slot>,
}

impl Conn {
    pub fn new(io: TcpStream, first_bytes: Duration) -> Conn {
        Conn {
            io,
            deadline: Some(Box::pin(tokio::time::sleep(first_bytes))),
            _slot: None,
        }
    }

    /// Holds `slot` for as long as the connection lives.
    pub fn with_slot(mut self, slot: Slot) -> Conn {
        self._slot = Some(slot);
        self
    }

    /// The socket itself.
    pub fn tcp(&self) -> &TcpStream {
        &self.io
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.io).poll_read(cx, buf);
        match &read {
            Poll::Ready(Ok(())) if buf.filled().len() > before => self.deadline = None,
            Poll::Pending => {
                if let Some(d) = self.deadline.as_mut() {
                    // Polled here, the timer wakes this task at the deadline.
                    if d.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("the peer sent nothing in {FIRST_BYTES:?}: closed"),
                        )));
                    }
                }
            }
            _ => {}
        }
        read
    }
}

impl AsyncWrite for Conn {
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

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn pair(first_bytes: Duration) -> (Conn, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (io, _) = listener.accept().await.unwrap();
        (Conn::new(io, first_bytes), client)
    }

    #[test]
    fn a_peer_holds_at_most_its_slots_until_one_is_given_back() {
        let slots = PeerSlots::new(2);
        let ip: IpAddr = "10.0.0.7".parse().unwrap();
        let a = slots.take(ip).unwrap();
        let _b = slots.take(ip).unwrap();
        assert!(slots.take(ip).is_none(), "a third from the same address");
        assert!(
            slots.take("10.0.0.8".parse().unwrap()).is_some(),
            "another address"
        );
        drop(a);
        assert!(slots.take(ip).is_some(), "a slot given back is taken again");
    }

    #[tokio::test]
    async fn a_silent_peer_is_closed_and_one_that_speaks_is_not() {
        let (mut silent, _client) = pair(Duration::from_millis(200)).await;
        let mut b = [0u8; 8];
        let t0 = std::time::Instant::now();
        let e = silent.read(&mut b).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(t0.elapsed() >= Duration::from_millis(190));

        let (mut talking, mut client) = pair(Duration::from_millis(200)).await;
        client.write_all(b"hi").await.unwrap();
        assert_eq!(talking.read(&mut b).await.unwrap(), 2);
        // Spoken once, it may then be quiet past the deadline.
        let quiet = tokio::time::timeout(Duration::from_millis(400), talking.read(&mut b)).await;
        assert!(quiet.is_err(), "still open, waiting: {quiet:?}");
    }
}

//! A server's listening socket, with a listen queue sized for a fleet that
//! reconnects at once. tokio's `TcpListener::bind` asks for 1,024 pending
//! connections; after a coordinator failover, 16,384 agents opening their
//! connections within a few seconds overflowed it, and Linux dropped their
//! handshakes (`ListenOverflows` in `nstat`): each dropped agent waited out
//! SYN retransmits and its own backoff, and the fleet took 87 s to come
//! back where the new leader could take it in a fraction of that (issue 51).

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpSocket};

/// What the listen queue asks for; the kernel gives at most
/// `net.core.somaxconn` ([`queue`]).
pub const ASKED: u32 = 65_535;

const SOMAXCONN: &str = "/proc/sys/net/core/somaxconn";

/// Binds `addr` with a listen queue of [`ASKED`] (as the kernel caps it).
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // As tokio's bind does: a restarted server takes its port back at once.
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(ASKED)
}

/// The listen queue a socket bound by [`bind`] has: [`ASKED`], capped by
/// `net.core.somaxconn`; `None` where that cannot be read.
pub fn queue() -> Option<u32> {
    let text = std::fs::read_to_string(SOMAXCONN).ok()?;
    queue_under(text.trim().parse().ok()?)
}

fn queue_under(somaxconn: i64) -> Option<u32> {
    (somaxconn > 0).then(|| (somaxconn as u64).min(ASKED as u64) as u32)
}

/// What to tell an operator whose fleet of `nodes` may open more
/// connections at once than the listen queue holds: `None` when it holds
/// them, or when the queue cannot be read.
pub fn too_short_for(nodes: usize, queue: Option<u32>) -> Option<String> {
    let q = queue?;
    (nodes > q as usize).then(|| {
        format!(
            "the listen queue holds {q} connections (net.core.somaxconn) and the fleet has \
             {nodes} nodes: agents reconnecting together (after a failover or a restart) \
             overflow it, and Linux drops their handshakes for seconds. Raise it on this \
             host: sysctl -w net.core.somaxconn={}",
            (nodes.next_power_of_two()).min(ASKED as usize)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_caps_what_is_asked() {
        assert_eq!(queue_under(4096), Some(4096));
        assert_eq!(queue_under(1 << 20), Some(ASKED));
        assert_eq!(queue_under(0), None);
        assert_eq!(queue_under(-1), None);
    }

    #[test]
    fn a_fleet_past_the_queue_is_told_the_setting_and_its_value() {
        assert_eq!(too_short_for(4096, Some(4096)), None);
        assert_eq!(too_short_for(16_384, None), None);
        let said = too_short_for(16_384, Some(4096)).unwrap();
        assert!(said.contains("net.core.somaxconn=16384"), "{said}");
        assert!(
            said.contains("holds 4096") && said.contains("16384 nodes"),
            "{said}"
        );
    }

    #[tokio::test]
    async fn a_bound_socket_takes_connections() {
        let l = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let (c, a) = tokio::join!(tokio::net::TcpStream::connect(addr), l.accept());
        c.unwrap();
        a.unwrap();
    }

    /// Past tokio's 1,024, connections wait in the queue until accepted:
    /// with the smaller queue Linux drops the handshakes past it, and they
    /// come in only after a SYN-ACK retransmit (1 s), past the waits here.
    #[test]
    fn more_than_tokios_1024_wait_unaccepted() {
        crate::server::raise_open_files_limit().expect("raising the open-files limit");
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let l = bind("127.0.0.1:0".parse().unwrap()).unwrap();
            let addr = l.local_addr().unwrap();
            let want = queue().expect("net.core.somaxconn is readable").min(1500) as usize;
            let mut held = Vec::new();
            for _ in 0..want.saturating_sub(8) {
                held.push(std::net::TcpStream::connect(addr).unwrap());
            }
            // None was accepted; each handshake completed in the queue.
            let mut taken = 0;
            while let Ok(Ok(_)) =
                tokio::time::timeout(std::time::Duration::from_millis(200), l.accept()).await
            {
                taken += 1;
            }
            assert_eq!(taken, held.len());
        });
    }
}

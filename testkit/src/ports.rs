//! Loopback ports for servers a test starts by port number.
//!
//! A port the OS picked for `bind(:0)` and then released is the very kind
//! of port it hands to the next `bind(:0)`: a coordinator started with
//! `--listen 127.0.0.1:0` could take the `/metrics` port the test had just
//! chosen for it, and exit before its first line (seen once in CI). Ports
//! chosen here lie below the kernel's ephemeral range, where no `:0` bind
//! and no outgoing connection ever lands; only another explicit choice
//! could collide, and each is checked free when chosen and spread over
//! thousands of ports by the process id and a counter.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// The lowest port tried; below it lie well-known services.
const LOWEST: u32 = 10_000;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A loopback port free now and outside the ephemeral range.
pub fn free_port() -> u16 {
    let top = ephemeral_low().max(LOWEST + 1_000);
    let span = top - LOWEST;
    let start = std::process::id().wrapping_mul(7_919);
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = LOWEST + start.wrapping_add(n.wrapping_mul(104_729)) % span;
        let port = u16::try_from(port).expect("ports are below 65,536");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {LOWEST}..{top}")
}

/// The first port of the kernel's ephemeral range (`ip_local_port_range`),
/// 32,768 where it cannot be read.
fn ephemeral_low() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .filter(|&p: &u32| p <= 65_535)
        .unwrap_or(32_768)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_outside_the_ephemeral_range_and_differ() {
        let low = u16::try_from(ephemeral_low()).unwrap();
        let a: Vec<u16> = (0..50).map(|_| free_port()).collect();
        assert!(a.iter().all(|&p| (10_000..low).contains(&p)), "{a:?}");
        let mut b = a.clone();
        b.sort_unstable();
        b.dedup();
        assert_eq!(a.len(), b.len(), "the same port chosen twice: {a:?}");
    }
}

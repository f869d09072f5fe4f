//! The one place that builds a gRPC server, so every listener gets the same limits.

use std::time::Duration;

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

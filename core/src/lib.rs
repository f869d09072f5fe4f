//! gpuctl-core: what every gpuctl process shares besides the protocol (the
//! `gpuctl.v1` wire is `gpuctl-proto`), so a newcomer looks here first for
//! anything two binaries agree on that is not a message: the rules of a job
//! spec with the catalogue of workload parameters, the acceptance suites, the
//! bounds on what one process accepts from another (`limits`), statistics and
//! the node and link search; and the plumbing every binary shares: the one gRPC
//! server and client builders, the shutdown signal, leader election and the
//! `/metrics` server.

pub mod auth;
pub mod catalogue;
pub mod client;
pub mod clock;
pub mod conn;
pub mod counting_alloc;
pub mod cpu_time;
pub mod host_memory;
pub mod leader;
pub mod limits;
pub mod listen;
pub mod listing;
pub mod metrics_http;
pub mod metrics_tls;
pub mod mfu;
pub mod pace;
pub mod pairs;
pub mod rendezvous_keys;
pub mod request;
pub mod retry;
pub mod search;
pub mod server;
pub mod server_tls;
pub mod shutdown;
pub mod spec;
pub mod stats;
pub mod suite;
pub mod telemetry_parts;
pub mod timeline;
pub mod units;

/// Milliseconds since the Unix epoch, the one clock every message uses.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

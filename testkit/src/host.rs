//! Host fixtures: the facts and the registration an agent sends, for a host
//! of CPU ranks and for a GPU host.

use gpuctl_proto::pb::{HostFacts, RegisterRequest};
use gpuctl_proto::PROTOCOL_VERSION;

/// A host of `cpu_count` 4, reachable on loopback, that runs `cpu_ranks`
/// CPU ranks (no GPU).
pub fn cpu(name: &str, cpu_ranks: u32) -> HostFacts {
    HostFacts {
        hostname: name.into(),
        addresses: vec!["127.0.0.1".into()],
        cpu_count: 4,
        cpu_ranks,
        cpu_model: "Test CPU".into(),
        ..Default::default()
    }
}

/// A GPU host reachable on loopback: 8 CPUs, 16 GiB of /dev/shm and one
/// InfiniBand device; its GPUs travel beside it ([`crate::gpu::infos`]).
pub fn gpu(name: &str) -> HostFacts {
    HostFacts {
        hostname: name.into(),
        addresses: vec!["127.0.0.1".into()],
        cpu_count: 8,
        shm_bytes: 16 << 30,
        ib_devices: vec!["mlx5_0".into()],
        ..Default::default()
    }
}

/// A valid registration of `name` (this protocol, `facts`, no GPUs, no
/// preflight, nothing running).
pub fn register_request(name: &str, facts: HostFacts) -> RegisterRequest {
    RegisterRequest {
        protocol_version: PROTOCOL_VERSION,
        name: name.into(),
        facts: Some(facts),
        ..Default::default()
    }
}

//! What a simulated node says it is: its name, its GPUs, its host facts and
//! the telemetry of a loaded H200. Apart from `fleet/`, which is about how an
//! agent talks to the coordinator (sessions, heartbeats, assignments); this
//! is the hardware it describes, the same at every registration.

use gpuctl_proto::pb::{GpuInfo, GpuSample, HostFacts, NetInterface};

/// Simulated nodes are named `{NAME_PREFIX}{i:05}`.
pub const NAME_PREFIX: &str = "sim-";

/// The `index`th node's name.
pub fn name(index: usize) -> String {
    format!("{NAME_PREFIX}{index:05}")
}

/// The `count` GPUs of the `index`th node, their UUIDs unique in the fleet.
pub fn gpus(index: u32, count: u32) -> Vec<GpuInfo> {
    (0..count)
        .map(|g| GpuInfo {
            index: g,
            uuid: format!("GPU-sim-{index:05}-{g}"),
            name: "NVIDIA H200".into(),
            memory_total_bytes: 150_754_820_096,
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + g),
            pcie_gen_max: 5,
            pcie_width_max: 16,
            nvlinks_active: 18,
            compute_capability: "9.0".into(),
            sm_count: 132,
            ..Default::default()
        })
        .collect()
}

/// The loopback address the `index`th node's connections come from when
/// each node has one of its own (127.1.0.0, 127.1.0.1, …; Linux answers
/// for all of 127/8): the coordinator then sees one peer per host, as in a
/// real fleet, where from 127.0.0.1 alone its per-address reserve held the
/// fleet to 7/8 of its connections.
pub fn loopback(index: u32) -> std::net::IpAddr {
    std::net::Ipv4Addr::new(
        127,
        (1 + index / 65536) as u8,
        ((index / 256) % 256) as u8,
        (index % 256) as u8,
    )
    .into()
}

/// The host `name`, the `index`th node: its address is unique in the fleet.
pub fn facts(name: &str, index: u32) -> HostFacts {
    let ip = format!(
        "10.{}.{}.{}",
        1 + index / 65536,
        (index / 256) % 256,
        index % 256
    );
    HostFacts {
        hostname: name.to_string(),
        addresses: vec![ip.clone()],
        cpu_count: 224,
        memory_total_bytes: 2 << 40,
        shm_bytes: 1 << 40,
        cpu_model: "Intel(R) Xeon(R) Platinum 8480C".into(),
        driver_version: "580.95.05".into(),
        cuda_driver_version: "13.0".into(),
        nvml_status: "ok".into(),
        agent_version: format!("gpuctl-sim {}", env!("CARGO_PKG_VERSION")),
        libtorch: "simulated".into(),
        os: "Debian GNU/Linux 12".into(),
        kernel: "6.8.0".into(),
        interfaces: vec![NetInterface {
            name: "eth0".into(),
            ipv4: ip,
            mtu: 9000,
            speed_mbps: 400_000,
        }],
        nccl_version: "2.28.3".into(),
        torch_version: "2.11.0+cu130".into(),
        memlock_bytes: u64::MAX,
        ..Default::default()
    }
}

/// A loaded H200 at its power cap (the tests' healthy H200), with a little
/// noise on its gauges so that the coordinator's series are not constant.
pub fn busy_sample(node: u32, gpu: u32, now: u64, rng: &mut fastrand::Rng) -> GpuSample {
    GpuSample {
        uuid: format!("GPU-sim-{node:05}-{gpu}"),
        unix_ms: now,
        util_gpu: 97.0 + rng.f64() * 3.0,
        util_mem: 60.0 + rng.f64() * 10.0,
        temperature_c: 62.0 + rng.f64() * 6.0,
        power_w: 680.0 + rng.f64() * 20.0,
        sm_clock_mhz: 1_830 + rng.u32(0..150),
        ..gpuctl_testkit::gpu::healthy(gpu)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_node_has_a_loopback_address_of_its_own() {
        let n = 131_072u32;
        let all: std::collections::HashSet<_> = (0..n).map(super::loopback).collect();
        assert_eq!(all.len(), n as usize);
        assert!(all.iter().all(|a| a.is_loopback()));
        assert!(!all.contains(&std::net::IpAddr::from([127, 0, 0, 1])));
    }
}

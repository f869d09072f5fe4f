//! What a simulated fleet looks like ([`FleetConfig`]): its coordinators,
//! its size, its pace, and whose connections its agents and ranks take.

use std::time::Duration;

use crate::host;

/// How often each simulated agent heartbeats unless the coordinator's pace
/// spaces it out: the most often a coordinator asks (`--node-timeout`/3, at
/// most 1 s).
pub const HEARTBEAT: Duration = Duration::from_secs(1);

/// What the simulated fleet looks like.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// The coordinator, or several comma-separated (a leader and its
    /// standbys, on one etcd): agents find the leader as `gpuctl-agent` does
    /// and look for it again when their session ends.
    pub url: String,
    pub nodes: usize,
    pub gpus: u32,
    /// Telemetry batch per job per node, and each rank's progress.
    pub interval: Duration,
    /// HTTP/2 connections the agents share (a real fleet has one per agent).
    pub connections: usize,
    /// Whose connection the simulated workers' calls take.
    pub rank_connections: RankConnections,
    /// The first node's index: a fleet split over processes
    /// (`gpuctl-sim failover --fleet-processes`) runs `sim-{first}` on in
    /// each.
    pub first: usize,
    /// Each node's connections from a loopback address of its own
    /// ([`host::loopback`]), not all from 127.0.0.1.
    pub own_addresses: bool,
}

impl FleetConfig {
    /// `nodes` × `gpus` from node 0, the workers' calls over their agent's
    /// connection, every node from this host's usual address.
    pub fn new(
        url: String,
        nodes: usize,
        gpus: u32,
        interval: Duration,
        connections: usize,
    ) -> FleetConfig {
        FleetConfig {
            url,
            nodes,
            gpus,
            interval,
            connections,
            rank_connections: RankConnections::Agent,
            first: 0,
            own_addresses: false,
        }
    }

    /// How the `index`th simulated agent connects: as gpuctl-agent's
    /// session does.
    pub(super) fn builder(&self, index: usize, url: &str) -> gpuctl_core::client::Builder {
        gpuctl_core::client::builder(url)
            .connect_timeout(Duration::from_secs(10))
            .request_timeout(Duration::from_secs(30))
            .local_address(self.own_addresses.then(|| host::loopback(index as u32)))
    }
}

/// Whose HTTP/2 connection a simulated rank's calls (progress, result) go
/// over. `gpuctl-agent` relays its workers' calls over its own connection by
/// default (`--worker-connections relay`); with `direct`, each
/// `gpuctl-worker` opens connections of its own for the job, so a fleet at
/// 4,096 × 8 brings 32,768 workers' connections to the coordinator for each
/// job and closes them at its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RankConnections {
    /// Over its agent's connection, as gpuctl-agent's relay.
    #[default]
    Agent,
    /// One connection per node for each job, shared by its ranks: as
    /// `rank` in when connections open and close, with 1/G of them.
    Node,
    /// One per rank for each job, as `gpuctl-worker` with
    /// `--worker-connections direct`: needs two file descriptors per rank
    /// between the coordinator and the simulator.
    Rank,
}

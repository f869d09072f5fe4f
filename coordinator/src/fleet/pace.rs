//! How often agents send what they send unasked: heartbeats and telemetry
//! batches. Each node sends both once a second up to `per_s` nodes; past
//! that they are spaced out with the fleet, so one coordinator takes about
//! `per_s` of each a second however many nodes it has. At 16,384 nodes a
//! second apiece was 32,768 messages a second through one scheduler thread,
//! on top of the ranks' progress, and the 2-core coordinator fell minutes
//! behind (docs/benchmarks.md, issue 51).
//!
//! Pure: the scheduler asks at each registration and removal, and tells
//! every session when the answer changes (`scheduler/agents.rs`).

use std::time::Duration;

/// Up to a second apart, nodes send as they like: no spacing is asked.
const BASE: Duration = Duration::from_secs(1);

/// An agent holds its telemetry at most this long: `gpuctl watch` then shows
/// samples this old at worst.
pub const TELEMETRY_SEND_MAX: Duration = Duration::from_secs(8);

/// The least time between each agent's messages; zero asks for none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pace {
    pub heartbeat: Duration,
    pub telemetry_send: Duration,
}

impl Pace {
    pub fn to_proto(self) -> gpuctl_proto::pb::Pace {
        gpuctl_proto::pb::Pace {
            heartbeat_interval_ms: self.heartbeat.as_millis() as u32,
            telemetry_send_ms: self.telemetry_send.as_millis() as u32,
        }
    }
}

/// The pace for a fleet of `nodes`: none up to `per_s` nodes; past that,
/// a node's messages `nodes / per_s` seconds apart, heartbeats never past a
/// third of `node_timeout` (a few still fit in it, whatever the fleet's
/// size) and telemetry never past [`TELEMETRY_SEND_MAX`]. The fleet is
/// rounded up to a power of two, so the pace changes at each doubling only
/// and a fleet registering tells its sessions some 14 times, not once per
/// node.
pub fn pace(nodes: usize, per_s: u32, node_timeout: Duration) -> Pace {
    let fleet = nodes.max(1).next_power_of_two() as u64;
    let spread = Duration::from_millis(fleet * 1_000 / u64::from(per_s.max(1)));
    if spread <= BASE {
        return Pace::default();
    }
    Pace {
        heartbeat: spread.min(node_timeout / 3),
        telemetry_send: spread.min(TELEMETRY_SEND_MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_fleet_up_to_the_rate_is_asked_for_no_spacing() {
        for nodes in [0, 1, 7, 2_048] {
            assert_eq!(pace(nodes, 2_048, 60 * S), Pace::default(), "{nodes} nodes");
        }
    }

    #[test]
    fn past_the_rate_messages_are_spread_out_and_change_only_at_each_doubling() {
        let p = pace(16_384, 2_048, 60 * S);
        assert_eq!(p.heartbeat, 8 * S);
        assert_eq!(p.telemetry_send, 8 * S);
        // Between two powers of two, the larger one's pace.
        assert_eq!(pace(2_049, 2_048, 60 * S).heartbeat, 2 * S);
        assert_eq!(pace(4_096, 2_048, 60 * S).heartbeat, 2 * S);
        assert_eq!(pace(4_097, 2_048, 60 * S).heartbeat, 4 * S);
        // Telemetry waits at most TELEMETRY_SEND_MAX.
        assert_eq!(pace(131_072, 2_048, 600 * S).telemetry_send, 8 * S);
        assert_eq!(pace(131_072, 2_048, 600 * S).heartbeat, 64 * S);
        // The rate is the operator's.
        assert_eq!(pace(16_384, 16_384, 60 * S), Pace::default());
    }

    #[test]
    fn the_node_timeout_bounds_the_heartbeat_however_large_the_fleet() {
        // The default 15 s timeout: a beat every 5 s at most.
        let p = pace(16_384, 2_048, 15 * S);
        assert_eq!(p.heartbeat, 5 * S);
        assert_eq!(p.telemetry_send, 8 * S);
        assert_eq!(pace(16_384, 2_048, 2 * S).heartbeat, 2 * S / 3);
    }
}

//! The coordinator's pace (`Pace` in gpuctl.proto), as an agent holds it:
//! the least time between its heartbeats and between its telemetry sends,
//! which a coordinator of a large fleet spaces out. The session sets it (at
//! registration, and when a `Pace` message comes); the heartbeat timer and
//! the telemetry loop read it, in tasks of their own. Here because
//! `gpuctl-agent` and the simulated agents of `gpuctl-sim` both keep it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use gpuctl_proto::pb;

#[derive(Debug, Default)]
pub struct Pace {
    heartbeat_ms: AtomicU32,
    telemetry_send_ms: AtomicU32,
}

impl Pace {
    /// As the coordinator said; `None` (an older coordinator) asks for none.
    pub fn set(&self, pace: Option<&pb::Pace>) {
        let p = pace.cloned().unwrap_or_default();
        self.heartbeat_ms
            .store(p.heartbeat_interval_ms, Ordering::Relaxed);
        self.telemetry_send_ms
            .store(p.telemetry_send_ms, Ordering::Relaxed);
    }

    /// The interval to heartbeat at: `wanted` (the shorter of this agent's
    /// own and the coordinator's node-timeout interval), spaced out to the
    /// pace. The coordinator keeps the pace under a third of its node
    /// timeout, so this never makes a node look lost.
    pub fn heartbeat(&self, wanted: Duration) -> Duration {
        wanted.max(ms(&self.heartbeat_ms))
    }

    /// How long a job's telemetry samples may wait to be sent together.
    pub fn telemetry_send(&self) -> Duration {
        ms(&self.telemetry_send_ms)
    }
}

fn ms(v: &AtomicU32) -> Duration {
    Duration::from_millis(u64::from(v.load(Ordering::Relaxed)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paced_fleet_spaces_heartbeats_out_and_an_unpaced_one_keeps_its_own() {
        let pace = Pace::default();
        let own = Duration::from_millis(500);
        assert_eq!(pace.heartbeat(own), own);
        assert_eq!(pace.telemetry_send(), Duration::ZERO);
        pace.set(Some(&pb::Pace {
            heartbeat_interval_ms: 8_000,
            telemetry_send_ms: 4_000,
        }));
        assert_eq!(pace.heartbeat(own), Duration::from_secs(8));
        assert_eq!(pace.telemetry_send(), Duration::from_secs(4));
        // A coordinator that says nothing (older, or the fleet shrank).
        pace.set(None);
        assert_eq!(pace.heartbeat(own), own);
    }
}

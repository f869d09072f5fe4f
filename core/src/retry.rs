//! Calls that a connection closed by the server cut short are made again on
//! a new one, so that no client (CLI, agent, worker, the simulator) loses a
//! call when the coordinator lets a connection go: its HTTP/2 keepalive
//! gave up on a peer too busy to answer a ping in time (a GOAWAY with
//! `NO_ERROR`: what ended the 16,384-node bench in issue 51), its
//! `--max-connection-age` came, or it restarted.
//!
//! Which calls may go again is decided per call by what the failure proves:
//! a call the server never took (above the GOAWAY's last stream, or
//! refused) goes again whatever it does; a call the server may have taken
//! goes again only when doing it twice changes nothing ([`IDEMPOTENT`]: the
//! reads, and the writes keyed by what they write, such as a rank's
//! result). A request whose body is a stream (an agent's session) is never
//! made again here: its owner reconnects it.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use tonic::body::Body;
use tonic::codegen::{http, StdError};

/// Tries of one call, the first included.
pub const ATTEMPTS: u32 = 5;
/// The pause before the second try; it doubles for each one after, with
/// ±50 % jitter so that the clients of one closed connection do not all
/// come back at once.
const FIRST_PAUSE: Duration = Duration::from_millis(25);

/// Calls that may be made twice: reading changes nothing, and these writes
/// are keyed by what they write (a rank's result or progress, a rendezvous
/// key, a node's registration under its name, a cancel).
pub const IDEMPOTENT: &[&str] = &[
    "/gpuctl.v1.AgentService/Register",
    "/gpuctl.v1.JobService/PlanJob",
    "/gpuctl.v1.JobService/GetJob",
    "/gpuctl.v1.JobService/ListJobs",
    "/gpuctl.v1.JobService/CancelJob",
    "/gpuctl.v1.JobService/GetReport",
    "/gpuctl.v1.JobService/GetReportPacked",
    "/gpuctl.v1.JobService/GetLogs",
    "/gpuctl.v1.JobService/ListNodes",
    "/gpuctl.v1.JobService/GetTelemetry",
    "/gpuctl.v1.JobService/GetTimeline",
    "/gpuctl.v1.JobService/GetBaseline",
    "/gpuctl.v1.JobService/ListBaselines",
    "/gpuctl.v1.JobService/GetFleet",
    "/gpuctl.v1.JobService/GetSuite",
    "/gpuctl.v1.JobService/CancelSuite",
    "/gpuctl.v1.WorkerService/RendezvousPut",
    "/gpuctl.v1.WorkerService/RendezvousGet",
    "/gpuctl.v1.WorkerService/ReportProgress",
    "/gpuctl.v1.WorkerService/ReportResult",
];

/// Calls whose request is a stream: it cannot be kept to send again.
pub const STREAMED_REQUESTS: &[&str] = &["/gpuctl.v1.AgentService/Session"];

/// How a call may be tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Again {
    /// Never (a streamed request).
    Never,
    /// Only when the server never took it.
    IfNotTaken,
    /// Whenever its connection failed under it.
    IfConnectionFailed,
}

/// How the call to `path` (`/package.Service/Method`) may be tried again.
pub fn again(path: &str) -> Again {
    if STREAMED_REQUESTS.contains(&path) {
        Again::Never
    } else if IDEMPOTENT.contains(&path) {
        Again::IfConnectionFailed
    } else {
        Again::IfNotTaken
    }
}

/// A request kept whole so that it can be sent again.
pub struct Kept {
    parts: http::request::Parts,
    body: Bytes,
}

impl Kept {
    /// Reads `req`'s body whole (a unary call's: one message).
    pub async fn keep(req: http::Request<Body>) -> Result<Kept, StdError> {
        let (parts, body) = req.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok(Kept { parts, body })
    }

    /// The call's path (`/package.Service/Method`).
    pub fn path(&self) -> &str {
        self.parts.uri.path()
    }

    /// The request, to send (again).
    pub fn request(&self) -> http::Request<Body> {
        let body = Body::new(http_body_util::Full::new(self.body.clone()));
        http::Request::from_parts(self.parts.clone(), body)
    }
}

/// Whether `e` went wrong before the call was made again would be safe, for a call
/// that may be tried `again`.
pub fn worth_again(again: Again, e: &(dyn std::error::Error + 'static)) -> bool {
    match again {
        Again::Never => false,
        Again::IfNotTaken => not_taken(e),
        Again::IfConnectionFailed => not_taken(e) || connection_failed(e),
    }
}

/// The pause before try `n` (2 for the second): doubling, jittered.
pub fn pause(n: u32) -> Duration {
    jittered(FIRST_PAUSE * 2u32.saturating_pow(n.saturating_sub(2)))
}

/// `base` times a random 0.5-1.5: clients that failed together (a fleet
/// whose coordinator died) spread their next tries over a second of every
/// second they wait, instead of coming back in one burst.
pub fn jittered(base: Duration) -> Duration {
    // Jitter from the OS; a failure to read it costs only the jitter.
    let r = getrandom::u64().unwrap_or(0) % 1000;
    base.mul_f64(0.5 + r as f64 / 1000.0)
}

/// How an agent waits between tries to reach a coordinator again
/// (`gpuctl-agent`, and the simulator's agents as it): from
/// [`reconnect::START`], doubling after each failure up to
/// [`reconnect::CAP`], each wait [`jittered`].
pub mod reconnect {
    use std::time::Duration;

    pub const START: Duration = Duration::from_millis(500);
    pub const CAP: Duration = Duration::from_secs(5);

    /// The wait after `failed` tries in a row (1 for the first), jittered.
    pub fn wait(failed: u32) -> Duration {
        let doubled = START.saturating_mul(1u32 << failed.saturating_sub(1).min(16));
        super::jittered(doubled.min(CAP))
    }
}

/// Each error in `e`'s chain.
fn chain<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(e), |e| e.source())
}

/// The server never took the call: its GOAWAY named a last stream below
/// this one (or came before it was sent), it refused the stream, or the
/// connection was gone before the request left.
pub fn not_taken(e: &(dyn std::error::Error + 'static)) -> bool {
    chain(e).any(|e| {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return (h2.is_go_away() && h2.is_remote())
                || h2.reason() == Some(h2::Reason::REFUSED_STREAM);
        }
        e.downcast_ref::<hyper::Error>()
            .is_some_and(|h| h.is_canceled())
    })
}

/// The connection failed under the call: closed, reset or broken, by
/// either side's HTTP/2 or by the network.
pub fn connection_failed(e: &(dyn std::error::Error + 'static)) -> bool {
    chain(e).any(|e| {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return h2.is_io() || h2.is_go_away();
        }
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            return h.is_closed() || h.is_incomplete_message() || h.is_canceled();
        }
        e.downcast_ref::<std::io::Error>().is_some_and(|io| {
            use std::io::ErrorKind::*;
            matches!(
                io.kind(),
                BrokenPipe | ConnectionReset | ConnectionAborted | UnexpectedEof
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_never_go_again_and_writes_only_when_not_taken() {
        assert_eq!(again("/gpuctl.v1.AgentService/Session"), Again::Never);
        assert_eq!(again("/gpuctl.v1.JobService/Submit"), Again::IfNotTaken);
        assert_eq!(
            again("/gpuctl.v1.JobService/ListNodes"),
            Again::IfConnectionFailed
        );
        let broken = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        assert!(!worth_again(Again::IfNotTaken, &broken));
        assert!(worth_again(Again::IfConnectionFailed, &broken));
        assert!(!worth_again(Again::Never, &broken));
    }

    #[test]
    fn the_names_are_the_protocols() {
        let proto = include_str!("../../proto/gpuctl.proto");
        let package = proto
            .lines()
            .find_map(|l| l.strip_prefix("package "))
            .map(|p| p.trim_end_matches(';').trim())
            .expect("the package line");
        for path in IDEMPOTENT.iter().chain(STREAMED_REQUESTS) {
            let rest = path
                .strip_prefix(&format!("/{package}."))
                .unwrap_or_else(|| panic!("{path}: not in package {package}"));
            let method = rest.split('/').nth(1).expect("a method");
            assert!(
                proto.contains(&format!("rpc {method}(")),
                "{path}: no such rpc in gpuctl.proto"
            );
        }
    }

    #[test]
    fn pauses_double_with_jitter() {
        for n in 2..6u32 {
            let base = FIRST_PAUSE * 2u32.pow(n - 2);
            let p = pause(n);
            assert!(p >= base / 2 && p <= base * 3 / 2, "{n}: {p:?}");
        }
    }

    #[test]
    fn reconnects_double_to_the_cap_and_are_spread_around_it() {
        let within = |w: Duration, base: Duration| w >= base / 2 && w <= base * 3 / 2;
        for (failed, base) in [
            (1, 500),
            (2, 1000),
            (3, 2000),
            (4, 4000),
            (5, 5000),
            (40, 5000),
        ] {
            let base = Duration::from_millis(base);
            let waits: Vec<Duration> = (0..64).map(|_| reconnect::wait(failed)).collect();
            assert!(
                waits.iter().all(|w| within(*w, base)),
                "{failed}: {waits:?}"
            );
            // Spread, not one value: 64 draws of 1,000 steps all alike
            // would mean no jitter.
            assert!(waits.iter().any(|w| *w != waits[0]), "{failed}: {waits:?}");
        }
    }
}

/// How a worker waits out a coordinator that does not answer (a failover, a
/// restart): `gpuctl-worker`'s calls, and the simulator's ranks as it.
pub mod outage {
    use std::time::Duration;

    /// The agent's default `--coordinator-grace`, for a worker started
    /// without `GPUCTL_COORDINATOR_GRACE_MS`.
    pub const DEFAULT_GRACE: Duration = Duration::from_secs(60);
    /// Calls are tried again a little past the grace (the agent may find
    /// the coordinator at its very end)...
    pub const GRACE_MARGIN: Duration = Duration::from_secs(5);
    /// ...and a result for at least this long, even with no grace: a result
    /// that never arrives fails the rank, so a coordinator blip is worth
    /// waiting out.
    pub const MIN_RESULT_RETRY: Duration = Duration::from_secs(30);
    /// The exit code of a worker that gave up sending its result (EX_TEMPFAIL
    /// of sysexits.h): the coordinator did not take it in time, which says
    /// nothing of the rank's node, so the coordinator calls that rank
    /// unknown, not failed. A node could exit so to hide a failure of its
    /// own: its ranks are then unknown, never passed, and no other node's.
    pub const UNDELIVERED_EXIT: i32 = 75;
    /// Backoff between tries of a call the coordinator did not answer.
    pub const RETRY_START: Duration = Duration::from_millis(200);
    pub const RETRY_CAP: Duration = Duration::from_secs(2);

    /// One call's tries: again for `budget` from its *first failure*, not
    /// its first try (a first try that waited out its whole timeout at a
    /// loaded coordinator must not spend the budget: the simulator counted
    /// from the first try and gave up 30 s before a worker), backing off
    /// from [`RETRY_START`] to [`RETRY_CAP`]. The worker and the simulator
    /// both go by it, so they cannot drift apart.
    #[derive(Debug, Clone)]
    pub struct Retrying {
        budget: Duration,
        until: Option<std::time::Instant>,
        pause: Duration,
        failures: u32,
    }

    impl Retrying {
        pub fn new(budget: Duration) -> Retrying {
            Retrying {
                budget,
                until: None,
                pause: RETRY_START,
                failures: 0,
            }
        }

        /// A try failed at `now`: the pause before the next, or `None` once
        /// the budget is spent.
        pub fn failed(&mut self, now: std::time::Instant) -> Option<Duration> {
            self.failures += 1;
            let until = *self.until.get_or_insert(now + self.budget);
            if now >= until {
                return None;
            }
            let pause = self.pause;
            self.pause = (self.pause * 2).min(RETRY_CAP);
            Some(pause)
        }

        /// Tries that failed so far.
        pub fn failures(&self) -> u32 {
            self.failures
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn tries_go_on_for_the_budget_from_the_first_failure_backing_off() {
            let t0 = std::time::Instant::now();
            let mut r = Retrying::new(Duration::from_secs(10));
            // The first try waited out a 30 s timeout: the budget starts now.
            let first = t0 + Duration::from_secs(30);
            assert_eq!(r.failed(first), Some(RETRY_START));
            assert_eq!(
                r.failed(first + Duration::from_secs(1)),
                Some(RETRY_START * 2)
            );
            let pauses: Vec<_> = (2..8)
                .map(|i| r.failed(first + Duration::from_secs(i)).unwrap())
                .collect();
            assert_eq!(pauses.last(), Some(&RETRY_CAP));
            assert_eq!(r.failed(first + Duration::from_secs(10)), None);
            assert_eq!(r.failures(), 9);
        }
    }
}

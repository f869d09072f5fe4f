//! The worker's side of `WorkerService`: rendezvous and result (progress
//! goes out from its own thread, `crate::progress`).
//!
//! Workloads are blocking (tch), so the gRPC client lives on a small
//! current-thread tokio runtime and every call is a `block_on`.
//!
//! The coordinator may be away for a while (restarting, or a standby taking
//! over) while the agent keeps this worker running for its grace
//! (`GPUCTL_COORDINATOR_GRACE_MS`): rendezvous calls that find no coordinator
//! are tried again for that long, and the result (one per rank) is held until
//! it is acknowledged or the grace is over, so the worker never exits with an
//! undelivered result the coordinator could still take.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use gpuctl_core::leader::Failover;
use gpuctl_proto::pb::{
    worker_service_client::WorkerServiceClient, Ack, RankResult, RendezvousGetRequest,
    RendezvousPutRequest,
};
use tokio::runtime::Runtime;
use tonic::{Code, Request, Status};

use crate::connect::{channel, runtime, RPC_TIMEOUT};
use crate::rendezvous::Rendezvous;
/// The longest single RendezvousGet wait; longer waits are several calls.
const GET_SLICE_MS: u32 = 10_000;
/// How long the agent keeps workers without a coordinator, in ms (set by the
/// agent from its `--coordinator-grace`).
pub const COORDINATOR_GRACE_ENV: &str = "GPUCTL_COORDINATOR_GRACE_MS";
use gpuctl_core::retry::outage::{Retrying, DEFAULT_GRACE, GRACE_MARGIN, MIN_RESULT_RETRY};

/// How long calls are tried again while the coordinator is away.
fn outage_budget() -> Duration {
    let grace = std::env::var(COORDINATOR_GRACE_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_millis)
        .unwrap_or(DEFAULT_GRACE);
    grace + GRACE_MARGIN
}

/// Errors that mean "no coordinator answered" rather than "the coordinator
/// said no": worth trying again.
fn unanswered(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded
    )
}

/// A blocking client of the coordinator's WorkerService for one job attempt.
pub struct CoordinatorClient {
    rt: Runtime,
    client: WorkerServiceClient<Failover>,
    url: String,
    job_id: String,
    attempt: u32,
    /// How long an unanswered call is tried again.
    outage: Duration,
}

impl CoordinatorClient {
    pub fn new(url: &str, job_id: &str, attempt: u32) -> Result<Self> {
        let rt = runtime()?;
        let ch = {
            let _g = rt.enter();
            channel(url)?
        };
        Ok(Self {
            rt,
            client: WorkerServiceClient::new(ch),
            url: url.to_string(),
            job_id: job_id.to_string(),
            attempt,
            outage: outage_budget(),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Sends the result, trying again while the coordinator is away for as
    /// long as the agent keeps this worker (its grace; half a minute at least),
    /// whatever the error: a result that never arrives fails the rank.
    pub fn report_result(&self, result: RankResult) -> Result<Ack> {
        let budget = self.outage.max(MIN_RESULT_RETRY);
        self.call(
            "ReportResult",
            budget,
            |_| true,
            |mut c| {
                let r = result.clone();
                async move { c.report_result(r).await }
            },
        )
    }

    /// One unary call, tried again with backoff while `retry` says the error
    /// is worth it, for up to `budget` after its first failure.
    fn call<T, F, Fut>(
        &self,
        what: &str,
        budget: Duration,
        retry: impl Fn(&Status) -> bool,
        mut f: F,
    ) -> Result<T>
    where
        F: FnMut(WorkerServiceClient<Failover>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let mut tries = Retrying::new(budget);
        loop {
            let status = match self.rt.block_on(f(self.client.clone())) {
                Ok(r) => {
                    if tries.failures() > 0 {
                        tracing::info!("{what}: the coordinator at {} answers again", self.url);
                    }
                    return Ok(r.into_inner());
                }
                Err(status) => status,
            };
            let pause = tries.failed(Instant::now()).filter(|_| retry(&status));
            let failures = tries.failures();
            let Some(pause) = pause else {
                return Err(anyhow!(
                    "{what} at {}: {}{}",
                    self.url,
                    status.message(),
                    if failures > 1 {
                        format!(" (tried {failures} times over {budget:?})")
                    } else {
                        String::new()
                    }
                ));
            };
            if failures == 1 || failures.is_multiple_of(10) {
                tracing::warn!(
                    "{what} at {}: {}; trying again for up to {budget:?}",
                    self.url,
                    status.message()
                );
            }
            std::thread::sleep(pause);
        }
    }
}

impl Rendezvous for CoordinatorClient {
    fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        let req = RendezvousPutRequest {
            job_id: self.job_id.clone(),
            attempt: self.attempt,
            key: key.to_string(),
            value: value.to_vec(),
        };
        let what = format!("RendezvousPut `{key}`");
        let ack = self.call(&what, self.outage, unanswered, |mut c| {
            let r = req.clone();
            async move { c.rendezvous_put(r).await }
        })?;
        if !ack.ok {
            bail!(
                "the coordinator refused rendezvous key `{key}`: {}",
                ack.message
            );
        }
        Ok(())
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let slice = (left.as_millis() as u32).clamp(1, GET_SLICE_MS);
            let req = RendezvousGetRequest {
                job_id: self.job_id.clone(),
                attempt: self.attempt,
                key: key.to_string(),
                timeout_ms: slice,
            };
            let what = format!("RendezvousGet `{key}`");
            let resp = self.call(&what, self.outage, unanswered, |mut c| {
                // A long poll: the coordinator holds it up to `slice`.
                let mut r = Request::new(req.clone());
                r.set_timeout(RPC_TIMEOUT + Duration::from_millis(slice as u64));
                async move { c.rendezvous_get(r).await }
            })?;
            if resp.found {
                return Ok(resp.value);
            }
            if resp.job_over {
                return Err(JobOver(key.to_string()).into());
            }
            if Instant::now() >= deadline {
                bail!(
                    "rendezvous key `{key}` did not appear within {:.0}s (is every rank running?)",
                    timeout.as_secs_f64()
                );
            }
        }
    }
}

/// The coordinator ended the job while this rank waited on the rendezvous:
/// the rank did not fail, the job ended around it (its result is then
/// `partial`, never a verdict on it).
#[derive(Debug)]
pub struct JobOver(pub String);

impl std::fmt::Display for JobOver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the job ended while waiting for rendezvous key `{}`",
            self.0
        )
    }
}

impl std::error::Error for JobOver {}

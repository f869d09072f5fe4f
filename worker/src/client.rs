//! The worker's side of `WorkerService`: rendezvous, progress, result.
//!
//! Workloads are blocking (tch), so the gRPC client lives on a small
//! current-thread tokio runtime and every call is a `block_on`. Progress goes out
//! from its own thread (own runtime, own connection) about once a second, so it
//! keeps flowing — and a job that is over is noticed — even while the main
//! thread sits in a long GEMM or collective.
//!
//! The coordinator may be away for a while (restarting, or a standby taking
//! over) while the agent keeps this worker running for its grace
//! (`GPUCTL_COORDINATOR_GRACE_MS`): rendezvous calls that find no coordinator
//! are tried again for that long, and the result (one per rank) is held until
//! it is acknowledged or the grace is over, so the worker never exits with an
//! undelivered result the coordinator could still take. Progress needs no
//! buffer: each report is the latest state, and a failed one is just skipped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use gpuctl_core::leader::Failover;
use gpuctl_core::pb::{
    worker_service_client::WorkerServiceClient, Ack, RankProgress, RankProgressReport, RankResult,
    RendezvousGetRequest, RendezvousPutRequest,
};
use tokio::runtime::Runtime;
use tonic::{Code, Request, Status};

use crate::rendezvous::Rendezvous;
use crate::timeline::Timeline;

/// A unary call's answer; the channel fails the call after this.
const RPC_TIMEOUT: Duration = Duration::from_secs(20);
/// A progress report is worth little once it is late.
const PROGRESS_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest single RendezvousGet wait; longer waits are several calls.
const GET_SLICE_MS: u32 = 10_000;
/// How long the agent keeps workers without a coordinator, in ms (set by the
/// agent from its `--coordinator-grace`).
pub const COORDINATOR_GRACE_ENV: &str = "GPUCTL_COORDINATOR_GRACE_MS";
/// The agent's default grace, for a worker started without the variable.
const DEFAULT_GRACE: Duration = Duration::from_secs(60);
/// Calls are tried again a little past the grace (the agent may find the
/// coordinator at its very end)...
const GRACE_MARGIN: Duration = Duration::from_secs(5);
/// ...and a result for at least this long, even with no grace: a result that
/// never arrives fails the rank, so a coordinator blip is worth waiting out.
const MIN_RESULT_RETRY: Duration = Duration::from_secs(30);
/// Backoff between tries of a call the coordinator did not answer.
const RETRY_START: Duration = Duration::from_millis(200);
const RETRY_CAP: Duration = Duration::from_secs(2);

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

fn runtime() -> Result<Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")
}

/// Connects on the first call, so a coordinator that restarts meanwhile is
/// found again; calls that get no answer in time fail naming the URL. Over
/// `url` and every URL in `GPUCTL_COORDINATOR_URLS` (the agent's list: a
/// leader and its standbys): a call that meets a standby or no coordinator
/// moves the channel to the leader or the next URL, where callers' retries go.
/// Every call carries this rank's secret (from the agent, in
/// `GPUCTL_RANK_SECRET`): the coordinator takes results and rendezvous
/// writes only from the job's own workers. TLS comes from `GPUCTL_TLS_CA`.
fn channel(url: &str) -> Result<Failover> {
    let mut urls = gpuctl_core::leader::split_urls(url);
    if let Ok(more) = std::env::var("GPUCTL_COORDINATOR_URLS") {
        for u in gpuctl_core::leader::split_urls(&more) {
            if !urls.contains(&u) {
                urls.push(u);
            }
        }
    }
    let secret = std::env::var(gpuctl_core::auth::RANK_SECRET_ENV).ok();
    Ok(Failover::new(&urls, move |u| {
        let mut builder = gpuctl_core::client::builder(u)
            .connect_timeout(Duration::from_secs(10))
            .request_timeout(RPC_TIMEOUT);
        if let Some(secret) = &secret {
            builder = builder.header(gpuctl_core::auth::RANK_SECRET, secret.clone());
        }
        builder.connect_lazy()
    })?)
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
        let mut delay = RETRY_START;
        let mut give_up = None;
        let mut failures = 0u32;
        loop {
            let status = match self.rt.block_on(f(self.client.clone())) {
                Ok(r) => {
                    if failures > 0 {
                        tracing::info!("{what}: the coordinator at {} answers again", self.url);
                    }
                    return Ok(r.into_inner());
                }
                Err(status) => status,
            };
            failures += 1;
            let until = *give_up.get_or_insert_with(|| Instant::now() + budget);
            if !retry(&status) || Instant::now() >= until {
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
            }
            if failures == 1 || failures.is_multiple_of(10) {
                tracing::warn!(
                    "{what} at {}: {}; trying again for up to {budget:?}",
                    self.url,
                    status.message()
                );
            }
            std::thread::sleep(delay);
            delay = (delay * 2).min(RETRY_CAP);
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

/// What the progress thread sends next, and the phases so far.
#[derive(Default)]
struct Snapshot {
    phase: String,
    fraction: f64,
    metrics: HashMap<String, f64>,
    message: String,
    timeline: Timeline,
    /// What the rank waits for at the rendezvous (empty: it works).
    waiting_for: String,
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

/// Progress of this rank; cheap to update from the work loop, sent about once a
/// second by a background thread. `Progress::disabled()` sends nothing.
///
/// Besides the phase, the rank counts units of work done ([`Progress::tick`]):
/// the coordinator judges a hang by that counter, not by messages arriving,
/// since this thread keeps sending while the work loop is blocked.
#[derive(Clone)]
pub struct Progress {
    inner: Option<Arc<ProgressInner>>,
}

struct ProgressInner {
    snap: Mutex<Snapshot>,
    /// Units of work done (GEMMs, collective calls, training steps, trials).
    iterations: AtomicU64,
    stop: AtomicBool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// Who this rank is, for the progress messages.
#[derive(Clone, Debug)]
pub struct ProgressTarget {
    pub url: String,
    pub job_id: String,
    pub attempt: u32,
    pub rank: u32,
    pub node: String,
    /// Stop the process when this Unix time (ms) passes (0: never).
    pub deadline_unix_ms: u64,
}

impl Progress {
    pub fn disabled() -> Self {
        Progress { inner: None }
    }

    /// Keeps the phase and counter but sends nothing (tests, tools).
    pub fn local() -> Self {
        Progress {
            inner: Some(Arc::new(ProgressInner {
                snap: Mutex::new(Snapshot::default()),
                iterations: AtomicU64::new(0),
                stop: AtomicBool::new(false),
                thread: Mutex::new(None),
            })),
        }
    }

    /// Starts the sender thread. When the coordinator answers `Ack{ok:false}`
    /// (the job is over) or the deadline passes, the process exits with code 1
    /// at once: there is nothing left to report to.
    pub fn start(target: ProgressTarget) -> Result<Self> {
        let mut timeline = Timeline::default();
        timeline.record("starting", gpuctl_core::now_ms(), 0);
        let inner = Arc::new(ProgressInner {
            snap: Mutex::new(Snapshot {
                phase: "starting".into(),
                timeline,
                ..Default::default()
            }),
            iterations: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
        });
        let rt = runtime()?;
        let ch = {
            let _g = rt.enter();
            channel(&target.url)?
        };
        let me = inner.clone();
        let h = std::thread::Builder::new()
            .name("progress".into())
            .spawn(move || progress_loop(rt, WorkerServiceClient::new(ch), target, me))?;
        *inner.thread.lock().unwrap() = Some(h);
        Ok(Progress { inner: Some(inner) })
    }

    /// Called from hot loops: the phase text is copied only when it changed,
    /// and the timeline takes a mark only at a change or a second after the last.
    pub fn update(&self, phase: &str, fraction: f64, metrics: &[(&str, f64)]) {
        if let Some(i) = &self.inner {
            let mut s = i.snap.lock().unwrap_or_else(|e| e.into_inner());
            if s.phase != phase {
                s.phase.clear();
                s.phase.push_str(phase);
            }
            let iterations = i.iterations.load(Ordering::Relaxed);
            s.timeline.record(phase, gpuctl_core::now_ms(), iterations);
            s.fraction = fraction.clamp(0.0, 1.0);
            for (k, v) in metrics {
                if v.is_finite() {
                    s.metrics.insert(k.to_string(), *v);
                }
            }
        }
    }

    /// The workload enters a phase of `kind` (set-up until it says
    /// otherwise): rules judge the phases they name, so a workload says
    /// when it measures and when it only checks what it measured.
    pub fn enter(&self, kind: gpuctl_core::pb::PhaseKind) {
        if let Some(i) = &self.inner {
            let mut s = i.snap.lock().unwrap_or_else(|e| e.into_inner());
            let iterations = i.iterations.load(Ordering::Relaxed);
            s.timeline.enter(kind, gpuctl_core::now_ms(), iterations);
        }
    }

    /// Counts `n` units of work done; the counter only grows while the rank
    /// makes progress, which is what hang detection watches.
    pub fn tick(&self, n: u64) {
        if let Some(i) = &self.inner {
            i.iterations.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The rank's phase marks so far (none when progress is off).
    pub fn phases(&self) -> Vec<gpuctl_core::pb::PhaseMark> {
        self.inner.as_ref().map_or_else(Vec::new, |i| {
            let s = i.snap.lock().unwrap_or_else(|e| e.into_inner());
            s.timeline.marks().to_vec()
        })
    }

    /// Units of work counted so far (0 when progress is off).
    pub fn iterations(&self) -> u64 {
        self.inner
            .as_ref()
            .map_or(0, |i| i.iterations.load(Ordering::Relaxed))
    }

    /// Marks the rank as waiting for `what` (another rank's rendezvous key)
    /// until the guard drops: the coordinator then blames the rank waited
    /// for, never this one, when progress stops.
    pub fn waiting(&self, what: &str) -> Waiting<'_> {
        if let Some(i) = &self.inner {
            i.snap.lock().unwrap_or_else(|e| e.into_inner()).waiting_for = what.to_string();
        }
        Waiting(self)
    }

    pub fn message(&self, message: &str) {
        if let Some(i) = &self.inner {
            i.snap.lock().unwrap_or_else(|e| e.into_inner()).message = message.to_string();
        }
    }

    /// Stops the sender thread after one last report.
    pub fn finish(&self) {
        if let Some(i) = &self.inner {
            i.stop.store(true, Ordering::SeqCst);
            if let Some(h) = i.thread.lock().unwrap().take() {
                let _ = h.join();
            }
        }
    }
}

/// A rank's wait at the rendezvous; the mark clears when it drops.
pub struct Waiting<'a>(&'a Progress);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(i) = &self.0.inner {
            i.snap
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .waiting_for
                .clear();
        }
    }
}

fn progress_loop(
    rt: Runtime,
    client: WorkerServiceClient<Failover>,
    t: ProgressTarget,
    inner: Arc<ProgressInner>,
) {
    let mut failures = 0u32;
    // The coordinator says how often it wants reports (less often in big
    // jobs); a second until it has.
    let mut every = Duration::from_secs(1);
    let mut sent = 0u64;
    loop {
        let last = inner.stop.load(Ordering::SeqCst);
        if t.deadline_unix_ms > 0 && gpuctl_core::now_ms() > t.deadline_unix_ms {
            tracing::error!(
                "node {} rank {}: the job's deadline passed; exiting",
                t.node,
                t.rank
            );
            // SAFETY: _exit ends the process without running destructors that
            // could race the main thread's libtorch calls.
            unsafe { libc::_exit(1) };
        }
        let progress = {
            let s = inner.snap.lock().unwrap_or_else(|e| e.into_inner());
            RankProgress {
                rank: t.rank,
                node: t.node.clone(),
                phase: s.phase.clone(),
                fraction: s.fraction,
                metrics: s.metrics.clone(),
                message: s.message.clone(),
                unix_ms: gpuctl_core::now_ms(),
                iterations: inner.iterations.load(Ordering::Relaxed),
                waiting_for: s.waiting_for.clone(),
            }
        };
        let req = RankProgressReport {
            job_id: t.job_id.clone(),
            attempt: t.attempt,
            progress: Some(progress),
        };
        let mut c = client.clone();
        let mut req = Request::new(req);
        req.set_timeout(PROGRESS_TIMEOUT);
        match rt.block_on(c.report_progress(req)) {
            Ok(ack) => {
                failures = 0;
                let ack = ack.into_inner();
                if ack.next_report_ms > 0 {
                    every = Duration::from_millis(u64::from(ack.next_report_ms));
                }
                if !ack.ok && !last {
                    tracing::error!(
                        "node {} rank {}: the coordinator says the job is over ({}); exiting",
                        t.node,
                        t.rank,
                        ack.message
                    );
                    // SAFETY: as above.
                    unsafe { libc::_exit(1) };
                }
            }
            Err(status) => {
                failures += 1;
                if failures == 1 || failures == 30 || failures == 300 {
                    tracing::warn!("ReportProgress to {}: {}", t.url, status.message());
                }
            }
        }
        if last {
            return;
        }
        // Sleep until the next report, waking early to send the last one.
        sent += 1;
        let pause = gpuctl_core::spec::progress_pause_ms(every.as_millis() as u64, t.rank, sent);
        let until = std::time::Instant::now() + Duration::from_millis(pause);
        while std::time::Instant::now() < until {
            if inner.stop.load(Ordering::SeqCst) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

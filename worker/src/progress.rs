//! A rank's progress: its phase, fraction, metrics and work counter, sent to
//! the coordinator about once a second from a thread of its own (own runtime,
//! own connection), so that it keeps flowing, and a job that is over is
//! noticed, even while the main thread sits in a long GEMM or collective.
//! Apart from `client.rs` because the rendezvous marks its waits here
//! ([`crate::rendezvous::Watched`]): the client implements the rendezvous,
//! so progress living in it made the two modules name each other. Progress
//! needs no buffer: each report is the latest state, and a failed one is
//! just skipped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use gpuctl_core::clock::Clock;
use gpuctl_core::leader::Failover;
use gpuctl_proto::pb::{
    worker_service_client::WorkerServiceClient, RankProgress, RankProgressReport,
};
use tokio::runtime::Runtime;
use tonic::Request;

use crate::connect::{channel, runtime};
use crate::timeline::Timeline;

/// A progress report is worth little once it is late.
const PROGRESS_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// When marks are taken, reports sent and the deadline passes: the
    /// owner's, so that a test can hold it.
    clock: Clock,
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
    /// The first report waits this long (large jobs spread them).
    pub first_report: Duration,
}

impl Progress {
    pub fn disabled() -> Self {
        Progress { inner: None }
    }

    /// Keeps the phase and counter but sends nothing (tests, tools).
    pub fn local() -> Self {
        Self::local_on(Clock::system())
    }

    /// [`Progress::local`] whose marks read `clock`.
    pub fn local_on(clock: Clock) -> Self {
        Progress {
            inner: Some(Arc::new(ProgressInner {
                snap: Mutex::new(Snapshot::default()),
                iterations: AtomicU64::new(0),
                stop: AtomicBool::new(false),
                thread: Mutex::new(None),
                clock,
            })),
        }
    }

    /// Starts the sender thread. When the coordinator answers `Ack{ok:false}`
    /// (the job is over) or the deadline passes, the process exits with code 1
    /// at once: there is nothing left to report to.
    pub fn start(target: ProgressTarget, clock: Clock) -> Result<Self> {
        let mut timeline = Timeline::default();
        timeline.record("starting", clock.now_ms(), 0);
        let inner = Arc::new(ProgressInner {
            snap: Mutex::new(Snapshot {
                phase: "starting".into(),
                timeline,
                ..Default::default()
            }),
            iterations: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
            clock,
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
            s.timeline.record(phase, i.clock.now_ms(), iterations);
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
    pub fn enter(&self, kind: gpuctl_proto::pb::PhaseKind) {
        if let Some(i) = &self.inner {
            let mut s = i.snap.lock().unwrap_or_else(|e| e.into_inner());
            let iterations = i.iterations.load(Ordering::Relaxed);
            s.timeline.enter(kind, i.clock.now_ms(), iterations);
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
    pub fn phases(&self) -> Vec<gpuctl_proto::pb::PhaseMark> {
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

    /// What the rank waits for now (empty while it works).
    pub fn waiting_for(&self) -> String {
        self.inner.as_ref().map_or_else(String::new, |i| {
            i.snap
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .waiting_for
                .clone()
        })
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
    pause(&inner, t.first_report);
    loop {
        let last = inner.stop.load(Ordering::SeqCst);
        if t.deadline_unix_ms > 0 && inner.clock.now_ms() > t.deadline_unix_ms {
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
                unix_ms: inner.clock.now_ms(),
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
        let ms = gpuctl_core::spec::progress_pause_ms(every.as_millis() as u64, t.rank, sent);
        pause(&inner, Duration::from_millis(ms));
    }
}

/// Sleeps `d`, waking early when the rank stops.
fn pause(inner: &ProgressInner, d: Duration) {
    let until = std::time::Instant::now() + d;
    while std::time::Instant::now() < until {
        if inner.stop.load(Ordering::SeqCst) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_read_the_ranks_clock_and_a_held_one_takes_no_second_mark() {
        let clock = Clock::manual(1_000);
        let progress = Progress::local_on(clock.clone());
        progress.update("gemm", 0.1, &[]);
        // Time held still: the same phase is not marked again.
        progress.update("gemm", 0.2, &[]);
        clock.advance(Duration::from_secs(5));
        progress.update("gemm", 0.3, &[]);
        let at: Vec<u64> = progress.phases().iter().map(|m| m.unix_ms).collect();
        assert_eq!(at, [1_000, 6_000]);
    }
}

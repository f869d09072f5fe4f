//! Worker processes: one `gpuctl-worker` per rank of an assignment.
//!
//! Each worker runs in its own process group so that a kill reaches whatever
//! it started too (SIGTERM to the group, SIGKILL after the grace period). A
//! supervising task per rank forwards the worker's stdout and stderr lines as
//! `WorkerLog` batches, keeps the last stderr lines, and reports
//! `WorkerExited` when the worker ends, with why it was stopped if it was
//! (`StopReason`), or a line saying the kernel's OOM killer ended it (`oom.rs`).
//!
//! Workers are killed on `CancelJob`, when the assignment's deadline passes,
//! when the coordinator has been away for the agent's grace (or refuses a job
//! the agent kept) and when the agent shuts down: the agent never leaves a
//! worker behind. As last resorts, a dropped child is killed
//! (`kill_on_drop`) and the kernel kills a worker whose agent died
//! (`PR_SET_PDEATHSIG`).

//!
//! The manager is split by concern: `jobs.rs` (the job table), `start.rs`
//! (an assignment's workers started, or refused), `supervise.rs` (one
//! worker's life and exit), `stop.rs` (cancel, kill all), `deadline.rs`
//! (the assignment's deadline read through the manager's `Clock`).

mod command;
mod deadline;
mod events;
mod jobs;
mod logs;
pub mod oom;
mod prestart;
mod process;
mod procstat;
mod start;
mod stop;
mod supervise;

pub use command::{worker_command, WorkerCommand};
pub use events::EventReceiver;
pub(crate) use events::EventSender;
pub use jobs::GpuJob;
pub use process::{kill_group, signal_group, signal_name, spawn_in_group};
pub use start::job_folder;

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuctl_core::clock::Clock;
use gpuctl_proto::pb::{RunningJob, TelemetryBatch};
use tokio::sync::watch;

/// Time a worker gets between SIGTERM and SIGKILL.
pub const KILL_GRACE: Duration = Duration::from_secs(2);
/// A log batch is sent when it has this many lines...
const LOG_BATCH_LINES: usize = 50;
/// ...or when its first line is this old.
const LOG_FLUSH: Duration = Duration::from_millis(200);
/// Lines of stderr sent with `WorkerExited`.
const STDERR_TAIL_LINES: usize = 20;
/// Longer lines are cut, so that a worker printing without newlines cannot
/// grow the agent's memory.
const MAX_LINE_BYTES: usize = 16 * 1024;
/// Tells workers how long the agent keeps them without a coordinator (ms), so
/// that they hold an undelivered result that long (the worker reads it).
pub const COORDINATOR_GRACE_ENV: &str = "GPUCTL_COORDINATOR_GRACE_MS";
/// Exit code reported for a rank whose worker could not be started (the
/// shell's "command not found").
pub const SPAWN_FAILED_EXIT_CODE: i32 = 127;

/// Why a worker is stopped: the protocol's one list.
pub use gpuctl_proto::pb::StopReason;

/// What a `CancelJob` asks the workers' exits to say (unspecified: a cancel).
pub fn stop_reason_of(c: &gpuctl_proto::pb::CancelJob) -> StopReason {
    match c.stopped_by() {
        StopReason::Unspecified => StopReason::Cancel,
        r => r,
    }
}

/// What every worker of this agent shares.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// This node's name (`--node`).
    pub node: String,
    pub worker_bin: PathBuf,
    /// Each job gets a folder below it, the workers' working directory.
    pub work_dir: PathBuf,
    /// Built by `libtorch::ld_library_path`; `None` leaves the agent's own.
    pub ld_library_path: Option<OsString>,
    /// NVML index → UUID, for placements that give only a GPU index.
    pub gpu_uuids: HashMap<u32, String>,
    pub kill_grace: Duration,
}

// ───────────────────────────── the manager ─────────────────────────────

/// Starts, watches and kills this agent's workers.
pub struct Workers {
    settings: WorkerSettings,
    /// The URL workers are told (`RegisterResponse.coordinator_url`), unless an
    /// assignment names one.
    coordinator_url: Mutex<String>,
    /// `--coordinator-grace` in ms, handed to every worker.
    coordinator_grace_ms: AtomicU64,
    /// Every `--coordinator` URL, comma-separated, for workers to fail over
    /// to (`GPUCTL_COORDINATOR_URLS`) unless an assignment lists its own.
    coordinator_urls: String,
    /// The agent's relay (`crate::relay`), when workers call through it:
    /// then it is the only URL they are given.
    relay_url: std::sync::OnceLock<String>,
    jobs: jobs::JobTable,
    events: EventSender,
    /// Supervisors still running; `kill_all_and_wait` waits for zero.
    live: watch::Sender<usize>,
    /// Idle pre-started workers (off until `prestart`).
    prestarted: prestart::Pool,
    /// Where deadlines are read against wall time; a test's manual clock
    /// stands in for the system's.
    clock: Clock,
}

impl Workers {
    /// `coordinator_url`: the agent's `--coordinator`, one URL or several
    /// comma-separated (workers are told the first until the coordinator
    /// names its own URL, and get all of them to fail over to).
    pub fn new(settings: WorkerSettings, coordinator_url: String) -> (Arc<Workers>, EventReceiver) {
        Workers::with_clock(settings, coordinator_url, Clock::system())
    }

    /// As [`Workers::new`], reading the time of day from `clock`.
    pub fn with_clock(
        settings: WorkerSettings,
        coordinator_url: String,
        clock: Clock,
    ) -> (Arc<Workers>, EventReceiver) {
        let (events, receiver) = events::channel();
        let workers = Arc::new(Workers {
            prestarted: prestart::Pool::new(settings.clone()),
            settings,
            coordinator_grace_ms: AtomicU64::new(0),
            coordinator_url: Mutex::new(
                gpuctl_core::leader::split_urls(&coordinator_url)
                    .into_iter()
                    .next()
                    .unwrap_or_default(),
            ),
            coordinator_urls: coordinator_url,
            relay_url: std::sync::OnceLock::new(),
            jobs: jobs::JobTable::default(),
            events,
            live: watch::Sender::new(0),
            clock,
        });
        (workers, receiver)
    }

    /// The clock this agent reads the time of day from (the heartbeat's
    /// time, deadlines).
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    pub fn set_coordinator_url(&self, url: String) {
        *self.coordinator_url.lock().unwrap() = url;
    }

    /// Workers started from now on call the coordinator through the relay
    /// at `url` and know no other URL (the first call wins).
    pub fn relay_through(&self, url: String) {
        let _ = self.relay_url.set(url);
    }

    /// How long workers started from now on hold their results for a
    /// coordinator that is away (`--coordinator-grace`).
    pub fn set_coordinator_grace(&self, grace: Duration) {
        self.coordinator_grace_ms
            .store(grace.as_millis() as u64, Ordering::Relaxed);
    }

    /// Alive ranks per job, with each worker's process as /proc shows it
    /// now, for the heartbeat.
    pub fn running(&self) -> Vec<RunningJob> {
        self.jobs.running()
    }

    /// Jobs that run on GPUs of this node, with those GPUs (telemetry sends
    /// each job the samples of its own GPUs).
    pub fn gpu_jobs(&self) -> Vec<GpuJob> {
        self.jobs.gpu_jobs()
    }

    /// Where each job's workers run, one folder per job and attempt
    /// (`<job_folder>-a<attempt>`): what they write (a profile's trace) stays
    /// there.
    pub fn jobs_dir(&self) -> PathBuf {
        self.settings.work_dir.join("jobs")
    }

    /// Process ids of every live worker and prestarted worker (each leads its own
    /// process group), so that preflight can tell our GPU processes from
    /// strangers'.
    pub fn worker_pids(&self) -> BTreeSet<u32> {
        let mut pids: BTreeSet<u32> = self.prestarted.pids().into_iter().collect();
        pids.extend(self.jobs.pids());
        pids
    }

    /// Queues a telemetry batch for the coordinator (dropped, with a debug
    /// line, when the session is far behind).
    pub fn send_telemetry(&self, batch: TelemetryBatch) {
        if !self.events.send_telemetry(batch) {
            tracing::debug!("telemetry batch dropped: the coordinator is not keeping up");
        }
    }
}

#[cfg(test)]
mod tests;

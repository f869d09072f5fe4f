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

mod command;
mod events;
mod logs;
mod oom;
mod prestart;
mod process;
mod procstat;

pub use command::{worker_command, WorkerCommand};
pub use events::EventReceiver;
pub(crate) use events::EventSender;
pub use process::{kill_group, signal_group, signal_name, spawn_in_group};

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuctl_core::pb::{
    agent_message::Msg, Assignment, AssignmentAck, RankPlacement, RunningJob, TelemetryBatch,
    WorkerExited, WorkerLog,
};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep_until, Instant};

use logs::{batch_logs, read_lines};
use prestart::Launch;

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
pub use gpuctl_core::pb::StopReason;

/// What a `CancelJob` asks the workers' exits to say (unspecified: a cancel).
pub fn stop_reason_of(c: &gpuctl_core::pb::CancelJob) -> StopReason {
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

type JobKey = (String, u32);

struct JobEntry {
    /// Set once, to the first reason the job's workers must die for; every
    /// rank's supervisor watches it.
    kill: watch::Sender<Option<StopReason>>,
    /// Ranks whose worker is alive (for `Heartbeat.running`).
    alive: BTreeSet<u32>,
    /// NVML indices of the GPUs the job's ranks run on (for telemetry).
    gpus: BTreeSet<u32>,
    /// Rank → process id (= process group id) of its live worker.
    pids: HashMap<u32, u32>,
}

/// A job with GPUs on this node, as telemetry needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuJob {
    pub job_id: String,
    pub attempt: u32,
    /// NVML indices.
    pub gpus: Vec<u32>,
}

/// The coordinator URLs one assignment's workers are given.
struct Coordinators {
    /// `--coordinator` and `GPUCTL_COORDINATOR`.
    url: String,
    /// `GPUCTL_COORDINATOR_URLS`, comma-separated.
    all: String,
}

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
    jobs: Mutex<HashMap<JobKey, JobEntry>>,
    events: EventSender,
    /// Supervisors still running; `kill_all_and_wait` waits for zero.
    live: watch::Sender<usize>,
    /// Idle pre-started workers (off until `prestart`).
    prestarted: prestart::Pool,
}

impl Workers {
    /// `coordinator_url`: the agent's `--coordinator`, one URL or several
    /// comma-separated (workers are told the first until the coordinator
    /// names its own URL, and get all of them to fail over to).
    pub fn new(settings: WorkerSettings, coordinator_url: String) -> (Arc<Workers>, EventReceiver) {
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
            jobs: Mutex::new(HashMap::new()),
            events,
            live: watch::Sender::new(0),
        });
        (workers, receiver)
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
        let jobs = self.jobs.lock().unwrap();
        let mut out: Vec<RunningJob> = jobs
            .iter()
            .filter(|(_, j)| !j.alive.is_empty())
            .map(|((job_id, attempt), j)| {
                let mut processes: Vec<_> = j
                    .pids
                    .iter()
                    .filter_map(|(rank, pid)| procstat::read(*rank, *pid))
                    .collect();
                processes.sort_by_key(|p| p.rank);
                RunningJob {
                    job_id: job_id.clone(),
                    attempt: *attempt,
                    ranks: j.alive.iter().copied().collect(),
                    processes,
                }
            })
            .collect();
        out.sort_by(|a, b| (&a.job_id, a.attempt).cmp(&(&b.job_id, b.attempt)));
        out
    }

    /// Jobs that run on GPUs of this node, with those GPUs (telemetry sends
    /// each job the samples of its own GPUs).
    pub fn gpu_jobs(&self) -> Vec<GpuJob> {
        let jobs = self.jobs.lock().unwrap();
        let mut out: Vec<GpuJob> = jobs
            .iter()
            .filter(|(_, j)| !j.alive.is_empty() && !j.gpus.is_empty())
            .map(|((job_id, attempt), j)| GpuJob {
                job_id: job_id.clone(),
                attempt: *attempt,
                gpus: j.gpus.iter().copied().collect(),
            })
            .collect();
        out.sort_by(|a, b| (&a.job_id, a.attempt).cmp(&(&b.job_id, b.attempt)));
        out
    }

    /// Process ids of every live worker and prestarted worker (each leads its own
    /// process group), so that preflight can tell our GPU processes from
    /// strangers'.
    /// Where each job's workers run, one folder per job and attempt
    /// (`<job_folder>-a<attempt>`): what they write (a profile's trace) stays
    /// there.
    pub fn jobs_dir(&self) -> PathBuf {
        self.settings.work_dir.join("jobs")
    }

    pub fn worker_pids(&self) -> BTreeSet<u32> {
        let mut pids: BTreeSet<u32> = self.prestarted.pids().into_iter().collect();
        let jobs = self.jobs.lock().unwrap();
        pids.extend(jobs.values().flat_map(|j| j.pids.values().copied()));
        pids
    }

    /// Queues a telemetry batch for the coordinator (dropped, with a debug
    /// line, when the session is far behind).
    pub fn send_telemetry(&self, batch: TelemetryBatch) {
        if !self.events.send_telemetry(batch) {
            tracing::debug!("telemetry batch dropped: the coordinator is not keeping up");
        }
    }

    /// Refuses an assignment without starting anything: every rank gets a
    /// `WorkerExited` (as for a spawn failure) and the returned ack says why.
    pub fn refuse(&self, a: &Assignment, error: String) -> AssignmentAck {
        tracing::error!(job = %a.job_id, attempt = a.attempt, "refusing the assignment: {error}");
        for p in &a.ranks {
            self.report_spawn_failure(a, p.rank, &error);
        }
        AssignmentAck {
            job_id: a.job_id.clone(),
            attempt: a.attempt,
            ok: false,
            error,
            checks: Vec::new(),
        }
    }

    /// Starts one worker per rank of the assignment and returns the ack to
    /// send. On failure the ack says why, and every rank that did not start
    /// gets a `WorkerExited` so that the coordinator can fail the job at once.
    pub fn start(self: &Arc<Self>, a: Assignment) -> AssignmentAck {
        let key = (a.job_id.clone(), a.attempt);
        let ack = |ok: bool, error: String| AssignmentAck {
            job_id: a.job_id.clone(),
            attempt: a.attempt,
            ok,
            error,
            checks: Vec::new(),
        };
        if self.jobs.lock().unwrap().contains_key(&key) {
            // A repeated assignment (e.g. resent after a hiccup): already running.
            tracing::warn!(job = %a.job_id, attempt = a.attempt, "assignment already running; not starting it twice");
            return ack(true, String::new());
        }
        if a.ranks.is_empty() {
            tracing::warn!(job = %a.job_id, "assignment without ranks for this node");
            return ack(true, String::new());
        }
        if let Err(e) = check_executable(&self.settings.worker_bin) {
            let error = format!(
                "node {}: cannot start gpuctl-worker: {e}; build it next to gpuctl-agent (cargo build -p gpuctl-worker) or pass --worker-bin PATH",
                self.settings.node
            );
            tracing::error!(job = %a.job_id, "{error}");
            for p in &a.ranks {
                self.report_spawn_failure(&a, p.rank, &error);
            }
            return ack(false, error);
        }

        let coordinators = self.coordinators(&a);
        let (kill_tx, kill_rx) = watch::channel(None);
        self.jobs.lock().unwrap().insert(
            key.clone(),
            JobEntry {
                kill: kill_tx,
                alive: a.ranks.iter().map(|p| p.rank).collect(),
                gpus: a.ranks.iter().filter_map(|p| p.gpu_index).collect(),
                pids: HashMap::new(),
            },
        );
        let deadline = deadline_instant(a.deadline_unix_ms);
        let mut failure: Option<String> = None;
        for p in &a.ranks {
            if let Some(error) = &failure {
                // An earlier rank failed to start: the job cannot run here.
                self.report_spawn_failure(&a, p.rank, error);
                self.rank_done(&key, p.rank);
                continue;
            }
            match self.spawn_rank(&a, p, &coordinators) {
                Ok((child, prestarted)) => {
                    tracing::info!(job = %a.job_id, attempt = a.attempt, rank = p.rank, device = %p.device_label(),
                        pid = child.id().unwrap_or(0), prestarted, "worker started");
                    self.live.send_modify(|n| *n += 1);
                    if let Some(pid) = child.id() {
                        if let Some(j) = self.jobs.lock().unwrap().get_mut(&key) {
                            j.pids.insert(p.rank, pid);
                        }
                    }
                    let me = self.clone();
                    let rank = p.rank;
                    let (key, kill_rx) = (key.clone(), kill_rx.clone());
                    tokio::spawn(
                        async move { me.supervise(key, rank, child, kill_rx, deadline).await },
                    );
                }
                Err(e) => {
                    let error = format!(
                        "node {}: cannot start worker for rank {} ({}): {e}",
                        self.settings.node,
                        p.rank,
                        self.settings.worker_bin.display()
                    );
                    tracing::error!(job = %a.job_id, "{error}");
                    self.report_spawn_failure(&a, p.rank, &error);
                    self.rank_done(&key, p.rank);
                    failure = Some(error);
                }
            }
        }
        match failure {
            None => ack(true, String::new()),
            Some(error) => {
                // Do not leave the ranks that did start waiting for peers.
                self.cancel(&a.job_id, a.attempt, StopReason::Cancel);
                ack(false, error)
            }
        }
    }

    /// Asks every worker of the job (any attempt when `attempt` is 0) to die.
    /// Returns whether there was such a job.
    pub fn cancel(&self, job_id: &str, attempt: u32, reason: StopReason) -> bool {
        let jobs = self.jobs.lock().unwrap();
        let mut found = false;
        for ((id, att), j) in jobs.iter() {
            if id == job_id && (attempt == 0 || *att == attempt) {
                set_kill(&j.kill, reason);
                found = true;
            }
        }
        found
    }

    /// Asks every worker to die, then waits (up to `timeout`) until all have
    /// been reaped and their `WorkerExited` queued. Returns false on timeout.
    pub async fn kill_all_and_wait(&self, reason: StopReason, timeout: Duration) -> bool {
        let n = {
            let jobs = self.jobs.lock().unwrap();
            for j in jobs.values() {
                set_kill(&j.kill, reason);
            }
            jobs.len()
        };
        if n > 0 {
            tracing::warn!(jobs = n, reason = reason.label(), "killing all workers");
        }
        if reason == StopReason::AgentShutdown {
            self.prestarted.close().await;
        }
        let mut live = self.live.subscribe();
        let ok = tokio::time::timeout(timeout, live.wait_for(|n| *n == 0))
            .await
            .is_ok();
        if !ok {
            tracing::error!(
                reason = reason.label(),
                "workers still alive after {timeout:?}"
            );
        }
        ok
    }

    /// Number of worker processes being supervised.
    pub fn live_workers(&self) -> usize {
        *self.live.borrow()
    }

    fn report_spawn_failure(&self, a: &Assignment, rank: u32, error: &str) {
        self.events.send(Msg::WorkerExited(WorkerExited {
            job_id: a.job_id.clone(),
            attempt: a.attempt,
            rank,
            exit_code: SPAWN_FAILED_EXIT_CODE,
            signal: String::new(),
            stderr_tail: error.to_string(),
            stopped_by: StopReason::Unspecified as i32,
        }));
    }

    /// Forgets a rank; the job goes when its last rank does.
    fn rank_done(&self, key: &JobKey, rank: u32) {
        let mut jobs = self.jobs.lock().unwrap();
        if let Some(j) = jobs.get_mut(key) {
            j.alive.remove(&rank);
            j.pids.remove(&rank);
            if j.alive.is_empty() {
                jobs.remove(key);
            }
        }
    }

    /// Where the assignment's workers call: the relay, when there is one,
    /// and nothing else; else the assignment's URLs, or the agent's.
    fn coordinators(&self, a: &Assignment) -> Coordinators {
        if let Some(relay) = self.relay_url.get() {
            return Coordinators {
                url: relay.clone(),
                all: relay.clone(),
            };
        }
        Coordinators {
            url: if a.coordinator_url.is_empty() {
                self.coordinator_url.lock().unwrap().clone()
            } else {
                a.coordinator_url.clone()
            },
            all: if a.coordinator_urls.is_empty() {
                self.coordinator_urls.clone()
            } else {
                a.coordinator_urls.join(",")
            },
        }
    }

    /// Starts the rank's worker, from a prestarted worker when one can take it; says
    /// which.
    fn spawn_rank(
        &self,
        a: &Assignment,
        p: &RankPlacement,
        coordinators: &Coordinators,
    ) -> Result<(Child, bool), String> {
        let l = self.launch(a, p, coordinators)?;
        if let Some(child) = self.prestarted.launch(&l) {
            return Ok((child, true));
        }
        let mut cmd = Command::new(&self.settings.worker_bin);
        cmd.args(&l.args)
            .envs(l.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&l.dir)
            .stdin(Stdio::null());
        spawn_in_group(cmd)
            .map(|c| (c, false))
            .map_err(|e| e.to_string())
    }

    /// The rank's command line, environment and (created) working folder.
    fn launch(
        &self,
        a: &Assignment,
        p: &RankPlacement,
        coordinators: &Coordinators,
    ) -> Result<Launch, String> {
        let spec = worker_command(&self.settings, &coordinators.url, a, p)?;
        let dir = self
            .jobs_dir()
            .join(format!("{}-a{}", job_folder(&a.job_id), a.attempt));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create the working folder {}: {e}", dir.display()))?;
        let mut env = vec![(
            "GPUCTL_COORDINATOR_URLS".to_string(),
            coordinators.all.clone(),
        )];
        env.extend(spec.env);
        env.push((
            COORDINATOR_GRACE_ENV.to_string(),
            self.coordinator_grace_ms
                .load(Ordering::Relaxed)
                .to_string(),
        ));
        Ok(Launch {
            args: spec.args,
            env,
            dir,
        })
    }

    /// Watches one worker from spawn to `WorkerExited`.
    async fn supervise(
        self: Arc<Self>,
        key: JobKey,
        rank: u32,
        mut child: Child,
        mut kill_rx: watch::Receiver<Option<StopReason>>,
        deadline: Option<Instant>,
    ) {
        let pgid = child.id().unwrap_or(0) as i32;
        let oom = oom::OomWatch::start(child.id());
        let (line_tx, line_rx) = mpsc::channel(1024);
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            readers.push(tokio::spawn(read_lines(out, false, line_tx.clone())));
        }
        if let Some(err) = child.stderr.take() {
            readers.push(tokio::spawn(read_lines(err, true, line_tx.clone())));
        }
        drop(line_tx);
        let log = WorkerLog {
            job_id: key.0.clone(),
            attempt: key.1,
            rank,
            lines: Vec::new(),
        };
        let batcher = tokio::spawn(batch_logs(line_rx, log, self.events.clone()));

        let grace = self.settings.kill_grace;
        let deadline_passed = async {
            match deadline {
                Some(d) => sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let (status, killed) = tokio::select! {
            s = child.wait() => {
                // The worker ended by itself: anything it left in its group is an orphan.
                signal_group(pgid, libc::SIGKILL);
                (s, StopReason::Unspecified)
            }
            reason = wait_kill(&mut kill_rx) => (kill_group(pgid, &mut child, grace).await, reason),
            _ = deadline_passed => (kill_group(pgid, &mut child, grace).await, StopReason::Deadline),
        };

        // The pipes close when every process of the group is gone; something
        // that escaped the group could hold them open, so do not wait forever.
        let mut tail_wait = std::pin::pin!(tokio::time::sleep(grace));
        for r in &mut readers {
            tokio::select! {
                _ = &mut *r => {}
                _ = &mut tail_wait => {}
            }
        }
        for r in &readers {
            r.abort();
        }
        let mut tail = batcher.await.unwrap_or_default();

        let (exit_code, signal) = match &status {
            Ok(s) => match (s.code(), s.signal()) {
                (Some(c), _) => (c, String::new()),
                (None, Some(sig)) => (-1, signal_name(sig)),
                (None, None) => (-1, String::new()),
            },
            Err(e) => {
                tracing::error!(rank, error = %e, "cannot wait for worker");
                (-1, String::new())
            }
        };
        tail.extend(oom.verdict(&signal, killed));
        tracing::info!(job = %key.0, attempt = key.1, rank, exit_code, signal = %signal, stopped_by = killed.label(), "worker exited");
        self.events.send(Msg::WorkerExited(WorkerExited {
            job_id: key.0.clone(),
            attempt: key.1,
            rank,
            exit_code,
            signal,
            stderr_tail: tail.join("\n"),
            stopped_by: killed as i32,
        }));
        self.rank_done(&key, rank);
        self.live.send_modify(|n| *n -= 1);
        // The slot is free: its prestarted worker comes back.
        if self.prestarted.enabled() {
            self.prestarted.refill(self.busy_slots());
        }
    }
}

fn set_kill(kill: &watch::Sender<Option<StopReason>>, reason: StopReason) {
    // The first reason wins: a job cancelled and then cut off by a lost
    // coordinator was cancelled.
    kill.send_if_modified(|r| {
        if r.is_none() {
            *r = Some(reason);
            true
        } else {
            false
        }
    });
}

async fn wait_kill(rx: &mut watch::Receiver<Option<StopReason>>) -> StopReason {
    loop {
        if let Some(r) = *rx.borrow_and_update() {
            return r;
        }
        if rx.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

fn deadline_instant(deadline_unix_ms: u64) -> Option<Instant> {
    if deadline_unix_ms == 0 {
        return None;
    }
    let left = deadline_unix_ms.saturating_sub(gpuctl_core::now_ms());
    Some(Instant::now() + Duration::from_millis(left))
}

/// A job's id as the start of its folders' names: kept to a safe alphabet.
pub fn job_folder(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn check_executable(path: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a file", path.display()));
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(format!("{} is not executable", path.display()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_core::pb::JobSpec;

    /// Process ids whose process group is `pgid` and that are not zombies
    /// (a container's PID 1 may never reap reparented children).
    pub(super) fn settings(dir: &Path, worker_bin: PathBuf) -> WorkerSettings {
        WorkerSettings {
            node: "n1".into(),
            worker_bin,
            work_dir: dir.join("work"),
            ld_library_path: Some("/shim:/torch/lib".into()),
            gpu_uuids: HashMap::from([(3, "GPU-3333".to_string())]),
            kill_grace: Duration::from_millis(500),
        }
    }

    pub(super) fn assignment(ranks: &[(u32, Option<u32>)], deadline_unix_ms: u64) -> Assignment {
        Assignment {
            job_id: "job-7".into(),
            attempt: 2,
            spec: Some(JobSpec {
                workload: "stress".into(),
                duration_ms: 5000,
                params: [
                    ("size".to_string(), "256".to_string()),
                    ("precision".into(), "fp32".into()),
                ]
                .into(),
                env: [("NCCL_DEBUG".to_string(), "WARN".to_string())].into(),
                ..Default::default()
            }),
            ranks: ranks
                .iter()
                .enumerate()
                .map(|(i, (rank, dev))| RankPlacement {
                    rank: *rank,
                    local_rank: i as u32,
                    node_rank: 1,
                    node: "n1".into(),
                    gpu_index: *dev,
                    ..Default::default()
                })
                .collect(),
            env: [
                ("NCCL_DEBUG".to_string(), "INFO".to_string()),
                ("OMP_NUM_THREADS".into(), "4".into()),
            ]
            .into(),
            world_size: 4,
            node_rank: 1,
            nnodes: 2,
            master_addr: "10.0.0.1".into(),
            master_port: 29500,
            deadline_unix_ms,
            coordinator_url: String::new(),
            ..Default::default()
        }
    }

    #[test]
    fn worker_command_follows_the_contract() {
        let s = settings(Path::new("/tmp"), "/bin/true".into());
        let a = assignment(&[(2, Some(3)), (3, None)], 1_700_000_000_000);
        let c = worker_command(&s, "http://c:7070", &a, &a.ranks[0]).unwrap();
        let args = c.args.join(" ");
        assert_eq!(
            args,
            "--coordinator http://c:7070 --job-id job-7 --attempt 2 --workload stress --node n1 \
             --gpu-index 3 --gpu-uuid GPU-3333 --duration-ms 5000 \
             --deadline-unix-ms 1700000000000 --param precision=fp32 --param size=256"
        );
        let env: HashMap<_, _> = c.env.iter().cloned().collect();
        for (k, v) in [
            ("RANK", "2"),
            ("LOCAL_RANK", "0"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("GROUP_RANK", "1"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("OMP_NUM_THREADS", "4"),
            ("NCCL_DEBUG", "WARN"),
            ("CUDA_VISIBLE_DEVICES", "GPU-3333"),
            ("GPUCTL_COORDINATOR", "http://c:7070"),
            ("LD_LIBRARY_PATH", "/shim:/torch/lib"),
        ] {
            assert_eq!(env.get(k).map(String::as_str), Some(v), "{k}");
        }
        // Later entries win: the user's NCCL_DEBUG comes after the plan's.
        let last_nccl = c.env.iter().rev().find(|(k, _)| k == "NCCL_DEBUG").unwrap();
        assert_eq!(last_nccl.1, "WARN");

        let cpu = worker_command(&s, "http://c:7070", &a, &a.ranks[1]).unwrap();
        assert!(!cpu.args.iter().any(|x| x == "--device"));
        assert!(!cpu.args.iter().any(|x| x == "--gpu-index"));
        assert!(!cpu.env.iter().any(|(k, _)| k == "CUDA_VISIBLE_DEVICES"));

        let bad = assignment(&[(0, Some(9))], 0);
        assert!(worker_command(&s, "u", &bad, &bad.ranks[0])
            .unwrap_err()
            .contains("GPU 9"));
    }

    pub(super) fn script(dir: &Path, body: &str) -> PathBuf {
        let p = dir.join("fake-worker");
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    /// Collects events until every listed rank has exited.
    pub(super) async fn collect(
        events: &mut EventReceiver,
        ranks: usize,
    ) -> (Vec<WorkerLog>, Vec<WorkerExited>) {
        let (mut logs, mut exits) = (Vec::new(), Vec::new());
        while exits.len() < ranks {
            let m = tokio::time::timeout(Duration::from_secs(10), events.recv())
                .await
                .expect("no event within 10 s")
                .unwrap();
            match m.msg.unwrap() {
                Msg::Log(l) => logs.push(l),
                Msg::WorkerExited(e) => exits.push(e),
                other => panic!("unexpected {other:?}"),
            }
        }
        exits.sort_by_key(|e| e.rank);
        (logs, exits)
    }

    #[tokio::test]
    async fn worker_output_and_exit_are_reported() {
        let tmp = tempfile::tempdir().unwrap();
        let bin = script(
            tmp.path(),
            r#"echo "args: $*"; echo "rank=$RANK local=$LOCAL_RANK ld=$LD_LIBRARY_PATH"
i=0; while [ $i -lt 30 ]; do echo "err $i" >&2; i=$((i+1)); done
exit $((RANK + 3))"#,
        );
        let (w, mut events) = Workers::new(settings(tmp.path(), bin), "http://coord:1".into());
        let ack = w.start(assignment(&[(2, None), (3, None)], 0));
        assert!(ack.ok, "{}", ack.error);
        let (logs, exits) = collect(&mut events, 2).await;
        assert_eq!(
            exits
                .iter()
                .map(|e| (e.rank, e.exit_code))
                .collect::<Vec<_>>(),
            vec![(2, 5), (3, 6)]
        );
        for e in &exits {
            assert_eq!(e.stopped_by(), StopReason::Unspecified);
            assert_eq!((e.job_id.as_str(), e.attempt), ("job-7", 2));
            let tail: Vec<&str> = e.stderr_tail.lines().collect();
            assert_eq!(tail.len(), STDERR_TAIL_LINES);
            assert_eq!((tail[0], tail[19]), ("err 10", "err 29"));
        }
        let rank2: Vec<String> = logs
            .iter()
            .filter(|l| l.rank == 2)
            .flat_map(|l| l.lines.clone())
            .collect();
        assert!(
            rank2
                .iter()
                .any(|l| l.starts_with("args: --coordinator http://coord:1 --job-id job-7")),
            "{rank2:?}"
        );
        assert!(
            rank2.contains(&"rank=2 local=0 ld=/shim:/torch/lib".to_string()),
            "{rank2:?}"
        );
        assert_eq!(rank2.len(), 32);
        assert!(w.running().is_empty());
        assert_eq!(w.live_workers(), 0);
        assert!(tmp.path().join("work/jobs/job-7-a2").is_dir());
    }

    #[tokio::test]
    async fn cancel_kills_and_says_so() {
        let tmp = tempfile::tempdir().unwrap();
        let bin = script(tmp.path(), "echo started; exec sleep 100");
        let (w, mut events) = Workers::new(settings(tmp.path(), bin), "u".into());
        assert!(w.start(assignment(&[(0, None), (1, None)], 0)).ok);
        let running = w.running();
        assert_eq!(running.len(), 1);
        assert_eq!(running[0].ranks, vec![0, 1]);
        // Let the workers start before killing them.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let procs = &w.running()[0].processes;
        assert_eq!(procs.iter().map(|p| p.rank).collect::<Vec<_>>(), vec![0, 1]);
        assert!(
            procs
                .iter()
                .all(|p| p.pid > 0 && p.state_name == "sleeping"),
            "{procs:?}"
        );
        assert!(w.cancel("job-7", 0, StopReason::Hang));
        let (_, exits) = collect(&mut events, 2).await;
        for e in exits {
            assert_eq!(
                (e.exit_code, e.signal.as_str(), e.stopped_by().label()),
                (-1, "SIGTERM", "hang")
            );
        }
        assert!(w.running().is_empty());
        assert!(
            !w.cancel("job-7", 0, StopReason::Cancel),
            "job forgotten once its ranks are gone"
        );
        let ask = |why: StopReason| gpuctl_core::pb::CancelJob {
            stopped_by: why as i32,
            ..Default::default()
        };
        assert_eq!(
            stop_reason_of(&ask(StopReason::Unspecified)),
            StopReason::Cancel
        );
        assert_eq!(stop_reason_of(&ask(StopReason::Hang)), StopReason::Hang);
        assert_eq!(
            stop_reason_of(&ask(StopReason::Deadline)),
            StopReason::Deadline
        );
    }

    #[tokio::test]
    async fn deadline_and_kill_all() {
        let tmp = tempfile::tempdir().unwrap();
        let bin = script(tmp.path(), "exec sleep 100");
        let (w, mut events) = Workers::new(settings(tmp.path(), bin), "u".into());
        let deadline = gpuctl_core::now_ms() + 300;
        assert!(w.start(assignment(&[(0, None)], deadline)).ok);
        let (_, exits) = collect(&mut events, 1).await;
        assert_eq!(exits[0].stopped_by(), StopReason::Deadline);
        assert!(gpuctl_core::now_ms() >= deadline);

        let mut a = assignment(&[(0, None)], 0);
        a.job_id = "job-8".into();
        assert!(w.start(a).ok);
        assert!(
            w.kill_all_and_wait(StopReason::CoordinatorLost, Duration::from_secs(5))
                .await
        );
        let (_, exits) = collect(&mut events, 1).await;
        assert_eq!(exits[0].stopped_by(), StopReason::CoordinatorLost);
        assert_eq!(w.live_workers(), 0);
    }

    #[tokio::test]
    async fn missing_worker_binary_fails_the_assignment_clearly() {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("no-such-worker");
        let (w, mut events) = Workers::new(settings(tmp.path(), bin.clone()), "u".into());
        let ack = w.start(assignment(&[(0, None), (1, None)], 0));
        assert!(!ack.ok);
        assert!(
            ack.error.contains(&bin.display().to_string()),
            "{}",
            ack.error
        );
        assert!(ack.error.contains("--worker-bin"), "{}", ack.error);
        let (_, exits) = collect(&mut events, 2).await;
        assert_eq!(
            exits.iter().map(|e| e.exit_code).collect::<Vec<_>>(),
            vec![127, 127]
        );
        assert!(exits[0].stderr_tail.contains("--worker-bin"));
        assert!(w.running().is_empty());
    }

    #[tokio::test]
    async fn log_lines_are_batched_and_cut() {
        let tmp = tempfile::tempdir().unwrap();
        let bin = script(
            tmp.path(),
            r#"i=0; while [ $i -lt 120 ]; do echo "line $i"; i=$((i+1)); done
head -c 40000 /dev/zero | tr '\0' x; printf '\n'; printf 'no newline at end'"#,
        );
        let (w, mut events) = Workers::new(settings(tmp.path(), bin), "u".into());
        assert!(w.start(assignment(&[(0, None)], 0)).ok);
        let (logs, _) = collect(&mut events, 1).await;
        assert!(logs.iter().all(|l| l.lines.len() <= LOG_BATCH_LINES));
        let lines: Vec<String> = logs.into_iter().flat_map(|l| l.lines).collect();
        assert_eq!(lines.len(), 122);
        assert_eq!(lines[119], "line 119");
        assert!(lines[120].ends_with("[line cut by gpuctl-agent]"));
        assert!(lines[120].len() < MAX_LINE_BYTES + 64);
        assert_eq!(lines[121], "no newline at end");
    }
}

//! The job table: which jobs have live workers on this node, their ranks,
//! GPUs and process ids, and the kill signal each job's supervisors watch.
//!
//! Its own file because every other part of the manager (starting, stopping,
//! supervising, the prestarted pool, the heartbeat and telemetry) reads or
//! changes it, always under the one lock kept here, so none of them has to
//! know how an entry is laid out.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use gpuctl_proto::pb::{RunningJob, StopReason};
use tokio::sync::watch;

use super::procstat;

/// (job id, attempt).
pub(super) type JobKey = (String, u32);

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

#[derive(Default)]
pub(super) struct JobTable {
    jobs: Mutex<HashMap<JobKey, JobEntry>>,
}

impl JobTable {
    pub(super) fn contains(&self, key: &JobKey) -> bool {
        self.jobs.lock().unwrap().contains_key(key)
    }

    /// Enters a job whose `ranks` are about to start; returns what its
    /// supervisors watch for the order to kill.
    pub(super) fn insert(
        &self,
        key: JobKey,
        ranks: BTreeSet<u32>,
        gpus: BTreeSet<u32>,
    ) -> watch::Receiver<Option<StopReason>> {
        let (kill, kill_rx) = watch::channel(None);
        self.jobs.lock().unwrap().insert(
            key,
            JobEntry {
                kill,
                alive: ranks,
                gpus,
                pids: HashMap::new(),
            },
        );
        kill_rx
    }

    pub(super) fn set_pid(&self, key: &JobKey, rank: u32, pid: u32) {
        if let Some(j) = self.jobs.lock().unwrap().get_mut(key) {
            j.pids.insert(rank, pid);
        }
    }

    /// Forgets a rank; the job goes when its last rank does.
    pub(super) fn rank_done(&self, key: &JobKey, rank: u32) {
        let mut jobs = self.jobs.lock().unwrap();
        if let Some(j) = jobs.get_mut(key) {
            j.alive.remove(&rank);
            j.pids.remove(&rank);
            if j.alive.is_empty() {
                jobs.remove(key);
            }
        }
    }

    /// Orders every worker of the job (any attempt when `attempt` is 0) to
    /// die. Returns whether there was such a job.
    pub(super) fn kill(&self, job_id: &str, attempt: u32, reason: StopReason) -> bool {
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

    /// Orders every worker to die; returns how many jobs there were.
    pub(super) fn kill_all(&self, reason: StopReason) -> usize {
        let jobs = self.jobs.lock().unwrap();
        for j in jobs.values() {
            set_kill(&j.kill, reason);
        }
        jobs.len()
    }

    /// Alive ranks per job, with each worker's process as /proc shows it now.
    pub(super) fn running(&self) -> Vec<RunningJob> {
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

    pub(super) fn gpu_jobs(&self) -> Vec<GpuJob> {
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

    /// Process ids of every live worker of every job.
    pub(super) fn pids(&self) -> Vec<u32> {
        let jobs = self.jobs.lock().unwrap();
        jobs.values()
            .flat_map(|j| j.pids.values().copied())
            .collect()
    }

    /// Ranks with a live worker, all jobs together.
    pub(super) fn busy_slots(&self) -> usize {
        let jobs = self.jobs.lock().unwrap();
        jobs.values().map(|j| j.alive.len()).sum()
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

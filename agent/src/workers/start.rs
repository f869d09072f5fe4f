//! Starting an assignment's workers: checking the worker binary, entering
//! the job in the table, giving each rank its command line, environment,
//! coordinator URLs and working folder, spawning it (or handing the launch to
//! a prestarted worker) and handing the child to its supervisor; or refusing
//! the assignment with a `WorkerExited` per rank.
//!
//! Its own file because it is everything between an `Assignment` arriving and
//! a supervised child, which nothing else in the manager needs to know.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use gpuctl_proto::pb::{
    agent_message::Msg, Assignment, AssignmentAck, RankPlacement, WorkerExited,
};
use tokio::process::{Child, Command};

use super::deadline::deadline_instant;
use super::prestart::Launch;
use super::{
    spawn_in_group, worker_command, StopReason, Workers, COORDINATOR_GRACE_ENV,
    SPAWN_FAILED_EXIT_CODE,
};

/// The coordinator URLs one assignment's workers are given.
struct Coordinators {
    /// `--coordinator` and `GPUCTL_COORDINATOR`.
    url: String,
    /// `GPUCTL_COORDINATOR_URLS`, comma-separated.
    all: String,
}

impl Workers {
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
        if self.jobs.contains(&key) {
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
        let kill_rx = self.jobs.insert(
            key.clone(),
            a.ranks.iter().map(|p| p.rank).collect(),
            a.ranks.iter().filter_map(|p| p.gpu_index).collect(),
        );
        let deadline = deadline_instant(&self.clock, a.deadline_unix_ms);
        let mut failure: Option<String> = None;
        for p in &a.ranks {
            if let Some(error) = &failure {
                // An earlier rank failed to start: the job cannot run here.
                self.report_spawn_failure(&a, p.rank, error);
                self.jobs.rank_done(&key, p.rank);
                continue;
            }
            match self.spawn_rank(&a, p, &coordinators) {
                Ok((child, prestarted)) => {
                    tracing::info!(job = %a.job_id, attempt = a.attempt, rank = p.rank, device = %p.device_label(),
                        pid = child.id().unwrap_or(0), prestarted, "worker started");
                    self.live.send_modify(|n| *n += 1);
                    if let Some(pid) = child.id() {
                        self.jobs.set_pid(&key, p.rank, pid);
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
                    self.jobs.rank_done(&key, p.rank);
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

//! What the agent's session tests share beside the fake coordinator
//! (`gpuctl_testkit::FakeCoordinator`): the agent under test (its workers and
//! its session's settings), an assignment of one rank, and a shell-script
//! worker that writes its pid and sleeps.

#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use gpuctl_agent::session::SessionConfig;
use gpuctl_agent::workers::{EventReceiver, WorkerSettings, Workers};
use gpuctl_proto::pb::HostFacts;

use gpuctl_proto::pb::{
    coordinator_message, Assignment, CoordinatorMessage, JobSpec, RankPlacement,
};

/// The workers of node `test-node`, each a [`worker_script`] saying `say`,
/// working under `dir` and told the coordinator at `url`.
pub fn workers(dir: &Path, say: &str, url: &str) -> (Arc<Workers>, EventReceiver) {
    let settings = WorkerSettings {
        node: "test-node".into(),
        worker_bin: worker_script(dir, say),
        work_dir: dir.join("work"),
        ld_library_path: None,
        gpu_uuids: Default::default(),
        kill_grace: Duration::from_millis(500),
    };
    Workers::new(settings, url.to_string())
}

/// The session of node `test-node` with the coordinator at `url`: no GPU, no
/// preflight, and workers that die with the session (no grace); tests set
/// what they are about with struct update syntax.
pub fn config(url: &str) -> SessionConfig {
    SessionConfig {
        coordinator: url.to_string(),
        name: "test-node".into(),
        facts: HostFacts::default(),
        gpus: vec![],
        heartbeat_interval: Duration::from_secs(1),
        pace: Default::default(),
        preflight: vec![],
        checker: None,
        connected: Arc::new(AtomicBool::new(false)),
        coordinator_grace: Duration::ZERO,
        relay: None,
    }
}

pub fn assignment(job: &str) -> CoordinatorMessage {
    CoordinatorMessage {
        msg: Some(coordinator_message::Msg::Assignment(Assignment {
            job_id: job.into(),
            attempt: 1,
            spec: Some(JobSpec {
                workload: "stress".into(),
                ..Default::default()
            }),
            ranks: vec![RankPlacement {
                rank: 0,
                node: "test-node".into(),
                ..Default::default()
            }],
            world_size: 1,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            ..Default::default()
        })),
    }
}

pub fn pid_alive(pid: i32) -> bool {
    // A zombie counts as dead: it no longer runs anything.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit_once(')')
            .map(|(_, r)| r.trim_start().starts_with('Z'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

pub async fn read_pid(path: &Path) -> i32 {
    for _ in 0..500 {
        if let Ok(s) = std::fs::read_to_string(path) {
            if let Ok(p) = s.trim().parse() {
                return p;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("worker never wrote {}", path.display());
}

/// A worker that prints `say` (shell words: `$4` is its job id), writes its
/// pid to `dir/pid-JOB` and sleeps.
pub fn worker_script(dir: &Path, say: &str) -> PathBuf {
    let p = dir.join("fake-worker");
    std::fs::write(
        &p,
        format!(
            "#!/bin/sh\necho \"{say}\"\necho $$ > {}/pid-$4\nexec sleep 100\n",
            dir.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

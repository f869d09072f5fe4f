//! What the agent's session tests share beside the fake coordinator
//! (`gpuctl_testkit::FakeCoordinator`): an assignment of one rank, and a
//! shell-script worker that writes its pid and sleeps.

#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpuctl_core::pb::{
    coordinator_message, Assignment, CoordinatorMessage, JobSpec, RankPlacement,
};

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

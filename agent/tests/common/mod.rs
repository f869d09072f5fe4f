//! What the agent's session tests share: reading the agent's messages off a
//! stand-in coordinator's stream, an assignment of one rank, and a
//! shell-script worker that writes its pid and sleeps.

#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpuctl_core::pb::{
    agent_message::Msg, coordinator_message, AgentMessage, Assignment, CoordinatorMessage, JobSpec,
    RankPlacement,
};
use tonic::Streaming;

pub async fn next(inbound: &mut Streaming<AgentMessage>) -> Msg {
    tokio::time::timeout(Duration::from_secs(10), inbound.message())
        .await
        .expect("agent sent nothing within 10 s")
        .expect("stream error")
        .expect("stream ended")
        .msg
        .expect("empty message")
}

/// Reads until `want` matches, skipping heartbeats and other messages.
pub async fn until<T>(
    inbound: &mut Streaming<AgentMessage>,
    want: impl Fn(&Msg) -> Option<T>,
) -> T {
    loop {
        let m = next(inbound).await;
        if let Some(t) = want(&m) {
            return t;
        }
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

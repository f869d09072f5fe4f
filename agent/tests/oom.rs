//! A worker the kernel's OOM killer ends is reported as out of memory, not
//! only as "killed by signal SIGKILL": a real (shell-script) worker joins a
//! memory cgroup with a 64 MiB limit that this test makes, grows until the
//! kernel kills it, and its `WorkerExited` says so, naming the group and the
//! memory it had reached, also when the agent's last look finds it dead and
//! not yet reaped. Needs root and a memory cgroup controller; a machine
//! without them fails the test saying so.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{assignment, pid_alive};
use gpuctl_agent::workers::oom::OomWatch;
use gpuctl_agent::workers::{WorkerSettings, Workers};
use gpuctl_proto::pb::{agent_message::Msg, coordinator_message, StopReason};

const LIMIT: u64 = 64 << 20;

/// A memory cgroup with a limit, removed on drop (its one process is dead by then).
struct MemLimit(PathBuf);

impl MemLimit {
    fn new(name: &str) -> MemLimit {
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let (dir, file) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.join(name), "memory.limit_in_bytes")
        } else {
            let root = Path::new("/sys/fs/cgroup");
            let controllers =
                std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
            assert!(
                controllers.split_whitespace().any(|c| c == "memory"),
                "neither cgroup v1's memory controller nor v2's (controllers: {controllers}): this test needs one"
            );
            let _ = std::fs::write(root.join("cgroup.subtree_control"), "+memory");
            (root.join(name), "memory.max")
        };
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).unwrap_or_else(|e| {
            panic!(
                "cannot create {} ({e}): this test needs root and a writable memory cgroup",
                dir.display()
            )
        });
        std::fs::write(dir.join(file), LIMIT.to_string()).unwrap();
        MemLimit(dir)
    }
}

impl Drop for MemLimit {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A worker script: into the group, a pause so that the agent sees it there,
/// then a string doubled until the group's limit is reached.
fn hungry_worker(dir: &Path, group: &MemLimit) -> PathBuf {
    let script = dir.join("hungry-worker");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho $$ > {}/cgroup.procs\nsleep 1\nx=0123456789abcdef\nwhile :; do x=\"$x$x\"; sleep 0.2; done\n",
            group.0.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

#[tokio::test]
async fn a_worker_the_oom_killer_ends_is_reported_out_of_memory_with_its_size() {
    let tmp = tempfile::tempdir().unwrap();
    let name = format!("gpuctl-test-oom-{}", std::process::id());
    let group = MemLimit::new(&name);
    let script = hungry_worker(tmp.path(), &group);
    let settings = WorkerSettings {
        node: "test-node".into(),
        worker_bin: script,
        work_dir: tmp.path().join("work"),
        ld_library_path: None,
        gpu_uuids: Default::default(),
        kill_grace: Duration::from_millis(500),
    };
    let (workers, mut events) = Workers::new(settings, "http://127.0.0.1:1".into());
    let Some(coordinator_message::Msg::Assignment(a)) = assignment("job-oom").msg else {
        unreachable!()
    };
    assert!(workers.start(a).ok);
    let exited = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match events.recv().await.expect("events end").msg {
                Some(Msg::WorkerExited(e)) => return e,
                _ => continue,
            }
        }
    })
    .await
    .expect("the worker was not killed within 60 s");
    assert_eq!(exited.signal, "SIGKILL", "{exited:?}");
    let line = exited.stderr_tail.lines().last().unwrap_or_default();
    assert!(
        line.starts_with("ERROR out of memory in its memory cgroup")
            && line.contains(&name)
            && line.contains("limit 64 MiB")
            && line.contains("the kernel's OOM killer"),
        "{exited:?}"
    );
    // The string had doubled to some MiB when the agent last looked.
    let reached = line
        .split("resident peak at the agent's last look was ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no figure in {line}"));
    assert!(reached > 0.0, "{line}");
}

/// A killed worker not yet reaped reads as in the hierarchy's root: looks
/// taken then must not hide the group it died in (CI saw this race once).
#[tokio::test]
async fn a_worker_looked_at_after_its_kill_and_before_its_reaping_still_names_its_group() {
    let tmp = tempfile::tempdir().unwrap();
    let name = format!("gpuctl-test-oom-zombie-{}", std::process::id());
    let group = MemLimit::new(&name);
    let mut child = std::process::Command::new(hungry_worker(tmp.path(), &group))
        .spawn()
        .unwrap();
    let watch = OomWatch::start(Some(child.id()));
    let died = tokio::time::timeout(Duration::from_secs(60), async {
        // Not reaped until after the verdict: not alive means a zombie.
        while pid_alive(child.id() as i32) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    if died.is_err() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the worker was not killed within 60 s");
    }
    // Two of the watch's looks (every 500 ms) land on the zombie.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let line = watch
        .verdict("SIGKILL", StopReason::Unspecified)
        .expect("no OOM line for a worker the OOM killer ended");
    let _ = child.wait();
    assert!(
        line.starts_with("ERROR out of memory in its memory cgroup")
            && line.contains(&name)
            && line.contains("limit 64 MiB"),
        "{line}"
    );
}

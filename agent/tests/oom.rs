//! A worker the kernel's OOM killer ends is reported as out of memory, not
//! only as "killed by signal SIGKILL": a real (shell-script) worker joins a
//! memory cgroup with a 64 MiB limit that this test makes, grows until the
//! kernel kills it, and its `WorkerExited` says so, naming the group and the
//! memory it had reached. Needs root and a memory cgroup controller; a
//! machine without them fails the test saying so.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::assignment;
use gpuctl_agent::workers::{WorkerSettings, Workers};
use gpuctl_proto::pb::{agent_message::Msg, coordinator_message};

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

#[tokio::test]
async fn a_worker_the_oom_killer_ends_is_reported_out_of_memory_with_its_size() {
    let tmp = tempfile::tempdir().unwrap();
    let name = format!("gpuctl-test-oom-{}", std::process::id());
    let group = MemLimit::new(&name);
    // The worker: into the group, a pause so that the agent sees it there,
    // then a string doubled until the group's limit is reached.
    let script = tmp.path().join("hungry-worker");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho $$ > {}/cgroup.procs\nsleep 1\nx=0123456789abcdef\nwhile :; do x=\"$x$x\"; sleep 0.2; done\n",
            group.0.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
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

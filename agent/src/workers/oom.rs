//! A worker the kernel's OOM killer ended, told apart from one SIGKILLed by
//! anyone else, so that its rank says "out of host memory" (or out of its
//! memory cgroup's limit) with the memory it had reached, not only "killed
//! by signal SIGKILL" (issue 47). The kernel's log is often not readable;
//! its counters are: `/proc/vmstat`'s `oom_kill` for the host and the
//! worker's memory cgroup's `oom_kill`, read when the worker starts and
//! again when it was SIGKILLed. The worker's resident peak (`VmHWM`) is
//! read now and then while it lives: after the kill there is nothing left
//! to read. Every memory cgroup the worker was seen in is kept, because a
//! killed worker not yet reaped reads as in the hierarchy's root: the group
//! it died in must not be forgotten at that last look.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuctl_core::host_memory::{host_oom_kills, mem_available, MemCgroup};
use gpuctl_core::units::format_bytes;
use gpuctl_proto::pb::StopReason;

/// How often a worker's resident peak and memory cgroup are read.
const EVERY: Duration = Duration::from_millis(500);

/// How many distinct memory cgroups of one worker are kept (it joins one or
/// two; its zombie reads as the root).
const MAX_GROUPS: usize = 8;

/// What is known of one worker's memory while it runs.
struct Seen {
    pid: u32,
    host_kills: Option<u64>,
    /// Each memory cgroup it was seen in, oldest first, with that group's
    /// OOM kills when first seen there.
    groups: Mutex<Vec<(MemCgroup, Option<u64>)>>,
    peak_rss: AtomicU64,
}

impl Seen {
    fn look(&self) {
        if let Some(hwm) = read_hwm(self.pid) {
            self.peak_rss.fetch_max(hwm, Ordering::Relaxed);
        }
        let Some(now) = MemCgroup::of(Some(self.pid)) else {
            return;
        };
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        if groups.len() < MAX_GROUPS && groups.iter().all(|(was, _)| was.path != now.path) {
            let kills = now.oom_kills();
            groups.push((now, kills));
        }
    }
}

/// `VmHWM` of `/proc/PID/status`, in bytes.
fn read_hwm(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    gpuctl_core::host_memory::parse_meminfo(&s, "VmHWM")
}

/// Watches one worker from its start; the watching stops when this is dropped.
pub struct OomWatch {
    seen: Arc<Seen>,
    task: tokio::task::JoinHandle<()>,
}

impl OomWatch {
    pub fn start(pid: Option<u32>) -> OomWatch {
        let seen = Arc::new(Seen {
            pid: pid.unwrap_or(0),
            host_kills: host_oom_kills(),
            groups: Mutex::new(Vec::new()),
            peak_rss: AtomicU64::new(0),
        });
        let s = seen.clone();
        let task = tokio::spawn(async move {
            if s.pid == 0 {
                return;
            }
            loop {
                s.look();
                tokio::time::sleep(EVERY).await;
            }
        });
        OomWatch { seen, task }
    }

    /// For a worker that ended by a SIGKILL its agent did not send: the
    /// line that says the kernel's OOM killer ended it, when a counter moved
    /// since it started.
    pub fn verdict(&self, signal: &str, stopped_by: StopReason) -> Option<String> {
        if signal != "SIGKILL" || stopped_by != StopReason::Unspecified {
            return None;
        }
        let rss = self.seen.peak_rss.load(Ordering::Relaxed);
        let reached = if rss > 0 {
            format!(
                "; its resident peak at the agent's last look was {}",
                format_bytes(rss)
            )
        } else {
            String::new()
        };
        // The kernel counts a kill in the victim's group even when the host
        // ran out: the group is named only where one of its levels has a
        // limit. The newest group first: v2 counts a kill in every ancestor.
        let groups = self.seen.groups.lock().unwrap_or_else(|e| e.into_inner());
        for (g, before) in groups.iter().rev() {
            let Some(before) = *before else { continue };
            let after = g.oom_kills().unwrap_or(before);
            if after <= before {
                continue;
            }
            // Read only for a group whose counter moved.
            if let Some(limit) = g.levels().iter().find_map(|l| l.limit()) {
                return Some(format!(
                    "ERROR out of memory in its memory cgroup {} (limit {}): the kernel's OOM killer ended the worker{reached} (the group's oom_kill {before} -> {after})",
                    g.path,
                    format_bytes(limit)
                ));
            }
        }
        let (before, after) = (self.seen.host_kills?, host_oom_kills()?);
        (after > before).then(|| {
            let avail = mem_available()
                .map(|a| format!("; MemAvailable now {}", format_bytes(a)))
                .unwrap_or_default();
            format!(
                "ERROR out of host memory: the kernel's OOM killer ended the worker{reached} (the host's oom_kill {before} -> {after}{avail})"
            )
        })
    }
}

impl Drop for OomWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

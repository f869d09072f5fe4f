//! A real CPU quota on a process tree, the way a throttled or oversubscribed
//! host looks from inside: cgroup v1's `cpu.cfs_quota_us` where the machine
//! mounts the v1 cpu controller, cgroup v2's `cpu.max` otherwise; and a real
//! memory limit, the way a small host or a container looks (v1's
//! `memory.limit_in_bytes`, v2's `memory.max`). Processes the limited process
//! starts afterwards (an agent's workers) inherit it; or on a node's ranks
//! alone, its agent left free. Each group's name ends
//! with this test process's id and a count, so that tests of two runs on one
//! machine never share a group. Needs root; a machine without either
//! fails the test saying so.

use std::path::{Path, PathBuf};

const V1_CPU: &str = "/sys/fs/cgroup/cpu";
const V1_MEMORY: &str = "/sys/fs/cgroup/memory";
const V2_ROOT: &str = "/sys/fs/cgroup";
const PERIOD_US: u64 = 100_000;

/// `name` made this process's own: `name-PID-N`.
fn unique(name: &str) -> String {
    static COUNT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{name}-{}-{n}", std::process::id())
}

/// A cgroup with a CPU quota; its processes go back to the root cgroup and
/// the cgroup is removed when this is dropped.
pub struct CpuQuota {
    dir: PathBuf,
    root: PathBuf,
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| {
        panic!(
            "cannot write `{text}` to {}: {e} (a cgroup limit needs root and a writable cgroup controller)",
            path.display()
        )
    });
}

impl CpuQuota {
    /// Limits `pid`, its children and what it starts later to `cores` of CPU
    /// time, e.g. 0.25 for a quarter of one core. A node throttled once it
    /// is up: its prestarted workers have loaded their libraries first.
    pub fn apply(name: &str, pid: u32, cores: f64) -> CpuQuota {
        wait_prestarted_loaded(pid);
        let (root, dir) = group(name, cores);
        move_tree(&dir, pid);
        CpuQuota { dir, root }
    }

    /// Limits the ranks the agent `agent` starts from now on to `cores` of
    /// CPU time together, and leaves the agent itself free: a node whose
    /// ranks compute slowly but which still answers. Each worker is moved
    /// into the group as it takes a job (a prestarted worker loads libtorch
    /// before that, free), for as long as this lives.
    ///
    /// Throttled whole, a node's agent at a few hundredths of a core relayed
    /// its ranks' progress and rendezvous calls past their timeouts, and the
    /// workers it prestarted between jobs loaded libtorch at that rate: the
    /// ranks were judged hung instead of slow (a full CI run, 2026-11-30).
    pub fn on_ranks(name: &str, agent: u32, cores: f64) -> RankQuota {
        wait_prestarted_loaded(agent);
        let (root, dir) = group(name, cores);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watch = {
            let (dir, stop) = (dir.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut moved = std::collections::BTreeSet::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for p in descendants(agent) {
                        // A move that failed (the worker between exec and
                        // its job, say) is tried again next time.
                        if !moved.contains(&p)
                            && ranked(p)
                            && std::fs::write(dir.join("cgroup.procs"), p.to_string()).is_ok()
                        {
                            moved.insert(p);
                        }
                    }
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
            })
        };
        RankQuota {
            _quota: CpuQuota { dir, root },
            stop,
            watch: Some(watch),
        }
    }
}

/// A [`CpuQuota`] on an agent's ranks ([`CpuQuota::on_ranks`]); the watch
/// ends and the ranks go free when this is dropped.
pub struct RankQuota {
    /// Dropped after the watch ends: the ranks go back, the group goes.
    _quota: CpuQuota,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    watch: Option<std::thread::JoinHandle<()>>,
}

impl Drop for RankQuota {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(w) = self.watch.take() {
            let _ = w.join();
        }
    }
}

/// `pid`'s program and its first argument, from `/proc/PID/cmdline`.
fn program_and_flag(pid: u32) -> (Vec<u8>, Vec<u8>) {
    let args = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let mut it = args.split(|b| *b == 0);
    let program = it.next().unwrap_or_default().to_vec();
    (program, it.next().unwrap_or_default().to_vec())
}

/// Whether `pid` is a worker waiting for its job (`gpuctl-worker --prestarted`).
fn prestarted(pid: u32) -> bool {
    program_and_flag(pid).1 == b"--prestarted"
}

/// Whether `pid` is a worker that has taken a job (a rank).
fn ranked(pid: u32) -> bool {
    let (program, flag) = program_and_flag(pid);
    program.ends_with(b"gpuctl-worker") && flag != b"--prestarted"
}

/// The `read` system call's number, which a prestarted worker sits in once
/// its libraries are loaded.
#[cfg(target_arch = "x86_64")]
const SYS_READ: &str = "0";
#[cfg(target_arch = "aarch64")]
const SYS_READ: &str = "63";

/// Waits until every prestarted worker of `pid`'s tree waits on its stdin
/// for a job. Loading libtorch costs a worker 1-3 s of CPU in static
/// initialisers before `main`; a quota of a few hundredths of a core
/// applied while an agent's fresh worker is still loading stretches that
/// past the 120 s hang timeout, and the slowed rank is judged hung before
/// it computes anything (CI, 2026-11-30: five tests). Which phase a quota
/// lands in then depends on the host's speed; after this wait it always
/// lands on the work the test judges.
fn wait_prestarted_loaded(pid: u32) {
    let loading = || -> Vec<u32> {
        descendants(pid)
            .into_iter()
            .filter(|&p| {
                // `NR fd ...`: a read of fd 0, or the process is gone.
                let waiting = std::fs::read_to_string(format!("/proc/{p}/syscall"))
                    .map(|s| {
                        let mut f = s.split_whitespace();
                        f.next() == Some(SYS_READ) && f.next() == Some("0x0")
                    })
                    .unwrap_or(true);
                prestarted(p) && !waiting && !zombie(p)
            })
            .collect()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let left = loading();
        if left.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "prestarted workers {left:?} of {pid}'s tree still loading after 120 s: is the host this busy?"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// cgroup v2's root with `controller` enabled for the groups under it;
/// fails saying `what` cannot be set when the machine has no such controller.
fn v2_with(controller: &str, what: &str) -> PathBuf {
    let root = PathBuf::from(V2_ROOT);
    let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    assert!(
        controllers.split_whitespace().any(|c| c == controller),
        "cgroup v2 at {V2_ROOT} has no {controller} controller (controllers: {controllers}); {what} cannot be set"
    );
    let _ = std::fs::write(
        root.join("cgroup.subtree_control"),
        format!("+{controller}"),
    );
    root
}

/// A new cpu cgroup of `cores` of CPU time: (the root it hangs under, it).
fn group(name: &str, cores: f64) -> (PathBuf, PathBuf) {
    let name = &unique(name);
    let quota = ((cores * PERIOD_US as f64) as u64).max(1_000);
    let v1 = Path::new(V1_CPU).join("cpu.cfs_quota_us").exists();
    let root = if v1 {
        PathBuf::from(V1_CPU)
    } else if Path::new(V2_ROOT).join("cgroup.controllers").exists() {
        v2_with("cpu", "a CPU quota")
    } else {
        panic!(
            "this machine has neither cgroup v1's {V1_CPU}/cpu.cfs_quota_us nor cgroup v2's {V2_ROOT}/cgroup.controllers: a CPU quota cannot be set"
        );
    };
    let dir = root.join(name);
    let _ = std::fs::remove_dir(&dir);
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create cgroup {}: {e}", dir.display()));
    if v1 {
        write(&dir.join("cpu.cfs_period_us"), &PERIOD_US.to_string());
        write(&dir.join("cpu.cfs_quota_us"), &quota.to_string());
    } else {
        write(&dir.join("cpu.max"), &format!("{quota} {PERIOD_US}"));
    }
    (root, dir)
}

/// Moves `pid` and every process of its tree into the group at `dir`.
fn move_tree(dir: &Path, pid: u32) {
    // The whole tree: an agent keeps pre-started workers, which must
    // run under the limit like the workers it starts later. Sweeps
    // repeat until every live process of the tree is in the group by
    // its own /proc/PID/cgroup: a move can fail for a process in the
    // middle of exiting or being started (a CI run saw one left in the
    // root group after two blind sweeps), and a child forked since the
    // last listing is in the group by inheritance or caught next time.
    write(&dir.join("cgroup.procs"), &pid.to_string());
    let name = format!("/{}", dir.file_name().unwrap_or_default().to_string_lossy());
    let outside = || -> Vec<(u32, String)> {
        std::iter::once(pid)
            .chain(descendants(pid))
            .filter_map(|p| {
                let groups = std::fs::read_to_string(format!("/proc/{p}/cgroup")).ok()?;
                let inside = groups.lines().any(|l| l.ends_with(&name));
                (!inside && !zombie(p)).then_some((p, groups))
            })
            .collect()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let left = outside();
        if left.is_empty() {
            // Once more after a pause, for a child forked by a process
            // the listing had not reached yet.
            std::thread::sleep(std::time::Duration::from_millis(200));
            if outside().is_empty() {
                break;
            }
            continue;
        }
        if std::time::Instant::now() > deadline {
            let (p, groups) = &left[0];
            panic!(
                "process {p} (of {pid}'s tree) is not in cgroup {} after 10 s of moving it: {groups}",
                dir.display()
            );
        }
        for (p, _) in &left {
            let _ = std::fs::write(dir.join("cgroup.procs"), p.to_string());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The fields of `/proc/PID/stat` after the command name (which may hold
/// spaces and parentheses): state first, then the parent's pid.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// Whether `pid` has exited and waits to be reaped (or is gone).
fn zombie(pid: u32) -> bool {
    stat_fields(pid).is_none_or(|f| f.first().is_some_and(|s| s == "Z" || s == "X"))
}

/// Every process whose parent chain leads to `pid`.
fn descendants(pid: u32) -> Vec<u32> {
    let parent_of = |p: u32| -> Option<u32> { stat_fields(p)?.get(1)?.parse().ok() };
    let all: Vec<u32> = std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    all.into_iter()
        .filter(|&p| {
            let mut cur = p;
            for _ in 0..64 {
                match parent_of(cur) {
                    Some(pp) if pp == pid => return true,
                    Some(pp) if pp > 1 => cur = pp,
                    _ => return false,
                }
            }
            false
        })
        .collect()
}

/// A memory cgroup with a limit; its processes go back to the root group
/// and the group is removed when this is dropped.
pub struct MemoryLimit {
    pub dir: PathBuf,
    root: PathBuf,
    /// The group's path as `/proc/PID/cgroup` shows it.
    pub path: String,
}

impl MemoryLimit {
    /// Limits what `pid`, its children and what it starts later may hold
    /// together to `bytes`, the kernel's OOM killer ending one past it.
    pub fn apply(name: &str, pid: u32, bytes: u64) -> MemoryLimit {
        let name = unique(name);
        let v1 = Path::new(V1_MEMORY);
        let (root, file) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.to_path_buf(), "memory.limit_in_bytes")
        } else if Path::new(V2_ROOT).join("cgroup.controllers").exists() {
            (v2_with("memory", "a memory limit"), "memory.max")
        } else {
            panic!(
                "this machine has neither cgroup v1's {V1_MEMORY} nor cgroup v2's {V2_ROOT}/cgroup.controllers: a memory limit cannot be set"
            );
        };
        let dir = root.join(&name);
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create cgroup {}: {e}", dir.display()));
        write(&dir.join(file), &bytes.to_string());
        move_tree(&dir, pid);
        MemoryLimit {
            dir,
            root,
            path: format!("/{name}"),
        }
    }

    /// How many processes of the group the kernel's OOM killer ended.
    pub fn oom_kills(&self) -> u64 {
        let file = if self.dir.join("memory.oom_control").exists() {
            "memory.oom_control"
        } else {
            "memory.events"
        };
        let text = std::fs::read_to_string(self.dir.join(file)).unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no oom_kill count in {}: {text}", self.dir.display()))
    }
}

impl Drop for MemoryLimit {
    fn drop(&mut self) {
        drain(&self.dir, &self.root);
    }
}

/// Moves every process of the group at `dir` to `root`, then removes it.
fn drain(dir: &Path, root: &Path) {
    for _ in 0..50 {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        if procs.trim().is_empty() {
            break;
        }
        for pid in procs.split_whitespace() {
            let _ = std::fs::write(root.join("cgroup.procs"), pid);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir(dir);
}

impl Drop for CpuQuota {
    /// The quota is lifted first, so that a process the quota'd one forks
    /// while the others are moved out (an agent prestarts a worker as a job
    /// ends) is not left throttled: once, one stayed behind, the cgroup
    /// could not be removed, and the next job of a "healthy again" node ran
    /// at 0.07x. Processes are then moved out until none is left.
    fn drop(&mut self) {
        let v1 = self.dir.join("cpu.cfs_quota_us");
        let _ = if v1.exists() {
            std::fs::write(v1, "-1")
        } else {
            std::fs::write(self.dir.join("cpu.max"), "max")
        };
        drain(&self.dir, &self.root);
    }
}

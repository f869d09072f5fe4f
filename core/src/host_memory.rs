//! Host memory as the kernel accounts it, for the processes that must stay
//! inside it: what `/proc/meminfo` calls available, the kernel's count of
//! OOM kills (`/proc/vmstat`), and the memory cgroup a process is in (cgroup
//! v1's memory controller, else v2's unified hierarchy) with the limit,
//! usage and OOM kills of every level up to the hierarchy's root. A worker
//! searching for the largest batch sizes its budget from these; an agent
//! whose worker was SIGKILLed reads the OOM counts to say it was the kernel.
//! Paths come from `/proc/PID/cgroup` mapped through `/proc/self/mountinfo`,
//! so a cgroup namespace or a container's mount root reads right.

use std::path::{Path, PathBuf};

/// A figure in kB from `/proc/meminfo`'s text, in bytes.
pub fn parse_meminfo(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        let kb: u64 = rest.split_whitespace().next()?.parse().ok()?;
        Some(kb * 1024)
    })
}

/// `MemAvailable`: what the host can give without swapping, page cache it
/// would drop included.
pub fn mem_available() -> Option<u64> {
    parse_meminfo(
        &std::fs::read_to_string("/proc/meminfo").ok()?,
        "MemAvailable",
    )
}

/// A counter of `/proc/vmstat` (or of a cgroup's `memory.events`, v1's
/// `memory.oom_control`: the same `name value` lines).
pub fn parse_counter(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        (w.next()? == key).then(|| w.next()?.parse().ok())?
    })
}

/// How many processes the kernel's OOM killer ended since boot, in any
/// cgroup (Linux 4.13+).
pub fn host_oom_kills() -> Option<u64> {
    parse_counter(&std::fs::read_to_string("/proc/vmstat").ok()?, "oom_kill")
}

/// Where a memory hierarchy is mounted: the cgroup path its root shows
/// (`/` unless in a container) and the folder it is mounted on.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Mount {
    root: String,
    dir: PathBuf,
}

/// cgroup v1's memory controller mount, and the v2 (unified) mount.
fn parse_mountinfo(text: &str) -> (Option<Mount>, Option<Mount>) {
    let (mut v1, mut v2) = (None, None);
    for l in text.lines() {
        // Fields before " - " are the mount's; after it: type, source, options.
        let Some((mine, theirs)) = l.split_once(" - ") else {
            continue;
        };
        let f: Vec<&str> = mine.split_whitespace().collect();
        let t: Vec<&str> = theirs.split_whitespace().collect();
        let (Some(root), Some(dir), Some(kind)) = (f.get(3), f.get(4), t.first()) else {
            continue;
        };
        let m = Mount {
            root: root.to_string(),
            dir: PathBuf::from(dir),
        };
        match *kind {
            "cgroup"
                if t.get(2)
                    .is_some_and(|o| o.split(',').any(|o| o == "memory")) =>
            {
                v1.get_or_insert(m);
            }
            "cgroup2" => {
                v2.get_or_insert(m);
            }
            _ => {}
        }
    }
    (v1, v2)
}

/// The process's cgroup path in v1's memory hierarchy and in v2's.
fn parse_proc_cgroup(text: &str) -> (Option<String>, Option<String>) {
    let (mut v1, mut v2) = (None, None);
    for l in text.lines() {
        let mut f = l.splitn(3, ':');
        let (Some(id), Some(ctl), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if id == "0" && ctl.is_empty() {
            v2 = Some(path.to_string());
        } else if ctl.split(',').any(|c| c == "memory") {
            v1 = Some(path.to_string());
        }
    }
    (v1, v2)
}

/// `path` under `mount`, when the mount shows it.
fn under(mount: &Mount, path: &str) -> Option<PathBuf> {
    let rel = if mount.root == "/" {
        path
    } else {
        path.strip_prefix(mount.root.as_str())?
    };
    Some(mount.dir.join(rel.trim_start_matches('/')))
}

/// One memory cgroup: its path as `/proc/PID/cgroup` names it, its folder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemCgroup {
    pub path: String,
    pub dir: PathBuf,
    pub v2: bool,
}

/// A level of a process's memory cgroups that has a limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limited {
    pub path: String,
    pub limit: u64,
    /// The limit less what the group holds (page cache it can drop aside).
    pub room: u64,
}

/// v1 writes "no limit" as the largest page-aligned i64; v2 as `max`.
const NO_LIMIT: u64 = 1 << 62;

fn read_u64(p: &Path) -> Option<u64> {
    let t = std::fs::read_to_string(p).ok()?;
    let t = t.trim();
    if t == "max" {
        return Some(u64::MAX);
    }
    t.parse().ok()
}

impl MemCgroup {
    /// The memory cgroup of process `pid` (`None`: this process); `None`
    /// where no memory controller is mounted or the process is gone.
    pub fn of(pid: Option<u32>) -> Option<MemCgroup> {
        let who = pid.map_or("self".to_string(), |p| p.to_string());
        let groups = std::fs::read_to_string(format!("/proc/{who}/cgroup")).ok()?;
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let (p1, p2) = parse_proc_cgroup(&groups);
        let (m1, m2) = parse_mountinfo(&mounts);
        if let (Some(p), Some(m)) = (p1, m1) {
            let dir = under(&m, &p)?;
            return Some(MemCgroup {
                path: p,
                dir,
                v2: false,
            });
        }
        let (p, m) = (p2?, m2?);
        let dir = under(&m, &p)?;
        // A v2 hierarchy without the memory controller has no memory files.
        dir.join("memory.current").exists().then_some(MemCgroup {
            path: p,
            dir,
            v2: true,
        })
    }

    fn file(&self, v1: &str, v2: &str) -> PathBuf {
        self.dir.join(if self.v2 { v2 } else { v1 })
    }

    /// This group and each parent up to the hierarchy's root (as mounted).
    pub fn levels(&self) -> Vec<MemCgroup> {
        let mut out = vec![self.clone()];
        let (mut path, mut dir) = (self.path.clone(), self.dir.clone());
        while path.len() > 1 && dir.join("cgroup.procs").exists() {
            let Some((parent, _)) = path.rsplit_once('/') else {
                break;
            };
            let Some(up) = dir.parent() else { break };
            if !up.join("cgroup.procs").exists() {
                break;
            }
            path = if parent.is_empty() {
                "/".into()
            } else {
                parent.into()
            };
            dir = up.to_path_buf();
            out.push(MemCgroup {
                path: path.clone(),
                dir: dir.clone(),
                v2: self.v2,
            });
        }
        out
    }

    /// The group's limit; `None` when it has none.
    pub fn limit(&self) -> Option<u64> {
        read_u64(&self.file("memory.limit_in_bytes", "memory.max")).filter(|&l| l < NO_LIMIT)
    }

    /// What the group holds now, less the inactive page cache the kernel
    /// drops before it kills anything.
    pub fn usage(&self) -> Option<u64> {
        let used = read_u64(&self.file("memory.usage_in_bytes", "memory.current"))?;
        let stat = std::fs::read_to_string(self.dir.join("memory.stat")).unwrap_or_default();
        let key = if self.v2 {
            "inactive_file"
        } else {
            "total_inactive_file"
        };
        Some(used.saturating_sub(parse_counter(&stat, key).unwrap_or(0)))
    }

    /// How many processes the OOM killer ended in this group (v1 counts
    /// since Linux 4.13, v2 since 4.13 too).
    pub fn oom_kills(&self) -> Option<u64> {
        let text =
            std::fs::read_to_string(self.file("memory.oom_control", "memory.events")).ok()?;
        parse_counter(&text, "oom_kill")
    }

    /// The most the group ever held (v2: Linux 5.19+).
    pub fn peak(&self) -> Option<u64> {
        read_u64(&self.file("memory.max_usage_in_bytes", "memory.peak"))
    }

    /// Every level with a limit, with its room now.
    pub fn limited(&self) -> Vec<Limited> {
        self.levels()
            .into_iter()
            .filter_map(|g| {
                let limit = g.limit()?;
                let room = limit.saturating_sub(g.usage().unwrap_or(0));
                Some(Limited {
                    path: g.path,
                    limit,
                    room,
                })
            })
            .collect()
    }
}

/// Whether cgroup `path` is `level` or inside it.
pub fn within(path: &str, level: &str) -> bool {
    level == "/"
        || path == level
        || path
            .strip_prefix(level)
            .is_some_and(|rest| rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_and_counters_parse() {
        let m = "MemTotal:       24000000 kB\nMemFree: 100 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(parse_meminfo(m, "MemAvailable"), Some(20_000_000 * 1024));
        assert_eq!(parse_meminfo(m, "MemFree"), Some(100 * 1024));
        assert_eq!(parse_meminfo(m, "Mem"), None);
        let v = "oom_kill_x 9\noom_kill 3\n";
        assert_eq!(parse_counter(v, "oom_kill"), Some(3));
        assert_eq!(
            parse_counter("oom_kill_disable 0\nunder_oom 0\noom_kill 2", "oom_kill"),
            Some(2)
        );
        assert_eq!(parse_counter("", "oom_kill"), None);
    }

    #[test]
    fn cgroup_paths_map_through_the_mounts() {
        let mounts = "\
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 /ctr /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
        let (v1, v2) = parse_mountinfo(mounts);
        let v1 = v1.unwrap();
        assert_eq!(v1.dir, PathBuf::from("/sys/fs/cgroup/memory"));
        assert_eq!(v2.unwrap().dir, PathBuf::from("/sys/fs/cgroup/unified"));
        let groups = "9:name=systemd:/\n4:memory:/ctr/job/a\n1:cpu:/\n0::/user.slice\n";
        let (p1, p2) = parse_proc_cgroup(groups);
        assert_eq!(p1.as_deref(), Some("/ctr/job/a"));
        assert_eq!(p2.as_deref(), Some("/user.slice"));
        assert_eq!(
            under(&v1, "/ctr/job/a"),
            Some(PathBuf::from("/sys/fs/cgroup/memory/job/a"))
        );
        assert_eq!(under(&v1, "/other"), None);
    }

    #[test]
    fn levels_nest_by_path() {
        assert!(within("/a/b", "/a"));
        assert!(within("/a", "/a"));
        assert!(within("/x", "/"));
        assert!(!within("/ab", "/a"));
        assert!(!within("/a", "/a/b"));
    }

    #[test]
    fn this_process_reads_what_the_host_has() {
        // Every Linux host has these; a test machine without them is no
        // place to run gpuctl's workers.
        assert!(mem_available().is_some_and(|b| b > 0));
        assert!(host_oom_kills().is_some());
        if let Some(g) = MemCgroup::of(None) {
            let levels = g.levels();
            assert_eq!(levels[0], g);
            assert!(levels.iter().all(|l| l.dir.is_dir()), "{levels:?}");
            assert!(g.usage().is_some(), "{g:?}");
        }
    }
}

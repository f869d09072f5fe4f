//! What the bench reads of the coordinator process from /proc: CPU seconds
//! used, resident memory and major page faults; the host's file refaults;
//! the size of its data folder (the store); and from its `/metrics`, the
//! allocator's live bytes.

use std::path::Path;

/// Fields 3 on of a process's stat(5) line: field `n` is at index `n - 3`.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) start after ')'.
    let rest = stat.rsplit_once(')')?.1;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// CPU seconds (user + system) a process has used so far.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let f = stat_fields(pid)?;
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some((utime + stime) / hz.max(1.0))
}

/// Major page faults so far: pages the process waited on the disk for.
pub fn major_faults(pid: u32) -> Option<u64> {
    // majflt is field 12.
    stat_fields(pid)?.get(9)?.parse().ok()
}

/// File pages the host read back in after evicting them, so far
/// (`workingset_refault_file`). A host that reclaims page cache behind the
/// bench's back (a memory monitor's pageout, say) makes the store read
/// from disk what it had just written.
pub fn host_file_refaults() -> Option<u64> {
    let vmstat = std::fs::read_to_string("/proc/vmstat").ok()?;
    let line = vmstat
        .lines()
        .find(|l| l.starts_with("workingset_refault_file "))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Resident set size in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    status_bytes(pid, "VmRSS:")
}

/// The kernel's high-water mark of a process's resident memory: the peak
/// over its whole life, which no sampling misses.
pub fn hwm_bytes(pid: u32) -> Option<u64> {
    status_bytes(pid, "VmHWM:")
}

fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// A process's resident memory read every 100 ms on a thread of its own:
/// at a job's end the simulator's runtime is too busy to sample on time,
/// and a peak between its samples would go unseen.
pub struct Watch {
    /// The highest reading since the last [`Watch::take`], and when.
    peak: std::sync::Mutex<Option<(u64, std::time::Instant)>>,
}

impl Watch {
    /// Watches `pid` until the process is gone.
    pub fn start(pid: u32) -> std::sync::Arc<Watch> {
        let w = std::sync::Arc::new(Watch {
            peak: std::sync::Mutex::new(None),
        });
        let me = w.clone();
        std::thread::spawn(move || {
            while let Some(rss) = rss_bytes(pid) {
                let mut p = me.peak.lock().unwrap();
                if p.is_none_or(|(b, _)| rss > b) {
                    *p = Some((rss, std::time::Instant::now()));
                }
                drop(p);
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        });
        w
    }

    /// The highest reading since the last call, and when it was taken.
    pub fn take(&self) -> Option<(u64, std::time::Instant)> {
        self.peak.lock().unwrap().take()
    }
}

/// Bytes of every file under `dir`.
pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// The coordinator allocator's live bytes, from its `/metrics` at `addr`
/// (`gpuctl_coordinator_heap_bytes{kind="allocated"}`).
pub async fn heap_allocated(addr: &str) -> Option<u64> {
    let within = std::time::Duration::from_secs(10);
    let scrape = gpuctl_core::metrics_http::get(addr, "/metrics", within)
        .await
        .ok()?;
    let series = "gpuctl_coordinator_heap_bytes{kind=\"allocated\"}";
    let value = gpuctl_core::metrics_http::value(&scrape.body, series)?;
    Some(value as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        // Burn a little CPU so the counter is not zero (black_box: a
        // release build folded the loop away).
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        assert!(x != 1);
        assert!(cpu_seconds(me).unwrap() > 0.0);
        assert!(rss_bytes(me).unwrap() > 1 << 20);
        let dir = std::env::temp_dir().join(format!("gpuctl-sim-probe-{me}"));
        std::fs::create_dir_all(dir.join("a")).unwrap();
        std::fs::write(dir.join("a/f"), vec![0u8; 1000]).unwrap();
        assert_eq!(dir_bytes(&dir), 1000);
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn rusage_majflt() -> u64 {
        // SAFETY: getrusage fills the zeroed struct it is given.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) }, 0);
        u.ru_majflt as u64
    }

    /// Reads a file through a mapping after dropping it from the page
    /// cache: at least one major fault.
    fn fault_from_disk() {
        use std::os::fd::AsRawFd;
        // Beside the test binary: a disk-backed folder (a tmpfs /tmp would
        // keep the pages in memory, and fault nothing from disk).
        let exe = std::env::current_exe().unwrap();
        let path = exe.with_file_name(format!("probe-majflt-{}", std::process::id()));
        let len = 4 << 20;
        std::fs::write(&path, vec![7u8; len]).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        f.sync_all().unwrap();
        let fd = f.as_raw_fd();
        // SAFETY: a read-only shared mapping of a file of `len` bytes that
        // stays open and unchanged while it is read, then unmapped.
        unsafe {
            assert_eq!(libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED), 0);
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            let bytes = std::slice::from_raw_parts(p as *const u8, len);
            let sum: u64 = bytes.iter().step_by(4096).map(|&b| b as u64).sum();
            assert_eq!(std::hint::black_box(sum), 7 * (len as u64 / 4096));
            libc::munmap(p, len);
        }
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn major_faults_are_the_kernels_count_for_the_process() {
        let me = std::process::id();
        let first = major_faults(me).expect("/proc/self/stat");
        fault_from_disk();
        let before = rusage_majflt();
        let read = major_faults(me).expect("/proc/self/stat");
        let after = rusage_majflt();
        // Fields next to majflt (minor faults, or the children's counts,
        // which stay 0 here) would fall outside these bounds.
        assert!(read > first, "no major fault counted: {first} then {read}");
        assert!(
            before <= read && read <= after,
            "{before} <= {read} <= {after}"
        );
        assert!(host_file_refaults().is_some(), "/proc/vmstat");
    }
}

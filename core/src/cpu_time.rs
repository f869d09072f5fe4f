//! The CPU time a thread has used, read from the kernel's per-thread clock.
//! Beside a wall time it tells work that waited for a core from work that had
//! much to do (the coordinator's report builds), and it is what a loader
//! thread spends to make a sample cost what an operator's pipeline costs
//! (`--loader-cpu-us`).

/// CPU time the calling thread has used, µs (0 where it cannot be read).
pub fn thread_cpu_us() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes the one `timespec` it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } != 0 {
        return 0;
    }
    t.tv_sec as u64 * 1_000_000 + t.tv_nsec as u64 / 1_000
}

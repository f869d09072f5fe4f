//! A thread's CPU priority. The simulated fleet, the coordinator and the
//! bench's CLI calls share one host; in a real fleet each runs on machines
//! of its own. Linux's nice is per thread, so each part is given its own.

/// Sets the calling thread's nice to `nice` (-20..=19; below 0 needs
/// `CAP_SYS_NICE`). 0 leaves it as it is. Why it could not be set, if not.
pub fn set_thread_nice(nice: i32) -> std::io::Result<()> {
    if nice == 0 {
        return Ok(());
    }
    // SAFETY: gettid and setpriority on the calling thread, no pointers.
    let rc = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice)
    };
    match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

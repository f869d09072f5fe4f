//! Stopping a rank that is blocked in a collective. The agent stops a worker
//! with SIGTERM (then SIGKILL); a rank blocked in NCCL would leave its
//! kernels spinning on the GPU until the process is gone, and NCCL may keep a
//! peer's kernels waiting too. So once a communicator exists, a watcher thread
//! takes SIGTERM: it aborts every live NCCL communicator (`ncclCommAbort`
//! ends their kernels), then ends the process by SIGTERM as before, without
//! running destructors that would race the blocked main thread.
//!
//! The TCP backend needs nothing more: the kernel closes its sockets with the
//! process, and the peers' reads fail at once. First, what the rank measured
//! so far goes to the coordinator (`crate::partial`).
//!
//! A backend registers each communicator with the call that aborts it, so
//! this watcher knows handles and callbacks only, never the backend: the
//! NCCL module depends on it, not the other way round.

use std::sync::{Mutex, Once};

/// Ends a communicator's work at once, given its raw handle.
pub type Abort = fn(usize);

/// The communicators alive now: each raw handle (an `ncclComm_t` pointer)
/// with the call that aborts it.
static LIVE: Mutex<Vec<(usize, Abort)>> = Mutex::new(Vec::new());
static WATCH: Once = Once::new();

/// Installs the SIGTERM watcher (once per process); called when a
/// communicator is made.
pub fn watch_sigterm() {
    WATCH.call_once(|| {
        let started = std::thread::Builder::new()
            .name("sigterm".into())
            .spawn(|| {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::warn!(
                            "no SIGTERM watcher (runtime: {e}); NCCL is not aborted on stop"
                        );
                        return;
                    }
                };
                let got = rt.block_on(async {
                    use tokio::signal::unix::{signal, SignalKind};
                    let mut s = signal(SignalKind::terminate())?;
                    s.recv().await;
                    Ok::<_, std::io::Error>(())
                });
                if let Err(e) = got {
                    tracing::warn!("no SIGTERM watcher ({e}); NCCL is not aborted on stop");
                    return;
                }
                stop_now();
            });
        if let Err(e) = started {
            tracing::warn!("no SIGTERM watcher ({e}); NCCL is not aborted on stop");
        }
    });
}

/// Aborts every live communicator, then dies of SIGTERM. The lock stays held:
/// a communicator being dropped meanwhile waits rather than being destroyed
/// twice.
fn stop_now() -> ! {
    // Before the communicators go: the figures measured so far are the
    // rank's evidence of what it saw before the job failed.
    crate::partial::send(std::time::Duration::from_secs(2));
    let live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    if !live.is_empty() {
        eprintln!(
            "gpuctl-worker: SIGTERM: aborting {} NCCL communicator(s)",
            live.len()
        );
    }
    for &(comm, abort) in live.iter() {
        abort(comm);
    }
    // SAFETY: plain libc calls; restoring the default action makes the agent
    // see death by SIGTERM, as without this watcher. _exit is the fallback.
    unsafe {
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
        libc::raise(libc::SIGTERM);
        libc::_exit(128 + libc::SIGTERM)
    }
}

/// A communicator to abort on SIGTERM, by `abort`.
pub fn register(comm: usize, abort: Abort) {
    watch_sigterm();
    LIVE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((comm, abort));
}

/// Forgets a communicator before it is destroyed.
pub fn unregister(comm: usize) {
    LIVE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|&(c, _)| c != comm);
}

/// How many communicators are registered (for tests).
pub fn live() -> usize {
    LIVE.lock().unwrap_or_else(|e| e.into_inner()).len()
}

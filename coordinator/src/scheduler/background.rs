//! Work the scheduler hands off its task: freeing a big job's parts,
//! copying a report for each reader, judging a job and encoding what the
//! store gets of it. Judging runs at a lower CPU priority than the runtime,
//! which answers people and agents: on a small host a 32,768-rank judge,
//! its telemetry encoding and the store's commit took both cores for most
//! of a second, and `gpuctl nodes` waited 200-260 ms behind them.

use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use super::events::Event;

/// How much nicer than the coordinator judging threads run (`nice(1)`'s
/// scale; weight 526 against 1,024 when the CPU is contended). At 10
/// (weight 110), 16,384 simulated nodes × 8 on 2 cores had 9,000-240,000
/// result calls past their deadline and sent again in each of 8 runs, and
/// `gpuctl fleet` p99 100-187 ms in the short jobs; at 3, none in 3 runs
/// and 71-109 ms, but on a busier hour of the same day 21,000-158,000 in
/// 4 of 5 runs: fewer, not none (docs/benchmarks.md, 2026-12-04).
const JUDGE_NICE: i32 = 3;

/// Runs `work` on a blocking thread, off the scheduler's task. Outside a
/// runtime (tests) it runs here.
pub fn off_task(work: impl FnOnce() + Send + 'static) {
    match tokio::runtime::Handle::try_current() {
        Ok(h) => drop(h.spawn_blocking(work)),
        Err(_) => work(),
    }
}

/// Runs `work` on the calling thread. On a worker of a multi-threaded
/// runtime the thread first hands its other tasks to another (tokio's
/// `block_in_place`), so `work` may take milliseconds, and the task goes
/// on with its result without waiting in a run queue again.
pub fn in_place<R>(work: impl FnOnce() -> R) -> R {
    if multi_threaded() {
        tokio::task::block_in_place(work)
    } else {
        // A current-thread runtime (tests) cannot hand its tasks off.
        work()
    }
}

/// Waits for `rx` on the calling thread, out of the runtime's rotation
/// (see [`in_place`]): the answer wakes this thread itself, where a woken
/// task would queue behind every task woken before it.
pub async fn recv_in_place<T>(rx: oneshot::Receiver<T>) -> Result<T, oneshot::error::RecvError> {
    if multi_threaded() {
        tokio::task::block_in_place(move || rx.blocking_recv())
    } else {
        // On a current-thread runtime the sender's task needs this thread.
        rx.await
    }
}

fn multi_threaded() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// Drops `v` on a blocking thread: freeing a big job's parts (hundreds of
/// MB in small allocations) would hold the scheduler for a good part of a
/// second.
pub fn drop_later<T: Send + 'static>(v: T) {
    off_task(move || drop(v));
}

/// Runs `work` on a thread of its own at a lower CPU priority. Not on
/// tokio's blocking pool: a thread's priority cannot be raised again
/// without privilege, and the pool's threads also decode what people read.
pub fn judge<F: FnOnce() + Send + 'static>(name: &str, work: F) {
    // Kept here too: a thread that cannot start still leaves the work to do
    // (a job waits for its verdict).
    let slot = Arc::new(Mutex::new(Some(work)));
    let theirs = slot.clone();
    // In the runtime's context, as the blocking pool's threads are: the work
    // may spawn a task (waiting on the store's commit).
    let rt = tokio::runtime::Handle::try_current().ok();
    let spawned = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let _rt = rt.as_ref().map(tokio::runtime::Handle::enter);
            lower_priority();
            if let Some(work) = take(&theirs) {
                work();
            }
        });
    if let Err(e) = spawned {
        warn!("could not start a thread to judge on ({e}); judging on the blocking pool");
        if let Some(work) = take(&slot) {
            off_task(work);
        }
    }
}

fn take<F>(slot: &Mutex<Option<F>>) -> Option<F> {
    slot.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// Sends an event from a thread off the runtime to the scheduler's first
/// lane; a stopped scheduler drops it.
pub fn send(lane: &mpsc::WeakSender<Event>, ev: impl Into<Event>) {
    match lane.upgrade() {
        Some(tx) => {
            if tx.blocking_send(ev.into()).is_err() {
                debug!("scheduler stopped; event dropped");
            }
        }
        None => debug!("scheduler stopped; event dropped"),
    }
}

/// Lowers the calling thread's CPU priority by [`JUDGE_NICE`]; a failure
/// leaves it as it was.
fn lower_priority() {
    // SAFETY: on Linux `setpriority(PRIO_PROCESS, 0, _)` sets the calling
    // thread's nice value; it reads and writes no memory of ours.
    let now = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    let _ = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, (now + JUDGE_NICE).min(19)) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nice() -> i32 {
        // SAFETY: reads the calling thread's nice value.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }
    }

    #[test]
    fn judging_runs_on_a_named_thread_at_a_lower_priority() {
        let mine = nice();
        let (tx, rx) = std::sync::mpsc::channel();
        judge("gpuctl-judge-test", move || {
            let name = std::thread::current().name().map(str::to_string);
            tx.send((name, nice())).unwrap();
        });
        let (name, theirs) = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the work ran");
        assert_eq!(name.as_deref(), Some("gpuctl-judge-test"));
        assert_eq!(theirs, (mine + JUDGE_NICE).min(19));
        assert_eq!(nice(), mine, "the caller's priority is left alone");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn in_place_keeps_the_task_on_its_thread() {
        let (tx, rx) = oneshot::channel();
        let mine = std::thread::current().id();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            tx.send(7).unwrap();
        });
        assert_eq!(recv_in_place(rx).await.unwrap(), 7);
        let theirs = in_place(|| std::thread::current().id());
        assert_eq!(theirs, std::thread::current().id());
        assert_eq!(theirs, mine, "no hop through a run queue");
    }

    #[tokio::test]
    async fn on_one_thread_the_sender_still_gets_to_run() {
        let (tx, rx) = oneshot::channel();
        tokio::spawn(async move { tx.send(7).unwrap() });
        assert_eq!(recv_in_place(rx).await.unwrap(), 7);
        assert_eq!(in_place(|| 8), 8);
    }
}

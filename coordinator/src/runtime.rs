//! Threads apart from the runtime that serves connections and people's
//! calls: agents' sessions are read on one runtime (`fleet`), and the
//! scheduler runs on another (`scheduler`).
//!
//! * On one runtime, a `gpuctl status` or `jobs` woken by its connection
//!   waited in the run queues behind thousands of session tasks: at 4,096
//!   nodes × 8 GPUs in a job, their p99 went 40-61 → 18-27 ms.
//! * The scheduler on the sessions' thread was one task among 16,384: at
//!   16,384 × 8 it had a third of that thread while their telemetry was
//!   decoded, and heartbeats and results queued behind it until nodes were
//!   lost (docs/benchmarks.md, "The scheduler on a thread of its own").

use tokio::runtime::{Builder, Handle, Runtime};

/// A runtime of its own threads, named for `top` and `perf`; stopped
/// without waiting when dropped (its tasks are abandoned: at a coordinator's
/// end the sessions are cut anyway).
pub struct Apart(Option<Runtime>);

impl Apart {
    pub fn start(name: &str, threads: usize) -> std::io::Result<Apart> {
        // Multi-threaded even with one thread: the scheduler's builders use
        // `block_in_place`, which a current-thread runtime refuses.
        let rt = Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name(name)
            .enable_all()
            .build()?;
        Ok(Apart(Some(rt)))
    }

    pub fn handle(&self) -> Handle {
        self.0
            .as_ref()
            .expect("running until dropped")
            .handle()
            .clone()
    }
}

impl Drop for Apart {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which an async caller may not do.
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// `work` driven on a blocking thread of its own: for folds of a whole
/// fleet's history (0.5-0.7 s of CPU at 16,384 nodes), which on the runtime
/// would hold a worker that serves connections and people's calls. A panic
/// in it goes on in the caller. `work` makes the future there, so that it
/// need not be `Send`.
pub async fn apart<T, F>(
    work: impl FnOnce() -> F + Send + 'static,
) -> Result<T, crate::error::CoordinatorError>
where
    T: Send + 'static,
    F: std::future::Future<Output = Result<T, crate::error::CoordinatorError>>,
{
    let rt = Handle::current();
    match tokio::task::spawn_blocking(move || rt.block_on(work())).await {
        Ok(done) => done,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(crate::error::CoordinatorError::ShuttingDown),
    }
}

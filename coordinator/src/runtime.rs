//! The fleet's own threads: agents' sessions are read, and the scheduler
//! runs, on a runtime apart from the one that serves connections and
//! people's calls. On one runtime, a `gpuctl status` or `jobs` woken by its
//! connection waited in the run queues behind thousands of session tasks:
//! at 4,096 nodes × 8 GPUs in a job, their p99 went 40-61 → 18-27 ms.

use tokio::runtime::{Builder, Handle, Runtime};

/// A runtime of `--fleet-threads` threads, named `fleet`; stopped without
/// waiting when dropped (its tasks are abandoned: at a coordinator's end
/// the sessions are cut anyway).
pub struct FleetRuntime(Option<Runtime>);

impl FleetRuntime {
    pub fn start(threads: usize) -> std::io::Result<FleetRuntime> {
        // Multi-threaded even with one thread: the scheduler's builders use
        // `block_in_place`, which a current-thread runtime refuses.
        let rt = Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("fleet")
            .enable_all()
            .build()?;
        Ok(FleetRuntime(Some(rt)))
    }

    pub fn handle(&self) -> Handle {
        self.0
            .as_ref()
            .expect("running until dropped")
            .handle()
            .clone()
    }
}

impl Drop for FleetRuntime {
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

//! Threads of their own: agents' sessions are read on the fleet's runtime,
//! and the scheduler runs on one of its own, both apart from the runtime
//! that serves connections and people's calls. On one runtime, a `gpuctl
//! status` or `jobs` woken by its connection waited in the run queues behind
//! thousands of session tasks: at 4,096 nodes × 8 GPUs in a job, their p99
//! went 40-61 → 18-27 ms. With the scheduler beside the sessions, a person's
//! call that reached it still waited for the scheduler's turn among 16,384
//! session tasks on that thread; on a thread of its own the kernel runs it
//! as soon as the call arrives.

use tokio::runtime::{Builder, Handle, Runtime};

/// A runtime of `threads` threads named `name` (the fleet's:
/// `--fleet-threads`, `fleet`; the scheduler's: one, `scheduler`); stopped
/// without waiting when dropped (its tasks are abandoned: at a
/// coordinator's end the sessions are cut anyway).
pub struct NamedRuntime(Option<Runtime>);

impl NamedRuntime {
    pub fn start(name: &str, threads: usize) -> std::io::Result<NamedRuntime> {
        // Multi-threaded even with one thread: the scheduler's builders use
        // `block_in_place`, which a current-thread runtime refuses.
        let rt = Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name(name)
            .enable_all()
            .build()?;
        Ok(NamedRuntime(Some(rt)))
    }

    pub fn handle(&self) -> Handle {
        self.0
            .as_ref()
            .expect("running until dropped")
            .handle()
            .clone()
    }
}

impl Drop for NamedRuntime {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which an async caller may not do.
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

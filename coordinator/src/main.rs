//! `gpuctl-coordinator`: flags, logging and signals; the work is in the library.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use gpuctl_coordinator::Config;
use tracing_subscriber::EnvFilter;

// glibc's malloc kept what a 1,000-node job had used (hundreds of MB) after
// the job ended, one arena per thread. mimalloc gave it back, but held more
// than it used: at 4,096 idle nodes 333 MB resident for ~190 MB of heap,
// and a job's end peaked 100-170 MB higher than under jemalloc.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read at its first allocation (`_RJEM_MALLOC_CONF` in
/// the environment still overrides them). A thread of its own gives freed
/// pages back to the OS 1 s after their last use, not the default 10 s: a
/// job's end (its 32,768 results, the report and its encodings) is freed
/// within a second, and the next job may start right after. One arena per
/// CPU, each thread allocating from the arena of the CPU it runs on, not
/// four per CPU by thread: at 4,096 nodes × 8 GPUs over 20 jobs, resident
/// memory rose 461 → 582 MB with four, 448 → 535 MB with one, flat over the
/// last 8 jobs, for the same live bytes. (Likely why, not profiled: four
/// per CPU spread the threads over 8 arenas here, and one arena's free
/// pages serve no other.)
#[allow(non_upper_case_globals)]
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static malloc_conf: &[u8] =
    b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0,percpu_arena:percpu\0";

fn init_tracing(filter: Option<&str>) {
    let filter = match filter {
        Some(f) => EnvFilter::try_new(f).unwrap_or_else(|e| {
            eprintln!("--log `{f}` is not a log filter ({e}); using info");
            EnvFilter::new("info")
        }),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    // stdout carries only the `listening on` line; logs go to stderr.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

#[tokio::main]
async fn main() -> ExitCode {
    let cfg = Config::parse();
    init_tracing(cfg.log.as_deref());
    // Every agent holds a connection and every worker one for its job:
    // 36,864 descriptors at 4,096 nodes × 8 GPUs, where the usual soft
    // limit is 1,024 (the hard one 524,288 under systemd).
    match gpuctl_core::server::raise_open_files_limit() {
        Ok(n) => tracing::info!(open_files_limit = n, "open files"),
        Err(e) => tracing::warn!("cannot raise the open-files limit: {e}"),
    }
    let shutdown = match gpuctl_core::shutdown::on_signals() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("gpuctl-coordinator: cannot watch for SIGINT/SIGTERM: {e}");
            return ExitCode::FAILURE;
        }
    };
    match gpuctl_coordinator::server::run(cfg, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuctl-coordinator: {e:#}");
            ExitCode::FAILURE
        }
    }
}

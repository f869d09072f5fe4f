//! `gpuctl-coordinator`: flags, logging and signals; the work is in the library.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use gpuctl_coordinator::Config;
use tracing_subscriber::EnvFilter;

// glibc's malloc kept what a 1,000-node job had used (hundreds of MB) after
// the job ended, one arena per thread; mimalloc gives it back.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `purge_delay` option (`mi_option_t` 15 in mimalloc 3), which
/// its Rust bindings do not name.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long mimalloc keeps freed memory before it gives it back, unless
/// `MIMALLOC_PURGE_DELAY` says otherwise. Its default, 1 s, held 100-150 MB
/// at a 32,768-rank job's end, when the results, the report and its
/// encodings come and go within a second (peaks 1.0-1.09 GB at 4,096 nodes;
/// 0.91-0.96 GB at 10 ms). 0 purges on every free and stalled `Submit` for
/// seconds in two runs of three.
const PURGE_DELAY_MS: std::ffi::c_long = 10;

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
    // SAFETY: sets an option's default, which mimalloc reads on its next
    // purge; an environment setting read at load stays.
    unsafe { libmimalloc_sys::mi_option_set_default(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    let cfg = Config::parse();
    init_tracing(cfg.log.as_deref());
    let shutdown = match gpuctl_proto::shutdown::on_signals() {
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

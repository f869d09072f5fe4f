//! `gpuctl`, the command line of the gpuctl GPU cluster acceptance-testing system.
//! Talks to the coordinator's `JobService` over gRPC; `gpuctl local up` runs a
//! coordinator and agents on this machine. Exit codes: 0 success, 1 failure
//! (including a failed acceptance verdict under `submit --wait`), 2 bad usage
//! (nothing was sent).

mod args;
mod client;
mod commands;
mod output;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use crate::args::{Cli, UsageError};

fn init_tracing(verbose: u8) {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    // RUST_LOG wins when set, so one module can be turned up without the rest.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(verbose >= 2)
        .init();
}

fn main() {
    let cli = Cli::parse();
    init_tracing(cli.verbose);
    // One thread is plenty for a CLI, and `local up` relies on it: children get
    // PR_SET_PDEATHSIG, which fires when the *thread* that spawned them exits.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = match rt.block_on(commands::run(cli)) {
        Ok(code) => code,
        Err(e) => {
            if let Some(u) = e.downcast_ref::<UsageError>() {
                eprintln!("error: {u}");
                2
            } else {
                eprintln!("error: {e:#}");
                1
            }
        }
    };
    drop(rt);
    std::process::exit(code);
}

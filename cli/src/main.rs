//! `gpuctl`, the command line of the gpuctl GPU cluster acceptance-testing system.
//! Talks to the coordinator's `JobService` over gRPC; `gpuctl local up` runs a
//! coordinator and agents on this machine. Exit codes follow one scheme for
//! every verb ([`exit::HELP`]): 0 done/passed, 1 job failed, 2 bad input,
//! 3 not found, 4 coordinator unreachable.

mod actions;
mod args;
mod client;
mod commands;
mod error;
mod exit;
mod output;

use clap::{CommandFactory, FromArgMatches};
use gpuctl_core::clock::Clock;
use tracing_subscriber::EnvFilter;

use crate::args::Cli;
use crate::error::UsageError;
use crate::exit::Exit;

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
    // Clap exits 2 on a bad flag by itself, which is the scheme's "bad input".
    let matches = Cli::command().after_help(exit::HELP).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
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
            std::process::exit(Exit::Failed.code());
        }
    };
    let exit = match rt.block_on(commands::run(cli, &Clock::system())) {
        Ok(exit) => exit,
        Err(e) => {
            // A usage error is one sentence naming the flag; no cause chain.
            match e.downcast_ref::<UsageError>() {
                Some(u) => eprintln!("error: {u}"),
                None => eprintln!("error: {e:#}"),
            }
            Exit::of_error(&e)
        }
    };
    drop(rt);
    std::process::exit(exit.code());
}

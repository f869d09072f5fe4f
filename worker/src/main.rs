//! `gpuctl-worker`: see the library (`gpuctl_worker`) and docs/architecture.md.

use clap::Parser;

fn main() {
    if gpuctl_worker::prestart::requested() {
        std::process::exit(gpuctl_worker::prestart::run());
    }
    gpuctl_worker::init_logging();
    let args = gpuctl_worker::context::Args::parse();
    let code = gpuctl_worker::run_worker(args);
    std::process::exit(code);
}

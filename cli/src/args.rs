//! The top of the command-line grammar (clap derive): the global flags and
//! one `Command` variant per verb. Each verb's own flags and examples live
//! beside it in `commands/` (`commands::submit::SubmitArgs`, ...).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::commands::{
    accept, baseline, cancel, cert, certs, doctor, fleet, job_spec, jobs, local, logs, nodes,
    profile, report, status, submit, trace, watch,
};
use crate::output::OutputFormat;

/// Default coordinator address; `gpuctl local up` listens here by default too.
pub const DEFAULT_COORDINATOR: &str = "http://127.0.0.1:7070";

#[derive(Debug, Parser)]
#[command(
    name = "gpuctl",
    version,
    about = "GPU cluster acceptance tests: submit workloads to a fleet, watch them, read the report",
    propagate_version = true
)]
pub struct Cli {
    /// Coordinator URL, or several separated by commas (a leader and its
    /// standbys with `--store etcd`): the one that leads is used.
    #[arg(long, env = "GPUCTL_COORDINATOR", default_value = DEFAULT_COORDINATOR, global = true)]
    pub coordinator: String,

    /// Output format for listings and reports.
    #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Table, global = true)]
    pub output: OutputFormat,

    /// More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,

    /// CA of the coordinator's certificate (PEM), for an https:// coordinator.
    /// The token, if the coordinator wants one, is read from GPUCTL_TOKEN.
    #[arg(long, value_name = "FILE", env = "GPUCTL_TLS_CA", global = true)]
    pub tls_ca: Option<PathBuf>,

    /// Client certificate (PEM), for a coordinator that asks for one.
    #[arg(long, value_name = "FILE", env = "GPUCTL_TLS_CERT", global = true)]
    pub tls_cert: Option<PathBuf>,

    /// The key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", env = "GPUCTL_TLS_KEY", global = true)]
    pub tls_key: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the fleet's nodes; `nodes remove NAME` forgets one.
    Nodes(nodes::NodesArgs),
    /// Accept nodes: run an acceptance suite (quick, standard, burn-in) and judge each node.
    #[command(after_help = accept::EXAMPLES)]
    Accept(accept::AcceptArgs),
    /// Submit a workload (stress, nccl, ddp, fsdp, maxbatch).
    #[command(after_help = submit::EXAMPLES)]
    Submit(submit::SubmitArgs),
    /// List jobs, newest first.
    Jobs(jobs::JobsArgs),
    /// Show one job with per-rank progress.
    Status(status::StatusArgs),
    /// Follow one job until it ends, refreshing a table in place.
    Watch(watch::WatchArgs),
    /// Cancel a job.
    Cancel(cancel::CancelArgs),
    /// Print a job's report.
    #[command(after_help = report::EXAMPLES)]
    Report(report::ReportArgs),
    /// Print a job's timeline as a Chrome trace (open it in Perfetto or chrome://tracing).
    #[command(after_help = trace::EXAMPLES)]
    Trace(trace::TraceArgs),
    /// Print a job's operator profile (--profile): top 10 operators per rank; copy the Chrome traces.
    #[command(after_help = profile::EXAMPLES)]
    Profile(profile::ProfileArgs),
    /// Print a job's worker logs.
    Logs(logs::LogsArgs),
    /// Dry run: show the ranks and the NCCL environment a submit would get; nothing starts.
    Plan(job_spec::JobArgs),
    /// Run a coordinator and agents on this machine.
    #[command(subcommand)]
    Local(local::LocalCommand),
    /// Run the agent's preflight checks on this machine (no coordinator); exit 1 if one fails.
    Doctor(doctor::DoctorArgs),
    /// Keep a finished job's figures under a name, to judge later jobs against (submit --baseline).
    #[command(subcommand)]
    Baseline(baseline::BaselineCommand),
    /// The fleet over time: each node's last verdict, figures and drift; `fleet links`: every pair.
    #[command(after_help = fleet::EXAMPLES)]
    Fleet(fleet::FleetArgs),
    /// Certificates for mutual TLS between the coordinator, agents and CLI (acceptance certificates: `gpuctl cert`).
    #[command(subcommand)]
    Certs(certs::CertsCommand),
    /// Signed per-node acceptance certificates: export, verify offline, show, check, revoke (TLS: `gpuctl certs`).
    #[command(subcommand, after_help = cert::EXAMPLES)]
    Cert(cert::CertCommand),
    /// Print a shell completion script: `gpuctl completion bash > /etc/bash_completion.d/gpuctl`.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use gpuctl_core::catalogue;

    fn parse(args: &[&str]) -> Cli {
        let mut v = vec!["gpuctl"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    #[test]
    fn every_help_example_parses_and_its_spec_is_valid() {
        let all = [
            submit::EXAMPLES,
            report::EXAMPLES,
            fleet::EXAMPLES,
            local::args::EXAMPLES,
        ];
        let mut n = 0;
        for line in all.iter().flat_map(|e| e.lines()) {
            let Some(cmd) = line
                .trim()
                .trim_start_matches("sudo ")
                .strip_prefix("gpuctl ")
            else {
                continue;
            };
            let cmd = cmd.split(['#', '>']).next().unwrap();
            let words: Vec<&str> = cmd.split_whitespace().collect();
            if let Command::Submit(s) = parse(&words).command {
                s.job
                    .to_spec()
                    .unwrap_or_else(|e| panic!("{line}: {}", e.0));
            }
            n += 1;
        }
        assert_eq!(n, 17, "every example was tried");
    }

    #[test]
    fn workload_flags_are_the_catalogue() {
        let cli = Cli::command();
        cli.clone().debug_assert();
        for sub in ["submit", "plan"] {
            let cmd = cli.find_subcommand(sub).unwrap();
            for name in catalogue::names() {
                let long = name.replace('_', "-");
                let flags: Vec<_> = cmd
                    .get_arguments()
                    .filter(|a| a.get_long() == Some(long.as_str()))
                    .collect();
                assert_eq!(flags.len(), 1, "{sub} --{long}");
                let help = flags[0].get_help().map(|h| h.to_string());
                assert_eq!(help, Some(catalogue::flag_help(name)), "{sub} --{long}");
                let optional_value = flags[0].get_num_args() == Some((0..=1).into());
                assert_eq!(optional_value, catalogue::is_bool(name), "{sub} --{long}");
            }
            let extra: Vec<_> = cmd
                .get_arguments()
                .filter(|a| a.get_help_heading() == Some(job_spec::PARAMS_HEADING))
                .filter_map(|a| a.get_long())
                .filter(|l| {
                    *l != "param" && !catalogue::names().contains(&l.replace('-', "_").as_str())
                })
                .collect();
            assert!(
                extra.is_empty(),
                "{sub}: workload flags outside the catalogue: {extra:?}"
            );
        }
        // The flags users already type stay.
        for old in [
            "min_bytes",
            "max_bytes",
            "factor",
            "ops",
            "dtype",
            "iters",
            "warmup",
            "size",
            "precision",
            "interval",
            "target_memory",
            "with_comm",
            "check_every",
            "model",
            "batch_size",
            "steps",
            "warmup_steps",
            "channels_last",
            "bucket_bytes",
            "seq_len",
            "margin",
            "start",
            "limit",
        ] {
            assert!(catalogue::names().contains(&old), "--{old} is gone");
        }
    }

    #[test]
    fn unknown_flags_are_clap_errors() {
        let e = Cli::try_parse_from(["gpuctl", "submit", "stress", "--frobnicate"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn global_flags_anywhere() {
        let c = parse(&["jobs", "--output", "json", "--coordinator", "http://h:1"]);
        assert_eq!(c.output, OutputFormat::Json);
        assert_eq!(c.coordinator, "http://h:1");
    }
}

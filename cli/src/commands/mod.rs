//! One module per verb, its flags (clap) and examples beside what it does:
//! check the input, call the coordinator, hand the answer to `crate::output`
//! to print. Each returns its outcome as an [`Exit`]; errors bubble up as
//! `anyhow` and `main` prints them and picks their code (`Exit::of_error`).
//! `job_spec` holds the flags `submit` and `plan` share, `parse` the flag
//! values several verbs take. `run` below checks `-o` against the verb and
//! dispatches.

pub mod accept;
pub mod baseline;
pub mod cancel;
pub mod cert;
pub mod certs;
pub mod doctor;
pub mod fleet;
pub mod job_spec;
pub mod jobs;
pub mod local;
pub mod logs;
pub mod nodes;
mod parse;
pub mod plan;
pub mod profile;
pub mod report;
pub mod status;
pub mod submit;
pub mod trace;
pub mod watch;

use anyhow::Result;
use clap::{CommandFactory, ValueEnum};
use gpuctl_core::clock::Clock;

use self::certs::CertsCommand;
use self::local::LocalCommand;
use crate::args::{Cli, Command};
use crate::client::Coordinator;
use crate::error::UsageError;
use crate::exit::Exit;
use crate::output::OutputFormat;

/// CSV and Markdown are for the listings and the report, JUnit for the report
/// only (`submit --wait` prints a report too); anywhere else they are a usage
/// error before anything is sent.
fn check_format(cmd: &Command, out: OutputFormat) -> Result<()> {
    let ok = match out {
        OutputFormat::Table | OutputFormat::Json => true,
        // The page needs the job's telemetry timeline: `report` fetches it.
        OutputFormat::Html => matches!(
            cmd,
            Command::Report(_) | Command::Cert(cert::CertCommand::Show(_))
        ),
        _ if matches!(cmd, Command::Submit(a) if a.wait) => true,
        OutputFormat::Csv | OutputFormat::Md => matches!(
            cmd,
            Command::Report(_)
                | Command::Jobs(_)
                | Command::Fleet(_)
                | Command::Nodes(nodes::NodesArgs { action: None, .. })
        ),
        OutputFormat::Junit => matches!(cmd, Command::Report(_)),
    };
    if ok {
        return Ok(());
    }
    let name = out.to_possible_value().map(|v| v.get_name().to_string());
    Err(UsageError(format!(
        "--output {} is for {}; this command prints table or json",
        name.unwrap_or_default(),
        if matches!(out, OutputFormat::Junit) {
            "`report`"
        } else if matches!(out, OutputFormat::Html) {
            "`report` and `cert show`"
        } else {
            "`report`, `jobs`, `nodes` and `fleet`"
        }
    ))
    .into())
}

/// `clock` is the one every verb reads the time from (the system's in
/// `main`): the ages a table shows and `--since` are told from it.
pub async fn run(cli: Cli, clock: &Clock) -> Result<Exit> {
    let out = cli.output;
    check_format(&cli.command, out)?;
    let url = cli.coordinator.as_str();
    crate::client::set_tls(&cli.tls_ca, &cli.tls_cert, &cli.tls_key);
    match cli.command {
        // Validation comes before connecting: bad input must send nothing.
        Command::Accept(a) => {
            let req = a.to_request()?;
            let mut c = Coordinator::connect(url).await?;
            accept::run(&mut c, req, a.actions(), out, clock).await
        }
        Command::Submit(a) => {
            let spec = a.job.to_spec()?;
            let mut c = Coordinator::connect(url).await?;
            submit::run(&mut c, spec, a.wait, out, clock).await
        }
        Command::Plan(a) => {
            let spec = a.to_spec()?;
            let mut c = Coordinator::connect(url).await?;
            plan::run(&mut c, spec, out).await
        }
        Command::Nodes(a) => {
            let mut c = Coordinator::connect(url).await?;
            match a.action {
                Some(nodes::NodesAction::Remove { name }) => {
                    nodes::remove(&mut c, &name, out).await
                }
                None => nodes::run(&mut c, out, clock).await,
            }
        }
        Command::Jobs(a) => {
            jobs::run(&mut Coordinator::connect(url).await?, a.limit, out, clock).await
        }
        Command::Status(a) => {
            status::run(&mut Coordinator::connect(url).await?, &a.job, out, clock).await
        }
        Command::Watch(a) => {
            let interval = parse::parse_interval("--interval", &a.interval)?;
            let mut c = Coordinator::connect(url).await?;
            watch::run(&mut c, &a.job, interval, out, clock).await
        }
        Command::Cancel(a) => {
            cancel::run(
                &mut Coordinator::connect(url).await?,
                &a.job,
                &a.reason,
                out,
            )
            .await
        }
        Command::Report(a) => report::run(&mut Coordinator::connect(url).await?, &a.job, out).await,
        Command::Trace(a) => {
            trace::run(
                &mut Coordinator::connect(url).await?,
                &a.job,
                a.out.as_deref(),
            )
            .await
        }
        Command::Profile(a) => profile::run(&mut Coordinator::connect(url).await?, &a, out).await,
        Command::Logs(a) => {
            let mut c = Coordinator::connect(url).await?;
            if a.follow {
                logs::follow(&mut c, &a.job, a.rank, a.tail).await
            } else {
                logs::run(&mut c, &a.job, a.rank, a.tail, out).await
            }
        }
        Command::Local(LocalCommand::Up(a)) => Ok(Exit::failed_if(local::up(a, clock).await? != 0)),
        Command::Doctor(a) => doctor::run(&a, out),
        Command::Fleet(a) => {
            let since = match &a.since {
                Some(s) => {
                    let d = parse::parse_interval("--since", s)?;
                    clock.now_ms().saturating_sub(d.as_millis() as u64)
                }
                None => 0,
            };
            let mut c = Coordinator::connect(url).await?;
            fleet::run(&mut c, &a, since, out, clock).await
        }
        Command::Certs(CertsCommand::Init(a)) => certs::init(&a),
        Command::Cert(cmd) => cert::run(url, cmd, out, clock).await,
        Command::Completion { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "gpuctl", &mut std::io::stdout());
            Ok(Exit::Ok)
        }
        Command::Baseline(cmd) => {
            baseline::run(&mut Coordinator::connect(url).await?, cmd, out, clock).await
        }
    }
}

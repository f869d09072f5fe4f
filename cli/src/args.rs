//! Command-line grammar (clap derive) and the one translation that matters most:
//! submit/plan flags → `JobSpec`. The translation is checked here, with the same
//! `spec::normalize` the coordinator runs, so a bad flag fails before anything is
//! sent and names the flag to fix.

use std::collections::HashSet;
use std::fmt;
use std::path::PathBuf;

use clap::{Arg, ArgAction, ArgMatches, Args, Parser, Subcommand};
use gpuctl_core::pb::JobSpec;
use gpuctl_core::{catalogue, spec, units};

pub use crate::output::OutputFormat;

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

const SUBMIT_EXAMPLES: &str = "\
Examples:
  gpuctl submit stress --duration 15m --nodes 4 --wait
  gpuctl submit nccl --nodes all --min-bytes 1M --max-bytes 1G --wait
  gpuctl submit nccl --nodes all --pattern pairs --wait      # every link between nodes
  gpuctl submit ddp --nodes 2 --model resnet50 --batch-size 256 --wait
  gpuctl submit stress --nodes all --baseline h200-ref --hang-timeout 60s --wait -o junit > results.xml";

const REPORT_EXAMPLES: &str = "\
Examples:
  gpuctl report job-000042                 # verdict and findings first, then the tables
  gpuctl report job-000042 -o json         # for machines
  gpuctl report job-000042 -o junit > results.xml
  gpuctl report job-000042 -o md           # to paste into a ticket
  gpuctl report job-000042 -o html > report.html   # plots; opens offline in a browser";

const TRACE_EXAMPLES: &str = "\
Examples:
  gpuctl trace job-000042 > trace.json     # open in https://ui.perfetto.dev or chrome://tracing
  gpuctl trace job-000042 --out trace.json";

const FLEET_EXAMPLES: &str = "\
Examples:
  gpuctl fleet                             # every node: last verdict, figures, drift
  gpuctl fleet --node gpu-017              # one node's runs, newest first
  gpuctl fleet links --since 7d            # the latest measurement of every pair
  gpuctl fleet -o csv > fleet.csv";

const LOCAL_UP_EXAMPLES: &str = "\
Examples:
  gpuctl local up --agents 4 --data-dir /tmp/fleet          # CPU ranks, no GPU needed
  gpuctl local up --agents 1 --agent-arg=--libtorch=/path/to/site-packages   # this host's GPUs
  sudo gpuctl local up --agents 4 --netns                   # each agent in its own network namespace";

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the fleet's nodes; `nodes remove NAME` forgets one.
    Nodes(NodesArgs),
    /// Accept nodes: run an acceptance suite (quick, standard, burn-in) and judge each node.
    #[command(after_help = crate::commands::accept::EXAMPLES)]
    Accept(crate::commands::accept::AcceptArgs),
    /// Submit a workload (stress, nccl, ddp, fsdp, maxbatch).
    #[command(after_help = SUBMIT_EXAMPLES)]
    Submit(SubmitArgs),
    /// List jobs, newest first.
    Jobs(JobsArgs),
    /// Show one job with per-rank progress.
    Status(JobRef),
    /// Follow one job until it ends, refreshing a table in place.
    Watch(WatchArgs),
    /// Cancel a job.
    Cancel(CancelArgs),
    /// Print a job's report.
    #[command(after_help = REPORT_EXAMPLES)]
    Report(JobRef),
    /// Print a job's timeline as a Chrome trace (open it in Perfetto or chrome://tracing).
    #[command(after_help = TRACE_EXAMPLES)]
    Trace(TraceArgs),
    /// Print a job's worker logs.
    Logs(LogsArgs),
    /// Dry run: show the ranks and the NCCL environment a submit would get; nothing starts.
    Plan(JobArgs),
    /// Run a coordinator and agents on this machine.
    #[command(subcommand)]
    Local(LocalCommand),
    /// Run the agent's preflight checks on this machine (no coordinator); exit 1 if one fails.
    Doctor(DoctorArgs),
    /// Keep a finished job's figures under a name, to judge later jobs against (submit --baseline).
    #[command(subcommand)]
    Baseline(BaselineCommand),
    /// The fleet over time: each node's last verdict, figures and drift; `fleet links`: every pair.
    #[command(after_help = FLEET_EXAMPLES)]
    Fleet(FleetArgs),
    /// Certificates for mutual TLS between the coordinator, agents and CLI.
    #[command(subcommand)]
    Certs(CertsCommand),
    /// Print a shell completion script: `gpuctl completion bash > /etc/bash_completion.d/gpuctl`.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Make a CA, the coordinator's certificate and one per node (and the CLI's).
    Init(CertsInitArgs),
}

#[derive(Debug, Args)]
pub struct CertsInitArgs {
    /// Folder for the files (ca.pem, coordinator.pem/.key, node-NAME.pem/.key, cli.pem/.key);
    /// a CA already there is reused and existing files are kept.
    #[arg(long)]
    pub dir: PathBuf,
    /// Node names, comma-separated: one client certificate each.
    #[arg(long, value_delimiter = ',')]
    pub nodes: Vec<String>,
    /// Host names and IP addresses agents and the CLI reach the coordinator at,
    /// comma-separated (localhost and 127.0.0.1 are always included).
    #[arg(long, value_delimiter = ',')]
    pub coordinator_names: Vec<String>,
}

#[derive(Debug, Args)]
pub struct NodesArgs {
    #[command(subcommand)]
    pub action: Option<NodesAction>,
}

#[derive(Debug, Subcommand)]
pub enum NodesAction {
    /// Forget a node that runs no job (a host taken out of the fleet).
    Remove {
        /// The node's name, as `gpuctl nodes` lists it.
        name: String,
    },
}

#[derive(Debug, Args)]
pub struct FleetArgs {
    #[command(subcommand)]
    pub view: Option<FleetView>,
    /// Only runs that ended within this long, e.g. 7d.
    #[arg(long, global = true)]
    pub since: Option<String>,
    /// One node's runs, newest first.
    #[arg(long, global = true)]
    pub node: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum FleetView {
    /// The latest bandwidth of every pair of nodes, with its age.
    Links,
}

#[derive(Debug, Subcommand)]
pub enum BaselineCommand {
    /// Keep a finished job's figures (per device class) under NAME.
    Save(BaselineSaveArgs),
    /// List the saved baselines.
    List,
    /// Show one baseline's figures.
    Show(BaselineName),
    /// Delete a baseline (jobs judged against it keep their copy).
    Delete(BaselineName),
}

#[derive(Debug, Args)]
pub struct BaselineSaveArgs {
    /// The job whose figures to keep; it must have succeeded.
    pub job: String,
    /// Name to save it under: letters, digits, `-`, `_`, `.`.
    #[arg(long)]
    pub name: String,
    /// Overwrite a baseline of that name.
    #[arg(long)]
    pub replace: bool,
}

#[derive(Debug, Args)]
pub struct BaselineName {
    pub name: String,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// libtorch the workers would use (default: the install script's folder).
    #[arg(long, env = "GPUCTL_LIBTORCH")]
    pub libtorch: Option<PathBuf>,
    /// Where the host's /proc, /sys and /dev/shm are (an agent container's view).
    #[arg(long, default_value = "/")]
    pub host_root: PathBuf,
    /// CPU ranks the agent would offer without GPUs.
    #[arg(long, default_value_t = 1)]
    pub cpu_ranks: u32,
}

#[derive(Debug, Args)]
pub struct JobRef {
    /// Job id, as `gpuctl submit` or `gpuctl jobs` print it.
    pub job: String,
}

#[derive(Debug, Args)]
pub struct TraceArgs {
    /// Job id, as `gpuctl submit` or `gpuctl jobs` print it.
    pub job: String,
    /// Write the trace to this file instead of standard output.
    #[arg(long, value_name = "FILE")]
    pub out: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub struct JobsArgs {
    /// Show at most this many jobs (0 = all).
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    pub job: String,
    /// Refresh interval.
    #[arg(long, default_value = "1s")]
    pub interval: String,
}

#[derive(Debug, Args)]
pub struct CancelArgs {
    pub job: String,
    /// Why, recorded with the job.
    #[arg(long, default_value = "cancelled by user")]
    pub reason: String,
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    pub job: String,
    /// Only this rank.
    #[arg(long)]
    pub rank: Option<u32>,
    /// Only the last N lines (per the whole selection).
    #[arg(long)]
    pub tail: Option<u32>,
    /// Keep printing new lines until the job ends (text output only).
    #[arg(short, long)]
    pub follow: bool,
}

#[derive(Debug, Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    pub job: JobArgs,
    /// Wait for the job to end, showing progress, then print its report.
    #[arg(long)]
    pub wait: bool,
}

/// Everything that makes a `JobSpec`; shared by `submit` and `plan`.
#[derive(Debug, Args)]
pub struct JobArgs {
    /// Workload: stress, nccl, ddp, fsdp or maxbatch.
    pub workload: String,

    /// How many nodes, or `all`.
    #[arg(long, default_value = "1", allow_hyphen_values = true)]
    pub nodes: String,

    /// Node selector, key=value or key!=value (labels, gpu=H200, node=NAME, gpus=8); repeatable.
    #[arg(long = "selector", short = 'l', value_name = "K=V")]
    pub selectors: Vec<String>,

    /// Run time of timed workloads (stress), e.g. 30s, 15m.
    #[arg(long, allow_hyphen_values = true)]
    pub duration: Option<String>,

    /// Hard deadline for the whole job (default: derived from --duration).
    #[arg(long, allow_hyphen_values = true)]
    pub timeout: Option<String>,

    /// Fail the job when a rank makes no progress for this long (5s to 24h; default 120s).
    #[arg(long, allow_hyphen_values = true)]
    pub hang_timeout: Option<String>,

    /// Environment override for every worker, K=V; repeatable; wins over the plan.
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    pub env: Vec<String>,

    /// Free-text label for the job.
    #[arg(long)]
    pub name: Option<String>,

    /// Judge the job's figures against this saved baseline (`gpuctl baseline list`).
    #[arg(long, value_name = "NAME")]
    pub baseline: Option<String>,

    /// Performance rules (TOML, docs/reports.md) laid over the coordinator's for this job.
    #[arg(long, value_name = "FILE")]
    pub rules: Option<PathBuf>,

    /// The job must have its GPUs to itself: another process holding GPU memory at job start fails the node.
    #[arg(long)]
    pub exclusive: bool,

    /// Ranks per node: the node's first N GPUs (or CPU ranks); 1 tests one rail. Default: all.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub gpus_per_node: Option<u32>,

    #[command(flatten)]
    pub params: WorkloadParams,
}

/// Largest `--rules` file sent with a job (the coordinator refuses more).
const MAX_RULES_BYTES: u64 = 64 * 1024;

/// The text of a `--rules` file, bounded; the coordinator parses it.
pub(crate) fn read_rules(path: &std::path::Path) -> Result<String, UsageError> {
    let meta = std::fs::metadata(path)
        .map_err(|e| usage(format!("--rules: cannot read {}: {e}", path.display())))?;
    if meta.len() > MAX_RULES_BYTES {
        return Err(usage(format!(
            "--rules: {} is {} bytes; a rules file may hold at most {MAX_RULES_BYTES}",
            path.display(),
            meta.len()
        )));
    }
    std::fs::read_to_string(path)
        .map_err(|e| usage(format!("--rules: cannot read {}: {e}", path.display())))
}

/// Workload parameters as flags: one per parameter name of
/// `gpuctl_core::catalogue` (its help and default included), plus `--param`.
/// Values stay strings here on purpose: the shared `spec::normalize` owns their
/// rules, so CLI and coordinator never disagree.
#[derive(Debug, Default, Clone)]
pub struct WorkloadParams {
    /// (parameter name, value) of each dedicated flag given, in catalogue order.
    pub named: Vec<(&'static str, String)>,
    /// `--param KEY=VALUE`, as typed.
    pub param: Vec<String>,
}

const PARAMS_HEADING: &str = "Workload parameters";

impl clap::Args for WorkloadParams {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        // Put back the heading the enclosing command had, as derive's flatten does.
        let outer = cmd
            .get_next_help_heading()
            .map(|h| clap::builder::Str::from(h.to_string()));
        let mut cmd = cmd.next_help_heading(PARAMS_HEADING);
        for p in catalogue::flag_params() {
            let mut arg = Arg::new(p.name)
                .long(p.flag().trim_start_matches('-').to_string())
                .help(catalogue::flag_help(p.name))
                .value_name(p.value_name())
                .action(ArgAction::Set);
            if catalogue::is_bool(p.name) {
                arg = arg.num_args(0..=1).default_missing_value("true");
            }
            cmd = cmd.arg(arg);
        }
        cmd.arg(
            Arg::new("param")
                .long("param")
                .short('p')
                .value_name("KEY=VALUE")
                .action(ArgAction::Append)
                .help("Any workload parameter as key=value; repeatable."),
        )
        .next_help_heading(clap::builder::Resettable::from(outer))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl clap::FromArgMatches for WorkloadParams {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        Self::from_arg_matches_mut(&mut m.clone())
    }

    fn from_arg_matches_mut(m: &mut ArgMatches) -> Result<Self, clap::Error> {
        let named = catalogue::names()
            .into_iter()
            .filter_map(|n| m.remove_one::<String>(n).map(|v| (n, v)))
            .collect();
        let param = m
            .remove_many::<String>("param")
            .map(Iterator::collect)
            .unwrap_or_default();
        Ok(WorkloadParams { named, param })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

/// Bad input caught before anything was sent; exits with status 2 like clap's own errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn usage(msg: impl Into<String>) -> UsageError {
    UsageError(msg.into())
}

/// `K=V` → (K, V); `flag` names the flag in the error.
fn split_kv<'a>(
    flag: &str,
    text: &'a str,
    example: &str,
) -> Result<(&'a str, &'a str), UsageError> {
    match text.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim(), v)),
        _ => Err(usage(format!(
            "{flag}: `{text}` is not KEY=VALUE; write it like {flag} {example}"
        ))),
    }
}

pub(crate) fn parse_nodes(text: &str) -> Result<(u32, bool), UsageError> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("all") {
        return Ok((0, true));
    }
    let bad = |why: &str| {
        usage(format!(
            "--nodes: `{t}` {why}; give a number of nodes (1 or more) or `all`"
        ))
    };
    match t.parse::<i64>() {
        Ok(n) if n <= 0 => Err(bad("is not a node count")),
        Ok(n) => u32::try_from(n)
            .map(|n| (n, false))
            .map_err(|_| bad("is too large")),
        Err(_) => Err(bad("is not a number")),
    }
}

/// A duration flag outside the job spec (`watch --interval`, `local up --node-timeout`).
pub fn parse_interval(flag: &str, text: &str) -> Result<std::time::Duration, UsageError> {
    units::parse_duration(text).map_err(|m| usage(format!("{flag}: {m}")))
}

pub(crate) fn parse_duration_flag(flag: &str, text: &str) -> Result<u64, UsageError> {
    units::parse_duration(text)
        .map(|d| d.as_millis() as u64)
        .map_err(|m| usage(format!("{flag}: {m}")))
}

impl JobArgs {
    /// Builds and checks the spec. Every error names the flag to fix; nothing is
    /// sent when this fails.
    pub fn to_spec(&self) -> Result<JobSpec, UsageError> {
        let (node_count, all_nodes) = parse_nodes(&self.nodes)?;
        let mut spec = JobSpec {
            workload: self.workload.trim().to_ascii_lowercase(),
            node_count,
            all_nodes,
            selectors: self
                .selectors
                .iter()
                .map(|s| s.trim().to_string())
                .collect(),
            name: self.name.clone().unwrap_or_default(),
            baseline: self.baseline.clone().unwrap_or_default(),
            exclusive: self.exclusive,
            gpus_per_node: self.gpus_per_node.unwrap_or(0),
            ..Default::default()
        };
        if let Some(path) = &self.rules {
            spec.rules = read_rules(path)?;
        }
        if let Some(d) = &self.duration {
            spec.duration_ms = parse_duration_flag("--duration", d)?;
        }
        if let Some(t) = &self.timeout {
            spec.timeout_ms = parse_duration_flag("--timeout", t)?;
        }
        if let Some(t) = &self.hang_timeout {
            spec.hang_timeout_ms = parse_duration_flag("--hang-timeout", t)?;
            if spec.hang_timeout_ms == 0 {
                return Err(usage("--hang-timeout: 0 is no timeout; give 5s to 24h"));
            }
        }
        for e in &self.env {
            let (k, v) = split_kv("--env", e, "NCCL_DEBUG=INFO")?;
            spec.env.insert(k.to_string(), v.to_string());
        }
        // Generic --param first, dedicated flags last: the flag the user spelled out wins.
        let mut from_flag: HashSet<&str> = HashSet::new();
        for p in &self.params.param {
            let (k, v) = split_kv("--param", p, "size=4096")?;
            let key = k.replace('-', "_");
            spec.params.insert(key, v.trim().to_string());
        }
        for (key, v) in &self.params.named {
            spec.params.insert(key.to_string(), v.trim().to_string());
            from_flag.insert(key);
        }
        let def = spec::workload(&spec.workload);
        if def.is_some_and(|d| !d.timed) && spec.duration_ms > 0 {
            // Not an error (the coordinator ignores it), but the user should know.
            tracing::warn!(
                "--duration has no effect on `{}`: it runs until its work is done",
                spec.workload
            );
        }
        spec::normalize(&spec).map_err(|e| {
            // normalize names a dedicated flag's parameter `--param key`; say the
            // flag the user actually typed instead.
            let field = match e.field.strip_prefix("--param ") {
                Some(key) if from_flag.contains(key) => format!("--{}", key.replace('_', "-")),
                _ => e.field.clone(),
            };
            if field == "workload" {
                usage(e.message)
            } else {
                usage(format!("{field}: {}", e.message))
            }
        })
    }
}

#[derive(Debug, Subcommand)]
pub enum LocalCommand {
    /// Start a coordinator and N agents on this machine and stay in the foreground.
    #[command(after_help = LOCAL_UP_EXAMPLES)]
    Up(LocalUpArgs),
}

#[derive(Debug, Args)]
pub struct LocalUpArgs {
    /// Agents to start (local-0 .. local-N-1).
    #[arg(long, default_value_t = 4)]
    pub agents: u32,
    /// Where the coordinator's store, the agents' work folders and the logs go
    /// (default: a gpuctl-local-PORT folder in the temp dir).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// CPU ranks each agent offers when it has no GPU.
    #[arg(long, default_value_t = 2)]
    pub cpu_ranks: u32,
    /// Coordinator port on 127.0.0.1, or on 10.213.0.1 with --netns (0 picks a free one).
    #[arg(long, default_value_t = 7070)]
    pub port: u16,
    /// A node without heartbeat this long is lost.
    #[arg(long, default_value = "15s")]
    pub node_timeout: String,
    /// gpuctl-coordinator binary (default: next to gpuctl).
    #[arg(long)]
    pub coordinator_bin: Option<PathBuf>,
    /// gpuctl-agent binary (default: next to gpuctl).
    #[arg(long)]
    pub agent_bin: Option<PathBuf>,
    /// Extra argument for every agent, e.g. --agent-arg=--libtorch=/opt/libtorch; repeatable.
    #[arg(long, allow_hyphen_values = true)]
    pub agent_arg: Vec<String>,
    /// Extra argument for the coordinator; repeatable.
    #[arg(long, allow_hyphen_values = true)]
    pub coordinator_arg: Vec<String>,
    /// How long to wait for every agent to register.
    #[arg(long, default_value = "60s")]
    pub ready_timeout: String,
    /// Put each agent in its own network namespace (gpl-local-i) on bridge
    /// gpl-br0, so traffic between nodes crosses real interfaces (root; at most
    /// 64 agents). The coordinator then listens on 10.213.0.1.
    #[arg(long)]
    pub netns: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Cli {
        let mut v = vec!["gpuctl"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    #[test]
    fn every_help_example_parses_and_its_spec_is_valid() {
        let all = [
            SUBMIT_EXAMPLES,
            REPORT_EXAMPLES,
            FLEET_EXAMPLES,
            LOCAL_UP_EXAMPLES,
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

    fn spec_of(args: &[&str]) -> Result<JobSpec, UsageError> {
        match parse(args).command {
            Command::Submit(s) => s.job.to_spec(),
            Command::Plan(j) => j.to_spec(),
            other => panic!("not a job command: {other:?}"),
        }
    }

    #[test]
    fn stress_flags_map_to_spec() {
        let s = spec_of(&[
            "submit",
            "stress",
            "--nodes",
            "3",
            "--duration",
            "30s",
            "--selector",
            "gpu=H200",
            "--selector",
            "rack!=a1",
            "--env",
            "NCCL_DEBUG=INFO",
            "--name",
            "burn-in",
            "--size",
            "4096",
            "--precision",
            "bf16",
            "--with-comm",
            "--target-memory",
            "0.8",
        ])
        .unwrap();
        assert_eq!(s.workload, "stress");
        assert_eq!(s.node_count, 3);
        assert!(!s.all_nodes);
        assert_eq!(s.duration_ms, 30_000);
        assert_eq!(s.selectors, vec!["gpu=H200", "rack!=a1"]);
        assert_eq!(s.env.get("NCCL_DEBUG").map(String::as_str), Some("INFO"));
        assert_eq!(s.name, "burn-in");
        assert_eq!(s.params.get("size").map(String::as_str), Some("4096"));
        assert_eq!(s.params.get("precision").map(String::as_str), Some("bf16"));
        assert_eq!(s.params.get("with_comm").map(String::as_str), Some("true"));
        assert_eq!(
            s.params.get("target_memory").map(String::as_str),
            Some("0.8")
        );
        assert_eq!(s.params.len(), 4);
    }

    #[test]
    fn nccl_and_train_flags_map_to_params() {
        let s = spec_of(&[
            "plan",
            "nccl",
            "--nodes",
            "all",
            "--ops",
            "all_reduce,all_gather",
            "--min-bytes",
            "1K",
            "--max-bytes",
            "1M",
            "--factor",
            "4",
            "--dtype",
            "half",
            "--iters",
            "3",
            "--warmup",
            "1",
            "--gpus-per-node",
            "1",
        ])
        .unwrap();
        assert!(s.all_nodes);
        assert_eq!(s.gpus_per_node, 1, "one rail");
        assert_eq!(s.params.get("ops").unwrap(), "all_reduce,all_gather");
        assert_eq!(s.params.get("min_bytes").unwrap(), "1K");
        assert_eq!(s.params.get("max_bytes").unwrap(), "1M");
        assert_eq!(s.params.get("factor").unwrap(), "4");
        assert_eq!(s.params.get("dtype").unwrap(), "half");
        assert_eq!(s.params.get("iters").unwrap(), "3");
        assert_eq!(s.params.get("warmup").unwrap(), "1");
        assert_eq!(s.duration_ms, 0, "nccl is not timed");

        let s = spec_of(&[
            "submit",
            "ddp",
            "--model",
            "cnn",
            "--batch-size",
            "32",
            "--steps",
            "10",
            "--warmup-steps",
            "2",
            "--channels-last=false",
            "--bucket-bytes",
            "25M",
            "--param",
            "seq-len=128",
        ])
        .unwrap();
        assert_eq!(s.params.get("channels_last").unwrap(), "false");
        assert_eq!(
            s.params.get("seq_len").unwrap(),
            "128",
            "--param dashes become underscores"
        );
        assert_eq!(s.params.get("batch_size").unwrap(), "32");
        assert_eq!(s.params.get("warmup_steps").unwrap(), "2");
        assert_eq!(s.params.get("bucket_bytes").unwrap(), "25M");

        let s = spec_of(&[
            "submit", "maxbatch", "--margin", "0.2", "--start", "4", "--limit", "64",
        ])
        .unwrap();
        assert_eq!(s.params.get("margin").unwrap(), "0.2");
        assert_eq!(s.params.get("start").unwrap(), "4");
        assert_eq!(s.params.get("limit").unwrap(), "64");
    }

    #[test]
    fn timed_workload_gets_default_duration() {
        let s = spec_of(&["submit", "stress"]).unwrap();
        assert_eq!(s.node_count, 1);
        assert_eq!(s.duration_ms, spec::DEFAULT_DURATION_MS);
    }

    #[test]
    fn hang_timeout_goes_into_the_spec_within_bounds() {
        let s = spec_of(&["submit", "nccl", "--hang-timeout", "30s"]).unwrap();
        assert_eq!(s.hang_timeout_ms, 30_000);
        assert_eq!(spec_of(&["submit", "nccl"]).unwrap().hang_timeout_ms, 0);
        for bad in ["1s", "25h", "0s", "soon"] {
            let e = spec_of(&["submit", "nccl", "--hang-timeout", bad]).unwrap_err();
            assert!(e.0.starts_with("--hang-timeout:"), "{bad}: {e}");
        }
    }

    #[test]
    fn bad_nodes_name_the_flag() {
        for bad in ["0", "-2", "two", "99999999999"] {
            let e = spec_of(&["submit", "stress", "--nodes", bad]).unwrap_err();
            assert!(e.0.starts_with("--nodes:"), "{bad}: {e}");
            assert!(e.0.contains("`all`"), "{bad}: {e}");
        }
    }

    #[test]
    fn bad_duration_and_selector_and_workload() {
        let e = spec_of(&["submit", "stress", "--duration", "-5m"]).unwrap_err();
        assert!(
            e.0.starts_with("--duration:") && e.0.contains("negative"),
            "{e}"
        );
        let e = spec_of(&["submit", "stress", "--duration", "99999999h"]).unwrap_err();
        assert!(
            e.0.starts_with("--duration:") && e.0.contains("7 days"),
            "{e}"
        );
        let e = spec_of(&["submit", "stress", "--duration", "soon"]).unwrap_err();
        assert!(e.0.starts_with("--duration:"), "{e}");
        let e = spec_of(&["submit", "stress", "--selector", "gpu"]).unwrap_err();
        assert!(
            e.0.starts_with("--selector:") && e.0.contains("key=value"),
            "{e}"
        );
        let e = spec_of(&["submit", "burn"]).unwrap_err();
        assert!(
            e.0.contains("unknown workload `burn`") && e.0.contains("stress"),
            "{e}"
        );
        let e = spec_of(&["submit", "stress", "--env", "NOEQUALS"]).unwrap_err();
        assert!(e.0.starts_with("--env:"), "{e}");
        let e = spec_of(&["submit", "stress", "--param", "x"]).unwrap_err();
        assert!(e.0.starts_with("--param:"), "{e}");
    }

    #[test]
    fn param_errors_name_the_dedicated_flag() {
        let e = spec_of(&["submit", "stress", "--factor", "2"]).unwrap_err();
        assert!(
            e.0.starts_with("--factor:") && e.0.contains("no parameter `factor`"),
            "{e}"
        );
        let e = spec_of(&["submit", "nccl", "--min-bytes", "2M", "--max-bytes", "1M"]).unwrap_err();
        assert!(e.0.starts_with("--min-bytes:"), "{e}");
        let e = spec_of(&["submit", "stress", "--size", "abc"]).unwrap_err();
        assert!(e.0.starts_with("--size:"), "{e}");
        let e = spec_of(&["submit", "stress", "--param", "bogus=1"]).unwrap_err();
        assert!(e.0.starts_with("--param bogus:"), "{e}");
    }

    #[test]
    fn workload_flags_are_the_catalogue() {
        use clap::CommandFactory;
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
                .filter(|a| a.get_help_heading() == Some(PARAMS_HEADING))
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

//! The flags that make a `JobSpec`, shared by `submit` and `plan`, and
//! their translation (`to_spec`). The spec is checked here with the same
//! `spec::normalize` the coordinator runs, so a bad flag fails before
//! anything is sent and the error names the flag to fix.

use std::collections::HashSet;
use std::path::PathBuf;

use clap::{Arg, ArgAction, ArgMatches, Args};
use gpuctl_core::{catalogue, spec};
use gpuctl_proto::pb::JobSpec;

use super::parse::{parse_duration_flag, parse_nodes, read_rules, split_kv};
use crate::error::{usage, UsageError};

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

    /// Environment override for every worker, K=V; repeatable; wins over the plan (not the
    /// names the agent sets for each rank: RANK, WORLD_SIZE, MASTER_ADDR, CUDA_VISIBLE_DEVICES, …).
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

pub(crate) const PARAMS_HEADING: &str = "Workload parameters";

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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// `submit` and `plan` as typed, without the rest of the command line
    /// (`args.rs` tests those through the real `Cli`).
    #[derive(Debug, Parser)]
    enum JobVerb {
        Submit(JobArgs),
        Plan(JobArgs),
    }

    fn spec_of(args: &[&str]) -> Result<JobSpec, UsageError> {
        let mut v = vec!["gpuctl"];
        v.extend_from_slice(args);
        match JobVerb::try_parse_from(v).unwrap_or_else(|e| panic!("{args:?}: {e}")) {
            JobVerb::Submit(j) | JobVerb::Plan(j) => j.to_spec(),
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
}

//! The grammar of `gpuctl local`: `local up`'s flags and examples.

use std::path::PathBuf;

use clap::{Args, Subcommand};

pub const EXAMPLES: &str = "\
Examples:
  gpuctl local up --agents 4 --data-dir /tmp/fleet          # CPU ranks, no GPU needed
  gpuctl local up --agents 1 --agent-arg=--libtorch=/path/to/site-packages   # this host's GPUs
  sudo gpuctl local up --agents 4 --netns                   # each agent in its own network namespace";

#[derive(Debug, Subcommand)]
pub enum LocalCommand {
    /// Start a coordinator and N agents on this machine and stay in the foreground.
    #[command(after_help = EXAMPLES)]
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

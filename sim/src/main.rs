//! `gpuctl-sim`: `bench` runs the coordinator's scale bench (a real
//! coordinator process against a simulated fleet, docs/benchmarks.md);
//! `failover` kills the leader of two coordinators on etcd mid-job (docs/benchmarks.md);
//! `fleet` runs only the simulated fleet against a coordinator you started,
//! until Ctrl-C, for poking at it with `gpuctl`; `search` runs the search for
//! slow nodes and links against a modelled fleet and prints its table;
//! `search-fleet` runs it through a real coordinator on a simulated fleet
//! with culprits placed, and scores the report.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use gpuctl_sim::bench::failover::{self, FailoverConfig};
use gpuctl_sim::bench::search_fleet::{self, SearchFleetConfig};
use gpuctl_sim::bench::{self, BenchConfig};
use gpuctl_sim::culprits::Culprits;
use gpuctl_sim::fleet::{self, FleetConfig, RankConnections};
use gpuctl_sim::search_ranks::SearchPlay;

// The simulator's 4,096 agents and 32,768 ranks spent ~6 % of their CPU in
// glibc's malloc and free (perf, mid-job).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "gpuctl-sim",
    version,
    about = "A simulated GPU fleet for the gpuctl coordinator"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(clap::Args)]
struct Shape {
    /// Simulated nodes.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=16384))]
    nodes: u32,
    /// GPUs per node.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    gpus: u32,
    /// Each rank's progress and each node's telemetry batch, as real agents and workers.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    interval: Duration,
    /// HTTP/2 connections the simulated agents share (0: one per agent, like a real fleet).
    #[arg(long, default_value_t = 0)]
    connections: usize,
    /// Whose connection the simulated workers' calls take: the agent's, as
    /// gpuctl-agent relays them (`agent`); or their own for each job, as
    /// `gpuctl-agent --worker-connections direct` (`rank`, two file
    /// descriptors per rank here; `node` opens and closes connections as
    /// `rank` does, one per node).
    #[arg(long, value_enum, default_value_t = RankConnections::Agent)]
    rank_connections: RankConnections,
}

#[derive(clap::Args)]
struct Priority {
    /// The CPU priority (nice, 0-19) of the threads that run the simulated
    /// agents and ranks. The bench's default, 19, leaves the coordinator the
    /// CPU it would have on a host of its own; its CLI calls and memory
    /// readings keep the bench's own priority. 0 shares the CPU evenly.
    #[arg(long, value_parser = clap::value_parser!(i32).range(0..=19))]
    fleet_nice: Option<i32>,
}

/// What every run against real coordinator processes takes.
#[derive(clap::Args)]
struct Run {
    /// The coordinator binary (default: gpuctl-coordinator next to this binary).
    #[arg(long)]
    coordinator_bin: Option<PathBuf>,
    /// Also write the figures as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Keep the run's folder afterwards (stores, etcd's data, the coordinators' logs).
    #[arg(long)]
    keep_dir: bool,
}

/// The slow nodes and links the fleet's `nccl --pattern search` jobs find.
#[derive(clap::Args)]
struct Slow {
    /// Slow nodes by name, comma-separated (sim-00017,sim-01234).
    #[arg(long, value_delimiter = ',')]
    slow_nodes: Vec<String>,
    /// Slow links, as two node names each, comma-separated (sim-00040:sim-00041,…).
    #[arg(long, value_delimiter = ',')]
    slow_links: Vec<String>,
    /// Or this many culprits drawn from --seed as `gpuctl-sim search` draws
    /// them (nodes and links alternately, each link between neighbours of a
    /// first-round group); printed before the run.
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=4096))]
    culprits: Option<u32>,
    /// Draws the culprits, their speeds and the measurements' noise.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The wall time a search round is played in here (a real one takes
    /// about --round-model).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    round: Duration,
}

impl Slow {
    /// The culprits named or drawn among `nodes` simulated nodes.
    fn culprits(&self, nodes: u32) -> Result<Culprits> {
        match self.culprits {
            Some(k) if !self.slow_nodes.is_empty() || !self.slow_links.is_empty() => {
                anyhow::bail!(
                    "--culprits {k} draws them: give it, or --slow-nodes/--slow-links, not both"
                )
            }
            Some(k) => Culprits::drawn(nodes as usize, k as usize, self.seed),
            None => Culprits::named(&self.slow_nodes, &self.slow_links, self.seed),
        }
    }

    fn play(&self, nodes: u32) -> Result<SearchPlay> {
        if self.round.is_zero() || self.round > Duration::from_secs(600) {
            anyhow::bail!("--round: between 1ms and 10m");
        }
        Ok(SearchPlay::new(
            self.culprits(nodes)?,
            self.seed,
            self.round,
        ))
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a coordinator, register the fleet, idle, run one long and then short stress jobs; print the figures.
    Bench {
        #[command(flatten)]
        shape: Shape,
        #[command(flatten)]
        priority: Priority,
        #[command(flatten)]
        run: Run,
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        idle: Duration,
        /// The long job's duration (the headline use is 15m).
        #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
        long: Duration,
        /// Short jobs after the long one.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(0..=1000))]
        short_jobs: u32,
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        short: Duration,
        /// Pause between rounds of CLI calls (nodes, jobs, status).
        #[arg(long, default_value = "200ms", value_parser = humantime::parse_duration)]
        cli_every: Duration,
        /// The CPU priority (nice, -20..19) of the thread that makes the CLI
        /// calls. 0: the bench's own. A person's CLI runs on a machine of its
        /// own; here its decoding of a 16,384-row `fleet` (7 ms of CPU) shares
        /// the two cores with the simulated ranks at `--fleet-nice` 0, and
        /// took up to 275 ms. Below 0 needs root (CAP_SYS_NICE).
        #[arg(long, default_value_t = 0, allow_hyphen_values = true,
              value_parser = clap::value_parser!(i32).range(-20..=19))]
        cli_nice: i32,
        /// The coordinator's log filter (`RUST_LOG` syntax): its log is read
        /// for when each report was stored, so keep `scheduler::reports` at info.
        #[arg(long, default_value = bench::COORDINATOR_LOG)]
        coordinator_log: String,
    },
    /// A leader and a standby coordinator on one etcd, the fleet given both, the leader killed (SIGKILL) mid-job; print how the fleet and the job came through.
    Failover {
        #[command(flatten)]
        shape: Shape,
        #[command(flatten)]
        priority: Priority,
        #[command(flatten)]
        run: Run,
        /// The stress job's length.
        #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
        job: Duration,
        /// When the leader is killed, after every node took its assignment.
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        kill_after: Duration,
        /// Processes the simulated fleet is split over, each with its own
        /// open-files limit: 16,384 agents reconnecting need more
        /// descriptors than one process may hold here. Each node connects
        /// from a loopback address of its own, as from a host of its own.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=8))]
        fleet_processes: u32,
    },
    /// The search for slow nodes and links against a modelled fleet: rounds, tests, culprits found, false blames.
    Search {
        /// Draws per fleet size and culprit count.
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        draws: u32,
        /// Healthy spread of one measurement (0.05: NVLink/InfiniBand; 0.2: sockets).
        #[arg(long, default_value_t = 0.05)]
        noise: f64,
        /// Modelled seconds a round takes (communicators and one all_reduce).
        #[arg(long, default_value_t = 30.0)]
        round_s: f64,
        /// Fleet sizes, one table block each (up to 131,072 nodes).
        #[arg(long, value_delimiter = ',', default_value = "7,16,64,256,1024,4096", value_parser = clap::value_parser!(u32).range(2..=131_072))]
        sizes: Vec<u32>,
        /// Culprit counts (slow nodes and links, alternately), a row each
        /// where they fit on distinct nodes (at most a sixteenth of the
        /// fleet); a row with half the first-round groups slow is added.
        #[arg(long, value_delimiter = ',', default_value = "0,1,2,4,8", value_parser = clap::value_parser!(u32).range(0..=4096))]
        culprits: Vec<u32>,
    },
    /// Start a coordinator and a fleet with slow nodes and links placed, run `nccl --pattern search` on every node, and score the report: culprits found, missed, false blames.
    SearchFleet {
        #[command(flatten)]
        shape: Shape,
        #[command(flatten)]
        priority: Priority,
        #[command(flatten)]
        run: Run,
        #[command(flatten)]
        slow: Slow,
        /// What a round takes on a real fleet (communicators and one
        /// all_reduce): the modelled duration is the rounds at this.
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        round_model: Duration,
        /// The job on these nodes only, comma-separated (default: every node).
        #[arg(long, value_delimiter = ',')]
        only_nodes: Vec<String>,
    },
    /// Run the simulated fleet against a coordinator until Ctrl-C.
    Fleet {
        #[command(flatten)]
        shape: Shape,
        #[command(flatten)]
        priority: Priority,
        #[command(flatten)]
        slow: Slow,
        #[arg(
            long,
            env = "GPUCTL_COORDINATOR",
            default_value = "http://127.0.0.1:7070"
        )]
        coordinator: String,
        /// The first node's number: sim-NNNNN from here on (a fleet split
        /// over several `fleet` processes).
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=131_072))]
        first_node: u32,
        /// Each node's connections from a loopback address of its own
        /// (127.1.0.0 on), as from hosts of their own, not all from
        /// 127.0.0.1 (Linux only).
        #[arg(long)]
        own_addresses: bool,
        /// Print the fleet's counts as JSON on stdout every 100 ms once
        /// registered (what `failover --fleet-processes` reads).
        #[arg(long)]
        counts: bool,
    },
}

fn next_to_me(name: &str) -> Result<PathBuf> {
    let me = std::env::current_exe().context("locating gpuctl-sim")?;
    Ok(me.with_file_name(name))
}

/// The coordinator binary given, or the one next to this binary.
fn coordinator(given: Option<PathBuf>) -> Result<PathBuf> {
    match given {
        Some(p) => Ok(p),
        None => next_to_me("gpuctl-coordinator"),
    }
}

/// A fresh folder for one run's processes.
fn run_dir(name: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The run's folder kept when asked (saying what it `holds`), else removed.
fn leave(dir: &std::path::Path, keep: bool, holds: &str) {
    if keep {
        eprintln!("{holds} are in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The figures as JSON at `--json PATH`, when given.
fn write_json(path: Option<PathBuf>, json: serde_json::Value) -> Result<()> {
    if let Some(path) = path {
        std::fs::write(&path, serde_json::to_string_pretty(&json)?)
            .with_context(|| format!("--json: writing {}", path.display()))?;
    }
    Ok(())
}

fn connections(shape: &Shape) -> usize {
    if shape.connections == 0 {
        shape.nodes as usize
    } else {
        shape.connections
    }
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = gpuctl_sim::allocator::keep_freed_pages() {
        tracing::warn!("mimalloc's purge delay left as it was: {e}");
    }
    let cli = Cli::parse();
    if let Cmd::Search {
        draws,
        noise,
        round_s,
        sizes,
        culprits,
    } = &cli.command
    {
        if !(0.0..0.5).contains(noise) {
            anyhow::bail!("--noise {noise}: a spread between 0 and 0.5 (0.05 is ±5 %)");
        }
        print!(
            "{}",
            gpuctl_sim::search::table(
                &sizes.iter().map(|&n| n as usize).collect::<Vec<_>>(),
                &culprits.iter().map(|&k| k as usize).collect::<Vec<_>>(),
                *noise,
                *draws as usize,
                *round_s
            )
        );
        return Ok(());
    }
    // One connection per simulated agent, and more per job, need more
    // descriptors than the usual soft limit of 1,024.
    let _ = gpuctl_core::server::raise_open_files_limit();
    let nice = match &cli.command {
        Cmd::Bench { priority, .. } => priority.fleet_nice.unwrap_or(BENCH_FLEET_NICE),
        Cmd::Fleet { priority, .. } => priority.fleet_nice.unwrap_or(0),
        Cmd::Failover { priority, .. } => priority.fleet_nice.unwrap_or(BENCH_FLEET_NICE),
        Cmd::Search { .. } => 0,
        // The fleet's ranks play the search with the coordinator's CPU
        // left alone, as the bench's.
        Cmd::SearchFleet { priority, .. } => priority.fleet_nice.unwrap_or(BENCH_FLEET_NICE),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_start(move || lower_priority(nice))
        .build()?;
    rt.block_on(async move {
        match cli.command {
            Cmd::Bench {
                shape,
                priority: _,
                run,
                idle,
                long,
                short_jobs,
                short,
                cli_every,
                cli_nice,
                coordinator_log,
            } => {
                let cfg = BenchConfig {
                    coordinator_bin: coordinator(run.coordinator_bin)?,
                    nodes: shape.nodes as usize,
                    gpus: shape.gpus,
                    idle,
                    long,
                    short_jobs: short_jobs as usize,
                    short,
                    interval: shape.interval,
                    connections: connections(&shape),
                    rank_connections: shape.rank_connections,
                    cli_every,
                    cli_nice,
                    coordinator_log,
                };
                let dir = run_dir("gpuctl-sim")?;
                let report = bench::run(&cfg, dir.clone()).await;
                leave(&dir, run.keep_dir, "the coordinator's store and log");
                let report = report?;
                report.print();
                write_json(run.json, report.to_json())
            }
            Cmd::Failover {
                shape,
                priority: _,
                run,
                job,
                kill_after,
                fleet_processes,
            } => {
                let cfg = FailoverConfig {
                    fleet_processes: fleet_processes as usize,
                    sim_bin: next_to_me("gpuctl-sim")?,
                    fleet_nice: nice,
                    coordinator_bin: coordinator(run.coordinator_bin)?,
                    nodes: shape.nodes as usize,
                    gpus: shape.gpus,
                    interval: shape.interval,
                    connections: connections(&shape),
                    job,
                    kill_after,
                };
                let dir = run_dir("gpuctl-sim-failover")?;
                let report = failover::run(&cfg, dir.clone()).await;
                leave(&dir, run.keep_dir, "etcd's data and the coordinators' logs");
                let report = report?;
                failover::print(&report);
                write_json(run.json, report.to_json())
            }
            // Answered before the runtime started.
            Cmd::Search { .. } => Ok(()),
            Cmd::SearchFleet {
                shape,
                priority: _,
                run,
                slow,
                round_model,
                only_nodes,
            } => {
                let play = slow.play(shape.nodes)?;
                let cfg = SearchFleetConfig {
                    coordinator_bin: coordinator(run.coordinator_bin)?,
                    nodes: shape.nodes as usize,
                    gpus: shape.gpus,
                    interval: shape.interval,
                    connections: connections(&shape),
                    culprits: play.culprits,
                    only_nodes,
                    seed: play.seed,
                    round: play.round,
                    round_model,
                    coordinator_log: bench::COORDINATOR_LOG.into(),
                };
                let dir = run_dir("gpuctl-sim-search")?;
                let report = search_fleet::run(&cfg, dir.clone()).await;
                leave(&dir, run.keep_dir, "the coordinator's store and log");
                let report = report?;
                report.print();
                write_json(run.json, report.to_json())
            }
            Cmd::Fleet {
                shape,
                coordinator,
                priority: _,
                slow,
                first_node,
                own_addresses,
                counts,
            } => {
                let stop = gpuctl_core::shutdown::on_signals()?;
                let play = slow.play(shape.nodes)?;
                if !play.culprits.is_empty() {
                    eprintln!("culprits: {}", play.culprits.describe());
                }
                let f = fleet::start_with(
                    FleetConfig {
                        url: coordinator,
                        nodes: shape.nodes as usize,
                        gpus: shape.gpus,
                        interval: shape.interval,
                        connections: connections(&shape),
                        rank_connections: shape.rank_connections,
                        first: first_node as usize,
                        own_addresses,
                    },
                    std::sync::Arc::new(play),
                    stop.clone(),
                )
                .await?;
                eprintln!(
                    "{} simulated nodes registered; Ctrl-C stops them",
                    f.names.len()
                );
                if counts {
                    gpuctl_sim::shards::print_counts(f.stats.clone(), stop.clone());
                }
                stop.cancelled().await;
                Ok(())
            }
        }
    })
}

/// The bench's fleet priority: the lowest. In a real fleet the agents and
/// workers run on other hosts; here they share two cores with the
/// coordinator, and at nice 0 they took half of them (0.9-1.0 CPU s/s at
/// 4,096 nodes) while the coordinator judged a job.
const BENCH_FLEET_NICE: i32 = 19;

/// Lowers the calling thread's CPU priority to `nice` (Linux's nice is per
/// thread). Threads the runtime starts run the fleet; the main thread, which
/// runs the bench and starts its other threads and the coordinator, keeps
/// its own.
fn lower_priority(nice: i32) {
    // Raising a nice (0..=19 here) needs no privilege.
    let _ = gpuctl_sim::priority::set_thread_nice(nice);
}

//! Command line, environment, parameters: what one rank is told to do.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use gpuctl_core::catalogue::TypedParams;
use gpuctl_core::clock::Clock;

use crate::comm::watched::{watched, Units};
use crate::comm::{nccl::NcclComm, tcp::TcpComm, Collectives};
use crate::device::{advertise_host, DeviceInfo};
use crate::progress::Progress;
use crate::rendezvous::Rendezvous;

/// One rank of one workload (docs/architecture.md, "Worker process").
#[derive(Parser, Debug, Clone)]
#[command(
    name = "gpuctl-worker",
    version,
    about = "gpuctl worker: one rank of one workload"
)]
pub struct Args {
    /// Coordinator URL (WorkerService), e.g. http://10.0.0.1:7070.
    #[arg(long)]
    pub coordinator: String,
    #[arg(long)]
    pub job_id: String,
    #[arg(long)]
    pub attempt: u32,
    /// stress | nccl | ddp | fsdp | maxbatch | p2p
    #[arg(long)]
    pub workload: String,
    /// This node's name, as the coordinator knows it.
    #[arg(long)]
    pub node: String,
    /// NVML index of the rank's GPU; absent: a CPU rank. (The worker opens the
    /// CUDA ordinal, 0 when CUDA_VISIBLE_DEVICES names one GPU, as the agent does.)
    #[arg(long)]
    pub gpu_index: Option<u32>,
    #[arg(long)]
    pub gpu_uuid: Option<String>,
    /// Run time of timed workloads (stress).
    #[arg(long, default_value_t = 0)]
    pub duration_ms: u64,
    /// The agent kills the worker after this; the worker stops itself first.
    #[arg(long, default_value_t = 0)]
    pub deadline_unix_ms: u64,
    /// The first progress report this long after the start (large jobs
    /// spread them: `gpuctl_core::spec::first_progress_ms`).
    #[arg(long, default_value_t = 0)]
    pub first_report_ms: u64,
    /// Workload parameter, key=value (repeatable).
    #[arg(long = "param", value_parser = parse_kv)]
    pub params: Vec<(String, String)>,
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("`{s}` is not key=value"))
}

/// torchrun's environment, as the agent sets it.
#[derive(Debug, Clone)]
pub struct RankEnv {
    pub rank: usize,
    pub local_rank: usize,
    pub world_size: usize,
    pub local_world_size: usize,
    pub group_rank: usize,
    pub master_addr: String,
    pub master_port: u16,
}

impl RankEnv {
    /// Reads RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
    /// MASTER_ADDR, MASTER_PORT; unset means a single rank on this host.
    pub fn from_env() -> Result<Self> {
        fn num(name: &str, default: usize) -> Result<usize> {
            match std::env::var(name) {
                Ok(v) if !v.trim().is_empty() => v
                    .trim()
                    .parse()
                    .map_err(|_| anyhow!("environment {name}=`{v}` is not a whole number")),
                _ => Ok(default),
            }
        }
        let rank = num("RANK", 0)?;
        let world_size = num("WORLD_SIZE", 1)?;
        let env = RankEnv {
            rank,
            local_rank: num("LOCAL_RANK", rank)?,
            world_size,
            local_world_size: num("LOCAL_WORLD_SIZE", world_size)?,
            group_rank: num("GROUP_RANK", 0)?,
            master_addr: std::env::var("MASTER_ADDR").unwrap_or_else(|_| "127.0.0.1".into()),
            master_port: num("MASTER_PORT", 29500)?
                .try_into()
                .map_err(|_| anyhow!("MASTER_PORT is not a port"))?,
        };
        if env.world_size == 0 || env.rank >= env.world_size {
            bail!(
                "RANK={} is not a rank of WORLD_SIZE={}",
                env.rank,
                env.world_size
            );
        }
        Ok(env)
    }

    /// The first number of RANK, for error messages before the env is checked.
    pub fn rank_hint() -> u32 {
        std::env::var("RANK")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// `WORLD_SIZE`, or 1 where it is missing or bad (as for
    /// [`Self::rank_hint`], [`Self::from_env`] reports that).
    pub fn world_hint() -> u32 {
        std::env::var("WORLD_SIZE")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(1)
    }
}

/// Everything a workload needs.
pub struct Ctx {
    pub args: Args,
    pub env: RankEnv,
    pub dev: DeviceInfo,
    /// The workload and its parameters, every default filled in for this device.
    pub params: TypedParams,
    pub rdzv: Arc<dyn Rendezvous>,
    pub progress: Progress,
    /// How long to wait for other ranks at rendezvous.
    pub rendezvous_timeout: Duration,
    /// Highest GPU memory use seen (bytes), for the result.
    pub peak_gpu_bytes: AtomicU64,
    /// Where the rank's deadlines read the time, so that a test can hold it.
    pub clock: Clock,
}

impl Ctx {
    /// Records the GPU's memory in use now into the peak.
    pub fn sample_memory(&self) {
        if let Some((used, _)) = self.dev.gpu_memory() {
            self.peak_gpu_bytes.fetch_max(used, Ordering::Relaxed);
        }
    }

    /// The backend this rank's device calls for: NCCL on a GPU, TCP on a CPU;
    /// its calls show as waits in the rank's progress, and count as `units`
    /// say ([`watched`]).
    pub fn make_comm(&self, units: Units) -> Result<Box<dyn Collectives>> {
        self.make_comm_in(
            self.env.rank,
            self.env.world_size,
            self.rdzv.as_ref(),
            units,
        )
    }

    /// A communicator over a group of the job's ranks, this one being `rank` of
    /// `world`, meeting through `rdzv` (a [`crate::rendezvous::Scoped`] one for
    /// a group smaller than the job, so that groups keep their keys apart).
    pub fn make_comm_in(
        &self,
        rank: usize,
        world: usize,
        rdzv: &dyn Rendezvous,
        units: Units,
    ) -> Result<Box<dyn Collectives>> {
        let c: Box<dyn Collectives> = if self.dev.is_cuda() {
            let c = NcclComm::new(rank, world, self.dev.ordinal, rdzv, self.rendezvous_timeout)
                .context("setting up NCCL")?;
            Box::new(c)
        } else {
            let host = std::env::var("GPUCTL_ADVERTISE_ADDR")
                .unwrap_or_else(|_| advertise_host(&self.env.master_addr, self.env.master_port));
            let c = TcpComm::connect(rank, world, rdzv, &host, self.rendezvous_timeout)
                .context("setting up the TCP ring")?;
            Box::new(c)
        };
        Ok(watched(c, &self.progress, units))
    }

    /// The duration of a timed workload: `--duration-ms` (else the spec's
    /// default), ending `WORKER_END_MARGIN_MS` before the deadline.
    pub fn duration(&self) -> Duration {
        let mut d = Duration::from_millis(if self.args.duration_ms > 0 {
            self.args.duration_ms
        } else {
            gpuctl_core::spec::DEFAULT_DURATION_MS
        });
        if self.args.deadline_unix_ms > 0 {
            let left = self
                .args
                .deadline_unix_ms
                .saturating_sub(self.clock.now_ms())
                .saturating_sub(gpuctl_core::spec::WORKER_END_MARGIN_MS);
            d = d.min(Duration::from_millis(left));
        }
        d
    }
}

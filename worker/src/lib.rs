//! gpuctl-worker: one rank of one workload.
//!
//! The agent starts one worker per rank (docs/architecture.md, "Worker
//! process"). The worker opens its device, meets the other ranks through the
//! coordinator's rendezvous, runs the workload while reporting progress about
//! once a second, and sends one `RankResult` at the end: exit code 0 when it is
//! ok, 1 otherwise, and `outage::UNDELIVERED_EXIT` when the coordinator did
//! not take the result for the whole of its wait. Every error names the node
//! and the rank.

pub mod client;
pub mod comm;
mod connect;
pub mod context;
pub mod device;
pub mod digest;
pub mod kernels;
pub mod partial;
pub mod prestart;
pub mod profile;
pub mod progress;
pub mod rendezvous;
pub mod shim;
pub mod timeline;
pub mod workloads;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use gpuctl_proto::pb::{rank_result::Detail, RankResult};

use crate::client::CoordinatorClient;
use crate::context::{Args, Ctx, RankEnv};
use crate::device::DeviceInfo;
use crate::progress::{Progress, ProgressTarget};
use crate::rendezvous::Watched;
use gpuctl_core::catalogue::TypedParams;
use gpuctl_core::clock::Clock;

/// Logs to stderr (the agent forwards it); `RUST_LOG` filters, default info.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .try_init();
}

/// The CUDA ordinal to use: 0 when the agent narrowed the process to one GPU
/// with CUDA_VISIBLE_DEVICES, else the LOCAL_RANK.
fn cuda_ordinal(env: &RankEnv) -> usize {
    match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(v) if !v.trim().is_empty() && !v.contains(',') => 0,
        _ => env.local_rank,
    }
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    let text = if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic".into()
    };
    without_backtrace(&text)
}

/// libtorch's errors carry the C++ stack ("Exception raised from ...",
/// 30 frames, 4 KB): the report wants the sentence; the panic hook already
/// wrote the whole message to the worker's log (`gpuctl logs`).
fn without_backtrace(text: &str) -> String {
    // As a Debug-formatted error (`unwrap`) the newline is the two
    // characters `\n`; as a plain message it is a newline.
    let at = text
        .find("\\nException raised from")
        .or_else(|| text.find("\nException raised from"));
    match at {
        Some(i) => {
            let mut short = text[..i].to_string();
            // The tch wrapper's quoting, closed again: Torch("...").
            if short.contains("Torch(\"") {
                short.push_str("\")");
            }
            short
        }
        None => text.to_string(),
    }
}

/// Runs the workload and fills `res` as it learns facts; errors become the result's.
fn execute(
    args: &Args,
    client: &Arc<CoordinatorClient>,
    progress: &Progress,
    clock: &Clock,
    res: &mut RankResult,
) -> Result<()> {
    let env = RankEnv::from_env()?;
    res.rank = env.rank as u32;
    res.torch_version = device::torch_version();
    let dev = if args.gpu_index.is_some() {
        let d = DeviceInfo::cuda(cuda_ordinal(&env), args.gpu_uuid.as_deref().unwrap_or(""))?;
        if let Ok(v) = comm::nccl::nccl_version() {
            res.nccl_version = v;
        }
        d
    } else {
        let threads = std::env::var("OMP_NUM_THREADS")
            .ok()
            .and_then(|v| v.trim().parse::<i32>().ok())
            .filter(|n| *n > 0)
            .unwrap_or(1);
        tch::set_num_threads(threads);
        DeviceInfo::cpu()
    };
    res.device = dev.label.clone();
    res.device_name = dev.name.clone();
    res.gpu_uuid = if dev.uuid.is_empty() {
        args.gpu_uuid.clone().unwrap_or_default()
    } else {
        dev.uuid.clone()
    };
    res.torch_version = device::torch_version();
    tracing::info!(
        node = %args.node,
        rank = env.rank,
        world = env.world_size,
        device = %dev.label,
        name = %dev.name,
        torch = %res.torch_version,
        workload = %args.workload,
        "worker starting"
    );
    let given = args.params.iter().cloned().collect();
    let ctx = Ctx {
        params: TypedParams::build(&args.workload, &given, dev.is_cuda())
            .map_err(gpuctl_core::request::RequestError::from)?,
        args: args.clone(),
        env,
        dev,
        rdzv: Arc::new(Watched::new(client.clone(), progress.clone())),
        progress: progress.clone(),
        rendezvous_timeout: Duration::from_secs(
            std::env::var("GPUCTL_RENDEZVOUS_TIMEOUT_S")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(300),
        ),
        peak_gpu_bytes: AtomicU64::new(0),
        clock: clock.clone(),
    };
    partial::arm(client.clone(), res.clone());
    let outcome = workloads::run(&ctx);
    ctx.sample_memory();
    res.peak_memory_bytes = if ctx.dev.is_cuda() {
        ctx.peak_gpu_bytes.load(Ordering::Relaxed)
    } else {
        device::peak_rss_bytes()
    };
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            // What the rank measured before it failed goes with the error.
            res.detail = partial::kept();
            return Err(e);
        }
    };
    if let Some(v) = outcome.nccl_version {
        res.nccl_version = v;
    }
    res.detail = Some(outcome.detail);
    res.more_train = outcome.more_train;
    if !ctx.dev.is_cuda() {
        // Training resets the resident peak for each model (its own figure):
        // the rank's peak is the highest of them.
        let first = match &res.detail {
            Some(Detail::Train(t)) => Some(t),
            _ => None,
        };
        let highest = first
            .into_iter()
            .chain(&res.more_train)
            .map(|t| t.driver_peak_memory_bytes)
            .max();
        res.peak_memory_bytes = res.peak_memory_bytes.max(highest.unwrap_or(0));
    }
    if let Some(e) = outcome.error {
        return Err(anyhow!(e));
    }
    Ok(())
}

/// The whole life of a worker; returns the exit code.
pub fn run_worker(args: Args) -> i32 {
    let started = Instant::now();
    let rank_hint = RankEnv::rank_hint();
    let who = format!("node {} rank {}", args.node, rank_hint);
    let client = match CoordinatorClient::new(&args.coordinator, &args.job_id, args.attempt) {
        Ok(c) => Arc::new(c),
        Err(e) => {
            tracing::error!("{who}: {e:#}");
            return 1;
        }
    };
    // One clock for the whole rank: its deadline, its marks and its
    // workloads' time left all read the same time.
    let clock = Clock::system();
    let progress = match Progress::start(
        ProgressTarget {
            url: args.coordinator.clone(),
            job_id: args.job_id.clone(),
            attempt: args.attempt,
            rank: rank_hint,
            node: args.node.clone(),
            deadline_unix_ms: args.deadline_unix_ms,
            first_report: Duration::from_millis(args.first_report_ms),
        },
        clock.clone(),
    ) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!("{who}: progress reports are off: {e:#}");
            Progress::disabled()
        }
    };
    let mut res = RankResult {
        job_id: args.job_id.clone(),
        attempt: args.attempt,
        rank: rank_hint,
        node: args.node.clone(),
        device: gpuctl_proto::device_label(args.gpu_index),
        gpu_uuid: args.gpu_uuid.clone().unwrap_or_default(),
        nccl_version: if args.gpu_index.is_none() {
            "tcp-ring".into()
        } else {
            String::new()
        },
        ..Default::default()
    };
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        execute(&args, &client, &progress, &clock, &mut res)
    }));
    // Whether the error is the request's (the coordinator then blames no node).
    let mut request = false;
    let error = match outcome {
        Ok(Ok(())) => None,
        Ok(Err(e)) => {
            // Ended by the coordinator while it waited: what it measured is
            // evidence, its error no fault of its own.
            res.partial = e.chain().any(|c| c.is::<client::JobOver>());
            request = e
                .chain()
                .any(|c| c.is::<gpuctl_core::request::RequestError>());
            Some(format!("{e:#}"))
        }
        Err(p) => Some(format!("crashed: {}", panic_message(p))),
    };
    res.elapsed_ms = started.elapsed().as_millis() as u64;
    res.ok = error.is_none();
    if let Some(e) = error {
        let who = format!("node {} rank {}", res.node, res.rank);
        tracing::error!("{who}: {e}");
        res.error = format!("{who} ({}): {e}", res.device);
        if request {
            res.error = gpuctl_core::request::rank_error(&res.error);
        }
        progress.message(&res.error);
    }
    progress.update(if res.ok { "done" } else { "failed" }, 1.0, &[]);
    res.phases = progress.phases();
    progress.finish();
    // A big job's ranks send coarser timelines: 32,768 ranks of 15 minutes
    // would send 1.5 GB at once.
    gpuctl_core::timeline::thin(
        &mut res,
        gpuctl_core::timeline::points_per_rank(RankEnv::world_hint()),
    );
    let ok = res.ok;
    let sent = client.report_result(res);
    // Until the whole result is in, a SIGTERM still sends the partial one.
    partial::clear();
    match sent {
        Ok(ack) if !ack.ok => {
            tracing::warn!("the coordinator did not take the result: {}", ack.message)
        }
        Ok(_) => {}
        Err(e) => {
            // The last error line is what the report shows for this rank.
            tracing::error!("{who}: the result did not reach the coordinator: {e:#}");
            return gpuctl_core::retry::outage::UNDELIVERED_EXIT;
        }
    }
    if ok {
        0
    } else {
        1
    }
}

#[cfg(test)]
mod panic_tests {
    use super::without_backtrace;

    #[test]
    fn torch_errors_lose_their_cpp_stack() {
        let debug = "called `Result::unwrap()` on an `Err` value: Torch(\"mat1 and mat2 must have the same dtype\\nException raised from meta at x.cpp:195 (most recent call first):\\nframe #0: c10::Error\")";
        assert_eq!(
            without_backtrace(debug),
            "called `Result::unwrap()` on an `Err` value: Torch(\"mat1 and mat2 must have the same dtype\")"
        );
        let plain = "CUDA out of memory\nException raised from malloc\nframe #0";
        assert_eq!(without_backtrace(plain), "CUDA out of memory");
        assert_eq!(without_backtrace("no stack here"), "no stack here");
    }
}

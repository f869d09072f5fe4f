//! A fake stress worker: what one rank of `gpuctl-worker` sends for a stress
//! job, without the GEMMs. Progress each interval (phase, fraction, TFLOP/s,
//! a growing iteration counter), then one result with a TFLOP/s figure per
//! interval, the seeded digest every healthy rank agrees on, and the phase
//! marks a real worker records. Every call carries the rank's secret.

use std::sync::Arc;
use std::time::Duration;

use gpuctl_core::client::Channel;
use gpuctl_core::clock::Clock;
use gpuctl_core::shutdown::Shutdown;
use gpuctl_proto::pb::{
    rank_result::Detail, worker_service_client::WorkerServiceClient, JobSpec, PhaseKind, PhaseMark,
    RankPlacement, RankProgress, RankProgressReport, RankResult, StressResult,
};

use crate::counters::Stats;

/// One rank's assignment.
#[derive(Debug, Clone)]
pub struct RankJob {
    pub job_id: String,
    pub attempt: u32,
    pub placement: RankPlacement,
    pub secret: String,
    pub spec: JobSpec,
    pub interval: Duration,
    pub world_size: u32,
    /// The time its messages carry: its agent's.
    pub clock: Clock,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Done,
    Cancelled,
    Failed,
    /// The coordinator did not take the result for the whole wait: the
    /// worker's `outage::UNDELIVERED_EXIT`.
    Undelivered,
}

/// An H200's bf16 GEMM rate, give or take a little.
const TFLOPS: f64 = 720.0;
/// FLOPs of one 8192³ product.
const GEMM_FLOP: f64 = 2.0 * 8192.0 * 8192.0 * 8192.0;
const PHASE: &str = "gemm bf16 8192";

/// A call of `job`'s rank, with its secret as a real worker's client sends it.
pub(crate) fn request<T>(job: &RankJob, msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    if let Ok(mut v) = job.secret.parse::<tonic::metadata::AsciiMetadataValue>() {
        // As the worker's client sends it: never indexed.
        v.set_sensitive(true);
        req.metadata_mut().insert(gpuctl_core::auth::RANK_SECRET, v);
    }
    req
}

/// Where a rank's calls go: asked again after a call fails, so that a rank
/// of an agent that moved to another coordinator (a failover) follows it, as
/// a real worker's calls do through its agent's relay.
#[derive(Clone)]
pub struct Clients {
    make: Arc<dyn Fn() -> WorkerServiceClient<Channel> + Send + Sync>,
    away: Arc<std::sync::atomic::AtomicBool>,
}

impl Clients {
    /// `make` gives the client to call with; `away` is set while the
    /// rank's agent has lost its coordinator.
    pub fn new(
        make: Arc<dyn Fn() -> WorkerServiceClient<Channel> + Send + Sync>,
        away: Arc<std::sync::atomic::AtomicBool>,
    ) -> Clients {
        Clients { make, away }
    }

    pub fn get(&self) -> WorkerServiceClient<Channel> {
        (self.make)()
    }

    /// `call`'s answer, or a failure without making it while the rank's
    /// agent has no coordinator: the call would dial the address the agent
    /// lost. On a real fleet that is each host's own cost; here 131,072
    /// ranks' dials to a killed leader took the cores the agents needed to
    /// find the new one, and reached no coordinator either way.
    pub(crate) async fn unless_away<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, tonic::Status>>,
    ) -> Result<T, tonic::Status> {
        if self.away.load(std::sync::atomic::Ordering::Relaxed) {
            // Not polled: a future that is dropped makes no call.
            return Err(tonic::Status::unavailable("the agent has no coordinator"));
        }
        call.await
    }
}

pub async fn run(job: RankJob, clients: Clients, stats: Arc<Stats>, stop: Shutdown) -> Outcome {
    let mut client = clients.get();
    let rank = job.placement.rank;
    let start = job.clock.now_ms();
    let duration = Duration::from_millis(job.spec.duration_ms.max(1_000));
    let intervals = (duration.as_secs_f64() / job.interval.as_secs_f64())
        .round()
        .max(1.0) as usize;
    let mut rng = fastrand::Rng::with_seed(rank as u64 ^ start);
    // A worker keeps every interval and mark and thins them once at the end
    // (`gpuctl_core::timeline`); here they are kept thinned as they come,
    // the intervals merged by their mean as `thin` merges them: 131,072
    // ranks holding 900 of each were over 10 GB of this one process.
    let keep = gpuctl_core::timeline::points_per_rank(job.world_size);
    let merge = intervals.div_ceil(keep).max(1);
    let mark_every = intervals.div_ceil(2 * keep).max(1);
    let mut tflops = Vec::with_capacity(intervals.div_ceil(merge));
    let (mut lo, mut hi, mut chunk) = (f64::INFINITY, f64::NEG_INFINITY, (0.0, 0));
    let mut iterations = 0u64;
    let mut marks = vec![
        PhaseMark {
            phase: "starting".into(),
            unix_ms: start,
            iterations: 0,
            kind: PhaseKind::Setup as i32,
        },
        PhaseMark {
            phase: PHASE.into(),
            unix_ms: start,
            iterations: 0,
            kind: PhaseKind::Measured as i32,
        },
    ];
    // Intervals are played when the rank next wakes (to report, or at the
    // end), not each on its own timer: 32,768 timers a second, for ranks
    // that report every 8 s at that size, cost CPU the simulator shares with
    // the coordinator it measures.
    let began = tokio::time::Instant::now();
    let at = |i: usize| began + job.interval * (i as u32 + 1);
    // As a real worker: the first report spread over the first interval in
    // a large job, the next when the coordinator asks for it.
    let first = gpuctl_core::spec::first_progress_ms(job.world_size, &job.spec, rank);
    let mut next_report = if first == 0 {
        at(0)
    } else {
        began + Duration::from_millis(first)
    };
    let mut sent = 0u64;
    // What the coordinator last asked for; a second until it has, as a worker.
    let mut every_ms = 1_000;
    let mut played = 0;
    while played < intervals {
        let wake = next_report.max(at(played)).min(at(intervals - 1));
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            _ = stop.cancelled() => return Outcome::Cancelled,
        }
        let now_at = tokio::time::Instant::now();
        let mut t = 0.0;
        while played < intervals && at(played) <= now_at {
            t = TFLOPS * (0.98 + rng.f64() * 0.04);
            (lo, hi) = (lo.min(t), hi.max(t));
            chunk = (chunk.0 + t, chunk.1 + 1);
            if chunk.1 == merge {
                tflops.push(chunk.0 / merge as f64);
                chunk = (0.0, 0);
            }
            iterations += (t * 1e12 * job.interval.as_secs_f64() / GEMM_FLOP) as u64;
            if played % mark_every == 0 && marks.len() < 1000 {
                let behind = now_at.saturating_duration_since(at(played)).as_millis() as u64;
                marks.push(PhaseMark {
                    phase: PHASE.into(),
                    unix_ms: job.clock.now_ms().saturating_sub(behind),
                    iterations,
                    kind: PhaseKind::Measured as i32,
                });
            }
            played += 1;
        }
        if played >= intervals || now_at < next_report {
            continue;
        }
        let now = job.clock.now_ms();
        let progress = RankProgressReport {
            job_id: job.job_id.clone(),
            attempt: job.attempt,
            progress: Some(RankProgress {
                rank,
                node: job.placement.node.clone(),
                phase: PHASE.into(),
                fraction: played as f64 / intervals as f64,
                metrics: [("tflops".to_string(), t)].into(),
                message: String::new(),
                unix_ms: now,
                iterations,
                waiting_for: String::new(),
            }),
        };
        match clients
            .unless_away(client.report_progress(request(&job, progress)))
            .await
        {
            Ok(ack) if !ack.get_ref().ok => return Outcome::Cancelled,
            Ok(ack) => {
                let asked = u64::from(ack.get_ref().next_report_ms);
                sent += 1;
                next_report = if asked > 0 {
                    every_ms = asked;
                    // As a real worker spreads its reports.
                    let pause = gpuctl_core::spec::progress_pause_ms(asked, rank, sent);
                    tokio::time::Instant::now() + Duration::from_millis(pause)
                } else {
                    at(played)
                };
            }
            Err(s) => {
                stats.rpc_error("ReportProgress", &s);
                // As a real worker: the next try at its usual pause, not at
                // once (131,072 ranks retrying each second through a
                // failover starved the agents finding the new leader).
                sent += 1;
                let pause = gpuctl_core::spec::progress_pause_ms(every_ms, rank, sent);
                next_report = tokio::time::Instant::now() + Duration::from_millis(pause);
                client = clients.get();
            }
        }
    }
    let end = job.clock.now_ms();
    marks.push(PhaseMark {
        phase: "done".into(),
        unix_ms: end,
        iterations,
        kind: PhaseKind::Measured as i32,
    });
    if chunk.1 > 0 {
        tflops.push(chunk.0 / chunk.1 as f64);
    }
    // At least one interval is played, so none of these is empty; the
    // median is of the merged intervals' means past `keep` intervals.
    let (tflops_min, tflops_max) = (lo, hi);
    let tflops_median = gpuctl_core::stats::median(tflops.clone()).unwrap_or_default();
    let result = RankResult {
        job_id: job.job_id.clone(),
        attempt: job.attempt,
        rank,
        node: job.placement.node.clone(),
        device: format!("cuda:{}", job.placement.local_rank),
        device_name: "NVIDIA H200".into(),
        gpu_uuid: job.placement.gpu_uuid.clone(),
        ok: true,
        error: String::new(),
        peak_memory_bytes: 3 << 30,
        elapsed_ms: end - start,
        torch_version: "2.11.0+cu130".into(),
        nccl_version: "2.28.3".into(),
        detail: Some(Detail::Stress(StressResult {
            dtype: "bf16".into(),
            matrix_size: 8192,
            iterations,
            tflops_min,
            tflops_median,
            tflops_max,
            tflops_per_interval: tflops,
            // The seeded product's checksum: the same on every healthy rank.
            digest: "9d3b1f0c5e7a2468".into(),
            self_mismatches: 0,
            checks: iterations / 10,
            device_class: "NVIDIA H200 · torch 2.11.0+cu130 · nccl 2.28.3".into(),
            interval_s: job.interval.as_secs_f64() * merge as f64,
            with_comm: false,
            ..Default::default()
        })),
        more_train: vec![],
        phases: marks,
        partial: false,
    };
    deliver(&job, result, client, &clients, &stats).await
}

/// Sends a rank's result as a real worker does: with the job's share of
/// timeline points, held until it is delivered (a coordinator restarts).
pub(crate) async fn deliver(
    job: &RankJob,
    mut result: RankResult,
    mut client: WorkerServiceClient<Channel>,
    clients: &Clients,
    stats: &Stats,
) -> Outcome {
    let rank = job.placement.rank;
    gpuctl_core::timeline::thin(
        &mut result,
        gpuctl_core::timeline::points_per_rank(job.world_size),
    );
    // As `gpuctl-worker` (`worker/src/client.rs`): tried again through the
    // agent's grace and a little past it from the first failure.
    use gpuctl_core::retry::outage::{Retrying, DEFAULT_GRACE, GRACE_MARGIN};
    let mut tries = Retrying::new(DEFAULT_GRACE + GRACE_MARGIN);
    loop {
        match clients
            .unless_away(client.report_result(request(job, result.clone())))
            .await
        {
            Ok(ack) => {
                if ack.get_ref().ok {
                    stats.result_sent(&job.job_id);
                    return Outcome::Done;
                }
                stats
                    .results_refused
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(rank, "result refused: {}", ack.get_ref().message);
                return Outcome::Failed;
            }
            Err(s) => {
                stats.rpc_error("ReportResult", &s);
                tracing::debug!(
                    rank,
                    tries = tries.failures(),
                    "ReportResult: {}",
                    s.message()
                );
                // tokio's clock, so that tests on paused time pass it.
                let Some(pause) = tries.failed(tokio::time::Instant::now().into_std()) else {
                    break;
                };
                tokio::time::sleep(pause).await;
                client = clients.get();
            }
        }
    }
    Outcome::Undelivered
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    use super::*;

    #[tokio::test]
    async fn a_call_is_not_made_while_the_agent_is_away() {
        let away = Arc::new(AtomicBool::new(true));
        let clients = Clients::new(
            Arc::new(|| unreachable!("no client is asked for")),
            away.clone(),
        );
        let made = AtomicU32::new(0);
        let call = || async {
            made.fetch_add(1, Ordering::Relaxed);
            Ok::<_, tonic::Status>(())
        };
        let e = clients.unless_away(call()).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable);
        assert_eq!(
            made.load(Ordering::Relaxed),
            0,
            "the call went out while away"
        );
        away.store(false, Ordering::Relaxed);
        clients.unless_away(call()).await.unwrap();
        assert_eq!(made.load(Ordering::Relaxed), 1);
    }
}

//! The coordinator's scale bench: a real `gpuctl-coordinator` process (embedded
//! store in a fresh folder) against a simulated fleet, driven through
//! register → idle → one long stress job on every node → short jobs in a row,
//! with `nodes`, `jobs` and `status` calls all along. It measures the
//! coordinator process only (CPU from /proc, resident memory, store size);
//! the simulator runs in this process and its cost is not counted.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gpuctl_core::client::Channel;
use gpuctl_core::shutdown::Shutdown;
use gpuctl_proto::pb::{
    job_service_client::JobServiceClient, GetJobRequest, GetReportRequest, JobSpec, PlanRequest,
    Report, SubmitRequest,
};
use prost::Message;

use self::calls::{cli_thread, Latencies};
use self::coordinator::{stored_ms, Coordinator};
use self::phase::{hold, Phase};
use crate::fleet::{self, FleetConfig, RankConnections};
use crate::probe;

mod calls;
mod coordinator;
pub mod failover;
mod figures;
mod phase;
mod print;
pub mod search_fleet;

pub use figures::{BenchReport, JobFigures, PhaseFigures};

/// The coordinator's log filter unless told otherwise: the bench reads when
/// each report was stored from `scheduler::reports`' info lines.
pub const COORDINATOR_LOG: &str = "warn,gpuctl_coordinator::scheduler::reports=info";

#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub coordinator_bin: PathBuf,
    pub nodes: usize,
    pub gpus: u32,
    pub idle: Duration,
    pub long: Duration,
    pub short_jobs: usize,
    pub short: Duration,
    pub interval: Duration,
    pub connections: usize,
    pub rank_connections: RankConnections,
    /// The CLI calls' pause between rounds.
    pub cli_every: Duration,
    /// The CLI calls' thread's nice (0: the bench's own).
    pub cli_nice: i32,
    /// The coordinator's `RUST_LOG`.
    pub coordinator_log: String,
}

pub async fn run(cfg: &BenchConfig, dir: PathBuf) -> Result<BenchReport> {
    let co = Coordinator::start(&cfg.coordinator_bin, &cfg.coordinator_log, dir)?;
    let pid = co.pid();
    let watch = probe::Watch::start(pid);
    let stop = Shutdown::new();
    let _guard = stop.clone().drop_guard();
    let mut jobs = co.jobs(Duration::from_secs(60)).await?;
    let lat = Arc::new(Mutex::new(Latencies::default()));
    let mut out = BenchReport {
        nodes: cfg.nodes,
        gpus: cfg.gpus,
        rank_connections: cfg.rank_connections,
        ..Default::default()
    };

    eprintln!(
        "registering {} simulated nodes × {} GPUs…",
        cfg.nodes, cfg.gpus
    );
    let phase = Phase::begin("register", pid, &lat, &watch);
    let t = Instant::now();
    let fleet = fleet::start(
        FleetConfig {
            rank_connections: cfg.rank_connections,
            ..FleetConfig::new(
                co.url.clone(),
                cfg.nodes,
                cfg.gpus,
                cfg.interval,
                cfg.connections,
            )
        },
        stop.clone(),
    )
    .await?;
    out.register_ms = t.elapsed().as_secs_f64() * 1e3;
    out.phases.push(phase.end(&co, &lat));

    let every = (cfg.cli_every, cfg.cli_nice);
    cli_thread(co.url.clone(), lat.clone(), every, stop.clone())?;

    eprintln!("idle for {}…", humantime::format_duration(cfg.idle));
    let mut phase = Phase::begin("idle", pid, &lat, &watch);
    hold(&mut phase, pid, cfg.idle).await;
    out.phases.push(phase.end(&co, &lat));
    out.rss_before_jobs = probe::rss_bytes(pid).unwrap_or(0);
    out.heap_before_jobs = probe::heap_allocated(&co.metrics).await.unwrap_or(0);

    let spec = |d: Duration| JobSpec {
        workload: "stress".into(),
        all_nodes: true,
        duration_ms: d.as_millis() as u64,
        ..Default::default()
    };
    // Alternated, so both see the same load.
    for _ in 0..PLAN_CALLS {
        for max_ranks in [gpuctl_proto::VIEW_RANKS, 0] {
            let t = Instant::now();
            let plan = jobs
                .plan_job(PlanRequest {
                    spec: Some(spec(cfg.long)),
                    max_ranks,
                })
                .await
                .context("planning a job on every node")?
                .into_inner();
            let ms = t.elapsed().as_secs_f64() * 1e3;
            if max_ranks == 0 {
                out.plan_whole_ms.push(ms);
                out.plan_whole_bytes = plan.encoded_len();
            } else {
                out.plan_view_ms.push(ms);
            }
        }
    }

    eprintln!(
        "a {} stress job on every node…",
        humantime::format_duration(cfg.long)
    );
    let mut phase = Phase::begin("long job", pid, &lat, &watch);
    let job = one_job(&mut jobs, &fleet, spec(cfg.long), &lat, &mut phase, &co).await?;
    out.jobs.push(job);
    out.phases.push(phase.end(&co, &lat));

    if cfg.short_jobs > 0 {
        eprintln!("{} short jobs in a row…", cfg.short_jobs);
        let mut phase = Phase::begin("short jobs", pid, &lat, &watch);
        for i in 0..cfg.short_jobs {
            let job = one_job(&mut jobs, &fleet, spec(cfg.short), &lat, &mut phase, &co).await?;
            eprintln!(
                "  {}/{}: {} {}; resident {:.0} MB, heap {:.0} MB",
                i + 1,
                cfg.short_jobs,
                job.id,
                job.state,
                job.rss_after as f64 / 1e6,
                job.heap_after as f64 / 1e6
            );
            out.jobs.push(job);
        }
        out.phases.push(phase.end(&co, &lat));
    }
    let count = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    out.sessions_lost = count(&fleet.stats.sessions_lost);
    out.rpc_errors = count(&fleet.stats.rpc_errors);
    out.rpc_error_kinds = fleet.stats.rpc_error_kinds();
    out.results_refused = count(&fleet.stats.results_refused);
    stop.cancel();
    // The fleet's tasks see the stop before the coordinator goes.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stored = stored_ms(&co.dir.join("coordinator.log"));
    for j in &mut out.jobs {
        j.stored_ms = stored.get(&j.id).copied().unwrap_or(f64::NAN);
    }
    // What takes the store's space, read once the coordinator let it go.
    let file = co
        .dir
        .join("store")
        .join(gpuctl_coordinator::server::STORE_FILE);
    drop(co);
    match gpuctl_coordinator::store::RedbStore::usage(&file) {
        Ok(u) => out.store_use = u,
        Err(e) => eprintln!("the store's keys could not be read: {e}"),
    }
    Ok(out)
}

/// How long a job may take to have its report: its run time and five minutes.
fn report_limit(job: &gpuctl_proto::pb::Job) -> Duration {
    let run = job.spec.as_ref().map_or(0, |s| s.duration_ms);
    Duration::from_millis(run) + Duration::from_secs(300)
}

/// Submits, waits for the end and for the stored report, and measures.
async fn one_job(
    jobs: &mut JobServiceClient<Channel>,
    fleet: &fleet::Fleet,
    spec: JobSpec,
    lat: &Mutex<Latencies>,
    phase: &mut Phase,
    co: &Coordinator,
) -> Result<JobFigures> {
    let pid = co.pid();
    let submitted = Instant::now();
    let job = jobs
        .submit(SubmitRequest { spec: Some(spec) })
        .await
        .context("submit")?
        .into_inner();
    lat.lock().unwrap().job = job.id.clone();
    let nodes = fleet.names.len() as u64;
    let mut assign_ms = f64::NAN;
    let (state, ended) = loop {
        phase.sample(pid);
        if assign_ms.is_nan() {
            if let Some(t) = fleet.stats.job(&job.id).filter(|t| t.assignments >= nodes) {
                assign_ms = (t.last_assignment - submitted).as_secs_f64() * 1e3;
            }
        }
        let j = match jobs
            .get_job(GetJobRequest {
                job_id: job.id.clone(),
                max_ranks: gpuctl_proto::VIEW_RANKS,
            })
            .await
        {
            Ok(j) => j.into_inner(),
            // A coordinator too busy to answer in time is a figure (the
            // CLI's latencies), not the end of the run; one that never
            // answers ends it at the report's limit.
            Err(e) if submitted.elapsed() < report_limit(&job) => {
                eprintln!("  polling {}: {} ({:?})", job.id, e.message(), e.code());
                continue;
            }
            Err(e) => bail!("polling {}: {} ({:?})", job.id, e.message(), e.code()),
        };
        if j.state().is_terminal() {
            break (j.state(), Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let report: Report = loop {
        match jobs
            .get_report_packed(GetReportRequest {
                job_id: job.id.clone(),
            })
            .await
        {
            Ok(r) => break r.into_inner().unpack()?,
            // Not stored yet; a report that never comes is an error, named.
            Err(e) if submitted.elapsed() > report_limit(&job) => {
                bail!("no report for {} ({}): {}", job.id, e.code(), e.message())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    };
    let reported = Instant::now();
    let times = fleet.stats.job(&job.id);
    let since_last = |at: Instant| {
        times
            .and_then(|t| t.last_result)
            .map_or(f64::NAN, |t| (at - t).as_secs_f64() * 1e3)
    };
    let (ended_ms, report_ms) = (since_last(ended), since_last(reported));
    fleet.stats.forget(&job.id);
    // Let the job's leftovers go before reading memory.
    tokio::time::sleep(Duration::from_secs(1)).await;
    phase.sample(pid);
    let results_in_report = figures::ranks_judged(&report);
    Ok(JobFigures {
        id: job.id,
        state: state.label().into(),
        ranks: report.world_size,
        results_in_report,
        assign_ms,
        ended_ms,
        stored_ms: f64::NAN,
        report_ms,
        rss_after: probe::rss_bytes(pid).unwrap_or(0),
        heap_after: probe::heap_allocated(&co.metrics).await.unwrap_or(0),
        telemetry_bytes: report.telemetry_bytes,
    })
}

/// `PlanJob` calls of each kind: one call alone says little on two shared cores.
const PLAN_CALLS: usize = 5;

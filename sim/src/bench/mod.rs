//! The coordinator's scale bench: a real `gpuctl-coordinator` process (embedded
//! store in a fresh folder) against a simulated fleet, driven through
//! register → idle → one long stress job on every node → short jobs in a row,
//! with `nodes`, `jobs` and `status` calls all along. It measures the
//! coordinator process only (CPU from /proc, resident memory, store size);
//! the simulator runs in this process and its cost is not counted.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gpuctl_core::client::Channel;
use gpuctl_core::pb::{
    job_service_client::JobServiceClient, GetJobRequest, GetReportRequest, JobSpec,
    ListJobsRequest, ListNodesRequest, PlanRequest, Report, SubmitRequest,
};
use gpuctl_core::shutdown::Shutdown;
use prost::Message;

use crate::fleet::{self, FleetConfig, RankConnections};
use crate::probe;

mod print;

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
    /// The coordinator's `RUST_LOG`.
    pub coordinator_log: String,
}

/// What one run measured; `to_json` for machines, `print` for people.
#[derive(Debug, Default)]
pub struct BenchReport {
    pub nodes: usize,
    pub gpus: u32,
    pub rank_connections: RankConnections,
    pub register_ms: f64,
    /// `PlanJob` on every node, each call's ms: as `gpuctl plan` asks for
    /// a person's table (bounded, `VIEW_RANKS`) and whole (`-o json`).
    pub plan_view_ms: Vec<f64>,
    pub plan_whole_ms: Vec<f64>,
    /// The whole plan's encoded size.
    pub plan_whole_bytes: usize,
    pub phases: Vec<PhaseFigures>,
    pub jobs: Vec<JobFigures>,
    pub rss_before_jobs: u64,
    /// The coordinator allocator's live bytes before the first job
    /// (`gpuctl_coordinator_heap_bytes{kind="allocated"}`; 0 if unread).
    pub heap_before_jobs: u64,
    /// What went wrong on the fleet's side: sessions that ended while it
    /// ran (each opened again), rank calls that failed, results refused.
    pub sessions_lost: u64,
    pub rpc_errors: u64,
    pub results_refused: u64,
}

#[derive(Debug, Default, Clone)]
pub struct PhaseFigures {
    pub name: String,
    pub seconds: f64,
    pub cpu_per_s: f64,
    /// The simulator's own CPU (fleet, workers and CLI calls), apart.
    pub sim_cpu_per_s: f64,
    pub rss_max: u64,
    /// Seconds into the phase of the highest reading.
    pub rss_max_at: f64,
    pub rss_end: u64,
    /// Resident memory about each second: seconds into the phase, bytes.
    pub rss_series: Vec<(f64, u64)>,
    pub store_bytes: u64,
    /// The coordinator's major page faults, and the host's file refaults
    /// (see `probe::host_file_refaults`), over the phase.
    pub major_faults: u64,
    pub host_refaults: u64,
    /// Per call (`nodes`, `jobs`, `status`): p50 and p99 in ms, and count.
    pub cli: BTreeMap<String, (f64, f64, usize)>,
    /// The slowest calls: name, seconds into the phase, ms.
    pub slowest: Vec<(String, f64, f64)>,
}

#[derive(Debug, Default, Clone)]
pub struct JobFigures {
    pub id: String,
    pub state: String,
    pub ranks: u32,
    /// Ranks whose result the stored report holds.
    pub results_in_report: u32,
    pub assign_ms: f64,
    /// The last result's acknowledgement → the bench saw the job ended
    /// (judged: its report made and queued to the store).
    pub ended_ms: f64,
    /// The job's end as the coordinator saw it → its report committed to
    /// the store (the coordinator's log).
    pub stored_ms: f64,
    /// The last result's acknowledgement → the report read whole by the
    /// bench (a `GetReport` of every rank's result, decoded).
    pub report_ms: f64,
    pub rss_after: u64,
    /// The coordinator allocator's live bytes then: resident memory that
    /// rises while this stays flat is pages the allocator keeps.
    pub heap_after: u64,
    /// The job's telemetry series as stored (`Report.telemetry_bytes`).
    pub telemetry_bytes: u64,
}

/// The coordinator process; killed when dropped.
struct Coordinator {
    child: Child,
    url: String,
    /// Its `/metrics` address.
    metrics: String,
    dir: PathBuf,
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Coordinator {
    fn start(bin: &PathBuf, log: &str, dir: PathBuf) -> Result<Coordinator> {
        let log_file = std::fs::File::create(dir.join("coordinator.log"))?;
        // A free port, found by binding it: the coordinator prints only its
        // gRPC address.
        let metrics = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free port for the coordinator's /metrics")?
            .to_string();
        let mut child = Command::new(bin)
            .args(["--listen", "127.0.0.1:0", "--node-timeout", "60s"])
            .args(["--metrics-listen", &metrics])
            // The simulated fleet shares this host's one address: with
            // --rank-connections rank, 32,768 connections.
            .args(["--max-connections-per-peer", "10000000"])
            .arg("--data-dir")
            .arg(dir.join("store"))
            .env("RUST_LOG", log)
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut line)
            .context("reading the coordinator's first line")?;
        let Some(url) = line.trim().strip_prefix("listening on ") else {
            bail!(
                "the coordinator printed `{}`, not `listening on URL`",
                line.trim()
            );
        };
        Ok(Coordinator {
            url: url.to_string(),
            metrics,
            child,
            dir,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// CLI latencies, by call, for the phase running now.
#[derive(Default)]
struct Latencies {
    by_call: BTreeMap<String, Vec<f64>>,
    /// Every call of the phase: (when it began, name, ms), for the slowest.
    calls: Vec<(Instant, String, f64)>,
    /// The job `status` asks for.
    job: String,
}

/// The nearest-rank quantile `p` (0..1), 0 for none.
fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    gpuctl_core::stats::quantile_sorted(v, p).unwrap_or(0.0)
}

/// Calls `nodes`, `jobs` and `status` over and over, as people and scripts
/// do during a run, each on the same connection the CLI would open.
async fn cli_load(
    mut c: JobServiceClient<Channel>,
    lat: Arc<Mutex<Latencies>>,
    every: Duration,
    stop: Shutdown,
) {
    loop {
        let t = Instant::now();
        let ok = c
            .list_nodes(ListNodesRequest {
                brief: true,
                ..Default::default()
            })
            .await
            .is_ok();
        record(&lat, "nodes", t, ok);
        let t = Instant::now();
        let ok = c.list_jobs(ListJobsRequest { limit: 50 }).await.is_ok();
        record(&lat, "jobs", t, ok);
        let job = lat.lock().unwrap().job.clone();
        if !job.is_empty() {
            let t = Instant::now();
            let req = GetJobRequest {
                job_id: job,
                max_ranks: gpuctl_core::VIEW_RANKS,
            };
            let ok = c.get_job(req).await.is_ok();
            record(&lat, "status", t, ok);
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// Runs [`cli_load`] on a thread and runtime of its own, as the CLI is a
/// process of its own: on the simulator's runtime, busy with 32,768 ranks
/// at a job's end, its calls waited for the simulator and not only for the
/// coordinator.
fn cli_thread(
    url: String,
    lat: Arc<Mutex<Latencies>>,
    every: Duration,
    stop: Shutdown,
) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("a runtime for the CLI calls")?;
    std::thread::Builder::new()
        .name("cli-calls".into())
        .spawn(move || {
            rt.block_on(async move {
                let builder =
                    gpuctl_core::client::builder(&url).request_timeout(Duration::from_secs(60));
                match builder.connect().await {
                    Ok(ch) => {
                        let c = JobServiceClient::new(ch).max_decoding_message_size(256 << 20);
                        cli_load(c, lat, every, stop).await;
                    }
                    Err(e) => eprintln!("the CLI calls could not connect: {e}"),
                }
            })
        })
        .context("starting the CLI calls' thread")?;
    Ok(())
}

fn record(lat: &Mutex<Latencies>, call: &str, t: Instant, ok: bool) {
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let key = if ok {
        call.to_string()
    } else {
        format!("{call} (error)")
    };
    let mut l = lat.lock().unwrap();
    l.calls.push((t, key.clone(), ms));
    l.by_call.entry(key).or_default().push(ms);
}

/// Samples the coordinator's CPU and memory through one phase.
struct Phase {
    name: String,
    start: Instant,
    cpu0: f64,
    sim_cpu0: f64,
    majflt0: u64,
    refaults0: u64,
    rss_max: u64,
    rss_max_at: f64,
    series: Vec<(f64, u64)>,
    watch: Arc<probe::Watch>,
}

impl Phase {
    fn begin(name: &str, pid: u32, lat: &Mutex<Latencies>, watch: &Arc<probe::Watch>) -> Phase {
        // What the watch saw before the phase belongs to the one before.
        watch.take();
        {
            let mut l = lat.lock().unwrap();
            l.by_call.clear();
            l.calls.clear();
        }
        Phase {
            name: name.into(),
            start: Instant::now(),
            cpu0: probe::cpu_seconds(pid).unwrap_or(0.0),
            sim_cpu0: probe::cpu_seconds(std::process::id()).unwrap_or(0.0),
            majflt0: probe::major_faults(pid).unwrap_or(0),
            refaults0: probe::host_file_refaults().unwrap_or(0),
            rss_max: probe::rss_bytes(pid).unwrap_or(0),
            rss_max_at: 0.0,
            series: Vec::new(),
            watch: watch.clone(),
        }
    }

    fn sample(&mut self, pid: u32) {
        let rss = probe::rss_bytes(pid).unwrap_or(0);
        let at = self.start.elapsed().as_secs_f64();
        if rss > self.rss_max {
            (self.rss_max, self.rss_max_at) = (rss, at);
        }
        if let Some((peak, when)) = self.watch.take() {
            if peak > self.rss_max {
                let at = when.saturating_duration_since(self.start).as_secs_f64();
                (self.rss_max, self.rss_max_at) = (peak, at);
            }
        }
        if self.series.last().is_none_or(|(t, _)| at - t >= 1.0) {
            self.series.push((at, rss));
        }
    }

    fn end(mut self, co: &Coordinator, lat: &Mutex<Latencies>) -> PhaseFigures {
        self.sample(co.pid());
        let secs = self.start.elapsed().as_secs_f64();
        let cpu = probe::cpu_seconds(co.pid()).unwrap_or(0.0) - self.cpu0;
        let sim_cpu = probe::cpu_seconds(std::process::id()).unwrap_or(0.0) - self.sim_cpu0;
        let mut l = lat.lock().unwrap();
        let cli = l
            .by_call
            .iter_mut()
            .map(|(k, v)| {
                let n = v.len();
                let med = gpuctl_core::stats::median(v.clone()).unwrap_or(0.0);
                (k.clone(), (med, percentile(v, 0.99), n))
            })
            .collect();
        let mut calls = std::mem::take(&mut l.calls);
        calls.sort_by(|a, b| b.2.total_cmp(&a.2));
        let slowest = calls
            .iter()
            .take(5)
            .map(|(t, name, ms)| {
                let at = t.saturating_duration_since(self.start).as_secs_f64();
                (name.clone(), at, *ms)
            })
            .collect();
        PhaseFigures {
            slowest,
            name: self.name,
            seconds: secs,
            cpu_per_s: cpu / secs.max(1e-9),
            sim_cpu_per_s: sim_cpu / secs.max(1e-9),
            rss_max: self.rss_max,
            rss_max_at: self.rss_max_at,
            rss_series: std::mem::take(&mut self.series),
            rss_end: probe::rss_bytes(co.pid()).unwrap_or(0),
            store_bytes: probe::dir_bytes(&co.dir.join("store")),
            major_faults: probe::major_faults(co.pid())
                .unwrap_or(0)
                .saturating_sub(self.majflt0),
            host_refaults: probe::host_file_refaults()
                .unwrap_or(0)
                .saturating_sub(self.refaults0),
            cli,
        }
    }
}

/// Sleeps `d`, sampling memory each half second.
async fn hold(phase: &mut Phase, pid: u32, d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until {
        phase.sample(pid);
        tokio::time::sleep(Duration::from_millis(500).min(until - Instant::now())).await;
    }
}

pub async fn run(cfg: &BenchConfig, dir: PathBuf) -> Result<BenchReport> {
    let co = Coordinator::start(&cfg.coordinator_bin, &cfg.coordinator_log, dir)?;
    let pid = co.pid();
    let watch = probe::Watch::start(pid);
    let stop = Shutdown::new();
    let _guard = stop.clone().drop_guard();
    let builder = gpuctl_core::client::builder(&co.url).request_timeout(Duration::from_secs(60));
    let mut jobs =
        JobServiceClient::new(builder.connect().await?).max_decoding_message_size(256 << 20);
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
            url: co.url.clone(),
            nodes: cfg.nodes,
            gpus: cfg.gpus,
            prefix: "sim-".into(),
            heartbeat: Duration::from_secs(1),
            interval: cfg.interval,
            connections: cfg.connections,
            rank_connections: cfg.rank_connections,
        },
        stop.clone(),
    )
    .await?;
    out.register_ms = t.elapsed().as_secs_f64() * 1e3;
    out.phases.push(phase.end(&co, &lat));

    cli_thread(co.url.clone(), lat.clone(), cfg.cli_every, stop.clone())?;

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
        for max_ranks in [gpuctl_core::VIEW_RANKS, 0] {
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
    out.results_refused = count(&fleet.stats.results_refused);
    stop.cancel();
    // The fleet's tasks see the stop before the coordinator goes.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stored = stored_ms(&co.dir.join("coordinator.log"));
    for j in &mut out.jobs {
        j.stored_ms = stored.get(&j.id).copied().unwrap_or(f64::NAN);
    }
    Ok(out)
}

/// Each job's "report stored" line in the coordinator's log: ms from the
/// job's end as the coordinator saw it to its report committed.
fn stored_ms(log: &std::path::Path) -> BTreeMap<String, f64> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter(|l| l.contains("report stored"))
        .filter_map(|l| {
            let field = |name: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(name))
                    .map(str::to_string)
            };
            Some((field("job=")?, field("ms=")?.parse().ok()?))
        })
        .collect()
}

/// How long a job may take to have its report: its run time and five minutes.
fn report_limit(job: &gpuctl_core::pb::Job) -> Duration {
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
        let j = jobs
            .get_job(GetJobRequest {
                job_id: job.id.clone(),
                max_ranks: gpuctl_core::VIEW_RANKS,
            })
            .await?
            .into_inner();
        if j.state().is_terminal() {
            break (j.state(), Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let report: Report = loop {
        match jobs
            .get_report(GetReportRequest {
                job_id: job.id.clone(),
            })
            .await
        {
            Ok(r) => break r.into_inner(),
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
    let results_in_report = report
        .nodes
        .iter()
        .flat_map(|n| &n.ranks)
        .filter(|r| r.result.is_some())
        .count() as u32;
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

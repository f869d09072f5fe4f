//! The failover bench (`gpuctl-sim failover`): a leader and a standby
//! `gpuctl-coordinator` on one real etcd, a simulated fleet given both URLs
//! (as `gpuctl-agent --coordinator A,B`), a stress job on every node, and the
//! leader killed with SIGKILL while the job runs. It measures, from the kill:
//! when the standby serves, when every node has registered with it again, how
//! many registrations it took in its busiest second (the reconnect storm,
//! which the agents' jittered backoff bounds), and whether the job ends with
//! every rank's result in its report.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gpuctl_core::client::Channel;
use gpuctl_core::shutdown::Shutdown;
use gpuctl_proto::pb::{
    job_service_client::JobServiceClient, GetJobRequest, GetReportRequest, JobSpec,
    ListNodesRequest, NodeState, SubmitRequest,
};

use crate::fleet::{self, FleetConfig};
use crate::probe;
use crate::shards::{self, Shards};

#[derive(Debug, Clone)]
pub struct FailoverConfig {
    pub coordinator_bin: PathBuf,
    pub nodes: usize,
    pub gpus: u32,
    pub interval: Duration,
    pub connections: usize,
    /// The stress job's length.
    pub job: Duration,
    /// How long after every node took its assignment the leader is killed.
    pub kill_after: Duration,
    /// Processes the fleet is split over ([`crate::shards`]); 1: this one.
    pub fleet_processes: usize,
    /// The `gpuctl-sim` binary that runs the other processes' share.
    pub sim_bin: PathBuf,
    /// The CPU priority of the fleet's other processes (this one's threads
    /// have theirs already).
    pub fleet_nice: i32,
}

/// What the failover measured; times in ms from the SIGKILL.
#[derive(Debug, Default)]
pub struct FailoverReport {
    pub nodes: usize,
    pub gpus: u32,
    pub standby_serves_ms: f64,
    /// Every node registered with the new leader (the simulator's count).
    pub all_registered_ms: f64,
    /// Every node listed by the new leader with a session (ready or busy).
    pub all_listed_ms: f64,
    /// Registrations the new leader took in its busiest second, and the mean
    /// over the seconds from the first to the last.
    pub registrations_peak_per_s: u64,
    pub registrations_mean_per_s: f64,
    /// Registrations with the new leader in each second from the kill.
    pub registrations_per_s: Vec<u64>,
    /// The simulated agents' tries that failed for want of a descriptor in
    /// the simulator (its limit, not the coordinator's doing).
    pub descriptors_short: u64,
    pub job: String,
    pub job_state: String,
    /// Why it ended so, as the coordinator says (a failure's reason).
    pub job_message: String,
    pub ranks: u32,
    pub results_in_report: u32,
    pub results_refused: u64,
    pub rank_calls_failed: u64,
    pub job_end_ms: f64,
    pub new_leader_rss_peak: u64,
    /// Processes the simulated fleet ran in.
    pub fleet_processes: usize,
}

/// A process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// etcd on loopback ports of its own, its data in `dir`; waits until it
/// takes connections.
fn start_etcd(dir: &Path) -> Result<(Proc, String)> {
    let (client, peer) = (free_port()?, free_port()?);
    let url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let log = std::fs::File::create(dir.join("etcd.log"))?;
    let child = Command::new("etcd")
        .args(["--name", "gpuctl-sim", "--data-dir"])
        .arg(dir.join("etcd"))
        .args([
            "--listen-client-urls",
            &url,
            "--advertise-client-urls",
            &url,
        ])
        .args(["--listen-peer-urls", &peer_url])
        .args(["--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("gpuctl-sim={peer_url}")])
        // As docs/operations.md advises for a big fleet: a quota of 8 GiB
        // and old revisions compacted. At 16,384 × 8 the default 2 GiB ran
        // out mid-job ("mvcc: database space exceeded"), every write then
        // refused, as each flush of a 131,072-GPU job's telemetry leaves
        // its earlier revisions behind.
        .args(["--quota-backend-bytes", &(8u64 << 30).to_string()])
        .args(["--auto-compaction-mode", "periodic"])
        .args(["--auto-compaction-retention", "1m"])
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting etcd (Debian: apt-get install etcd-server)")?;
    let etcd = Proc(child);
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", client)).is_err() {
        if started.elapsed() > Duration::from_secs(30) {
            bail!(
                "etcd did not listen on {url} in 30 s; see {}",
                dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok((etcd, url))
}

/// A coordinator on `port` with etcd as its store; the receiver hears its
/// `listening on` line, which it prints once it leads.
fn start_coordinator(
    bin: &Path,
    etcd: &str,
    port: u16,
    dir: &Path,
    name: &str,
) -> Result<(Proc, Receiver<String>)> {
    let mut child = Command::new(bin)
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--node-timeout",
            "60s",
        ])
        .args([
            "--store",
            "etcd",
            "--etcd",
            etcd,
            "--etcd-prefix",
            "/gpuctl-sim/",
        ])
        .args([
            "--metrics-listen",
            "off",
            "--max-connections-per-peer",
            "10000000",
        ])
        .arg("--data-dir")
        .arg(dir.join(name))
        .env(
            "RUST_LOG",
            "info,gpuctl_coordinator::scheduler::agents=warn",
        )
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join(format!("{name}.log")))?)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let out = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(u) = line.strip_prefix("listening on ") {
                let _ = tx.send(u.trim().to_string());
            }
        }
    });
    Ok((Proc(child), rx))
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

pub async fn run(cfg: &FailoverConfig, dir: PathBuf) -> Result<FailoverReport> {
    let (_etcd, etcd_url) = start_etcd(&dir)?;
    let (port_a, port_b) = (free_port()?, free_port()?);
    let (mut leader, said_a) =
        start_coordinator(&cfg.coordinator_bin, &etcd_url, port_a, &dir, "a")?;
    let url_a = said_a
        .recv_timeout(Duration::from_secs(60))
        .context("coordinator a did not lead within 60 s")?;
    let (standby, said_b) = start_coordinator(&cfg.coordinator_bin, &etcd_url, port_b, &dir, "b")?;
    let url_b = format!("http://127.0.0.1:{port_b}");
    let stop = Shutdown::new();
    let _guard = stop.clone().drop_guard();
    eprintln!(
        "registering {} simulated nodes × {} GPUs with {url_a} (standby {url_b})…",
        cfg.nodes, cfg.gpus
    );
    let whole = FleetConfig {
        own_addresses: true,
        ..FleetConfig::new(
            format!("{url_a},{url_b}"),
            cfg.nodes,
            cfg.gpus,
            cfg.interval,
            cfg.connections,
        )
    };
    let mut shards = Shards::start(
        &cfg.sim_bin,
        &whole,
        cfg.fleet_processes,
        cfg.fleet_nice,
        &dir,
    )?;
    let own = shards::slices(cfg.nodes, cfg.fleet_processes)[0].1;
    let fleet = fleet::start(
        FleetConfig {
            nodes: own,
            connections: cfg.connections.min(own),
            ..whole
        },
        stop.clone(),
    )
    .await?;
    shards.registered(Duration::from_secs(600), &dir).await?;
    let counts = || shards.counts(&fleet.stats);
    let client = |url: &str| {
        gpuctl_core::client::builder(url)
            .request_timeout(Duration::from_secs(60))
            .connect_lazy()
    };
    let mut jobs_a = JobServiceClient::new(client(&url_a)?);
    let job = jobs_a
        .submit(SubmitRequest {
            spec: Some(JobSpec {
                workload: "stress".into(),
                all_nodes: true,
                duration_ms: cfg.job.as_millis() as u64,
                ..Default::default()
            }),
        })
        .await
        .context("submitting the job")?
        .into_inner();
    let nodes = cfg.nodes as u64;
    while counts().assigned(&job.id) < nodes {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(cfg.kill_after).await;
    let before = counts().registered;
    eprintln!(
        "{} running on every node; killing the leader (SIGKILL)…",
        job.id
    );
    let killed = Instant::now();
    leader.0.kill().context("killing the leader")?;
    let _ = leader.0.wait();
    let mut out = FailoverReport {
        nodes: cfg.nodes,
        gpus: cfg.gpus,
        job: job.id.clone(),
        standby_serves_ms: f64::NAN,
        all_registered_ms: f64::NAN,
        all_listed_ms: f64::NAN,
        job_end_ms: f64::NAN,
        ..Default::default()
    };
    let watch = probe::Watch::start(standby.0.id());
    // Registrations per second with the new leader, from the fleet's count;
    // read every 100 ms so that the standby's first line is timed closely.
    let mut per_s: Vec<u64> = Vec::new();
    let mut last = before;
    let limit = Duration::from_secs(300);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    for i in 1u64.. {
        tick.tick().await;
        if out.standby_serves_ms.is_nan() && said_b.try_recv().is_ok() {
            out.standby_serves_ms = ms_since(killed);
            eprintln!(
                "  the standby serves after {:.1} s",
                out.standby_serves_ms / 1e3
            );
        }
        let now = counts().registered;
        if now - before >= nodes {
            out.all_registered_ms = ms_since(killed);
            per_s.push(now - last);
            break;
        }
        if i % 10 == 0 {
            per_s.push(now - last);
            last = now;
        }
        if killed.elapsed() > limit {
            bail!(
                "{} of {} nodes registered again within {limit:?} of the kill",
                now - before,
                cfg.nodes
            );
        }
    }
    let busy: Vec<u64> = per_s.iter().copied().skip_while(|&n| n == 0).collect();
    out.registrations_peak_per_s = busy.iter().copied().max().unwrap_or(0);
    out.registrations_mean_per_s = busy.iter().sum::<u64>() as f64 / busy.len().max(1) as f64;
    out.registrations_per_s = per_s;
    let channel_b = client(&url_b)?;
    while killed.elapsed() < limit {
        if listed_with_session(&channel_b).await.unwrap_or(0) >= cfg.nodes {
            out.all_listed_ms = ms_since(killed);
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "  every node back after {:.1} s; waiting for {}…",
        out.all_listed_ms / 1e3,
        job.id
    );
    let mut jobs_b = JobServiceClient::new(channel_b).max_decoding_message_size(256 << 20);
    let deadline = cfg.job + limit;
    let state = loop {
        if killed.elapsed() > deadline {
            bail!("{} did not end within {deadline:?} of the kill", job.id);
        }
        let req = GetJobRequest {
            job_id: job.id.clone(),
            max_ranks: gpuctl_proto::VIEW_RANKS,
        };
        if let Ok(j) = jobs_b.get_job(req).await {
            if j.get_ref().state().is_terminal() {
                let j = j.into_inner();
                out.job_message = j.message.clone();
                break j.state();
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    out.job_end_ms = ms_since(killed);
    out.job_state = state.label().into();
    let report = loop {
        let req = GetReportRequest {
            job_id: job.id.clone(),
        };
        match jobs_b.get_report_packed(req).await {
            Ok(r) => break r.into_inner().unpack()?,
            Err(e) if killed.elapsed() > deadline => {
                bail!("no report for {}: {}", job.id, e.message())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    out.ranks = report.world_size;
    out.results_in_report = super::figures::ranks_judged(&report);
    let end = counts();
    out.results_refused = end.results_refused;
    out.rank_calls_failed = end.rpc_errors;
    out.descriptors_short = end.descriptors_short;
    out.fleet_processes = cfg.fleet_processes;
    out.new_leader_rss_peak = watch.take().map_or(0, |(b, _)| b);
    stop.cancel();
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(standby);
    Ok(out)
}

/// Nodes the coordinator behind `channel` lists with a session, page by page.
async fn listed_with_session(channel: &Channel) -> Result<usize> {
    let mut nodes = JobServiceClient::new(channel.clone()).max_decoding_message_size(64 << 20);
    let (mut after, mut n) = (String::new(), 0);
    loop {
        let page = nodes
            .list_nodes(ListNodesRequest {
                brief: true,
                page_bytes: 8 << 20,
                after,
            })
            .await?
            .into_inner();
        let table = page.table.unwrap_or_default();
        n += table
            .state()
            .filter(|s| matches!(s, NodeState::Ready | NodeState::Busy))
            .count();
        if page.next_after.is_empty() {
            return Ok(n);
        }
        after = page.next_after;
    }
}

impl FailoverReport {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "nodes": self.nodes, "gpus": self.gpus, "job": self.job,
            "standby_serves_ms": self.standby_serves_ms,
            "all_registered_ms": self.all_registered_ms,
            "all_listed_ms": self.all_listed_ms,
            "registrations_peak_per_s": self.registrations_peak_per_s,
            "registrations_mean_per_s": self.registrations_mean_per_s,
            "registrations_per_s": self.registrations_per_s,
            "descriptors_short": self.descriptors_short,
            "job_state": self.job_state, "job_message": self.job_message, "job_end_ms": self.job_end_ms,
            "ranks": self.ranks, "results_in_report": self.results_in_report,
            "results_refused": self.results_refused,
            "rank_calls_failed": self.rank_calls_failed,
            "new_leader_rss_peak": self.new_leader_rss_peak,
            "fleet_processes": self.fleet_processes,
        })
    }
}

pub fn print(r: &FailoverReport) {
    println!(
        "failover: {} nodes × {} GPUs in {} simulator process(es), {} killed mid-run (SIGKILL) on etcd",
        r.nodes, r.gpus, r.fleet_processes, r.job
    );
    println!(
        "  the standby serves           {:>9.1} s after the kill",
        r.standby_serves_ms / 1e3
    );
    println!(
        "  every node registered again  {:>9.1} s",
        r.all_registered_ms / 1e3
    );
    println!(
        "  every node listed, in session {:>8.1} s",
        r.all_listed_ms / 1e3
    );
    println!(
        "  registrations a second       {:>9} at most, {:.0} on average",
        r.registrations_peak_per_s, r.registrations_mean_per_s
    );
    println!(
        "  the job                      {} at {:.1} s; {} of {} results in its report; {} refused; {} rank calls failed or held while their agent was away (retried)",
        r.job_state,
        r.job_end_ms / 1e3,
        r.results_in_report,
        r.ranks,
        r.results_refused,
        r.rank_calls_failed
    );
    if !r.job_message.is_empty() {
        println!("  the job's message            {}", r.job_message);
    }
    println!("  registrations each second    {:?}", r.registrations_per_s);
    if r.descriptors_short > 0 {
        println!(
            "  the simulator ran out of descriptors on {} tries (open-files limit {}): those waits are its own, not the coordinator's",
            r.descriptors_short,
            gpuctl_core::server::open_files_limit().0
        );
    }
    println!(
        "  the new leader's resident peak {:.0} MB",
        r.new_leader_rss_peak as f64 / 1e6
    );
}

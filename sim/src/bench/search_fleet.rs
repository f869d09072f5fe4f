//! `gpuctl-sim search-fleet`: the search for slow nodes and links through the
//! real coordinator. A `gpuctl-coordinator` process (embedded store, a
//! folder of its own) plans and judges one `nccl --pattern search` job on
//! every node of a simulated fleet whose search ranks
//! ([`crate::search_ranks`]) measure a model with the culprits placed; the
//! run then reads the stored report and scores its findings against those
//! culprits: found, missed, and blamed where nothing was wrong.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gpuctl_core::shutdown::Shutdown;
use gpuctl_proto::pb::{GetJobRequest, GetReportRequest, JobSpec, Report, SubmitRequest, Verdict};

use super::coordinator::Coordinator;
use crate::culprits::Culprits;
use crate::fleet::{self, FleetConfig};
use crate::probe;
use crate::search_ranks::SearchPlay;

#[derive(Debug, Clone)]
pub struct SearchFleetConfig {
    pub coordinator_bin: PathBuf,
    pub nodes: usize,
    pub gpus: u32,
    pub interval: Duration,
    pub connections: usize,
    pub culprits: Culprits,
    /// The job on these nodes only (empty: every node): their node ranks
    /// are then not their fleet's, as in a job on part of a real fleet.
    pub only_nodes: Vec<String>,
    /// The measurements' noise seed.
    pub seed: u64,
    /// Wall time a round is played in here.
    pub round: Duration,
    /// What a round is modelled to take on a real fleet (communicators
    /// and one all_reduce), for the modelled duration.
    pub round_model: Duration,
    /// The coordinator's `RUST_LOG`.
    pub coordinator_log: String,
}

/// How the report did against the culprits placed.
#[derive(Debug, Default, Clone)]
pub struct SearchFleetReport {
    pub nodes: usize,
    pub gpus: u32,
    /// Each culprit as `node NAME at SPEED` or `link A:B at SPEED`.
    pub placed: String,
    pub culprits: usize,
    pub job: String,
    pub state: String,
    pub verdict: String,
    pub rounds: usize,
    pub tests: usize,
    /// Culprits the report names, as `NAME` or `A:B`.
    pub found: Vec<String>,
    pub missed: Vec<String>,
    /// Culprits placed on nodes the job did not run on: not its to find.
    pub outside: Vec<String>,
    /// Nodes failed and search findings where nothing was placed.
    pub false_blames: Vec<String>,
    /// Failing findings that are not the search's (anything else the
    /// coordinator judged failed).
    pub other_fails: Vec<String>,
    /// The report's notes on the search (its count, the cleared, the
    /// undecided), and on what was cut to send it.
    pub search_notes: Vec<String>,
    pub ranks: u32,
    /// Ranks the report judged on a result (a report too big for one
    /// message leaves the results of passing ranks out, not their verdicts).
    pub ranks_judged: u32,
    pub register_s: f64,
    /// From submit to the stored report, played here.
    pub job_s: f64,
    /// The rounds at the modelled time of a round.
    pub modelled_s: f64,
    pub coordinator_rss_peak: u64,
    pub simulator_rss_peak: u64,
    pub results_refused: u64,
    pub rpc_errors: u64,
}

pub async fn run(cfg: &SearchFleetConfig, dir: PathBuf) -> Result<SearchFleetReport> {
    let co = Coordinator::start(&cfg.coordinator_bin, &cfg.coordinator_log, dir)?;
    let pid = co.pid();
    let stop = Shutdown::new();
    let _guard = stop.clone().drop_guard();
    let mut jobs = co.jobs(Duration::from_secs(120)).await?;
    let mut out = SearchFleetReport {
        nodes: cfg.nodes,
        gpus: cfg.gpus,
        placed: cfg.culprits.describe(),
        culprits: cfg.culprits.len(),
        ..Default::default()
    };
    eprintln!(
        "registering {} simulated nodes × {} GPUs; culprits: {}",
        cfg.nodes, cfg.gpus, out.placed
    );
    let t = Instant::now();
    let play = Arc::new(SearchPlay::new(cfg.culprits.clone(), cfg.seed, cfg.round));
    let fleet = fleet::start_with(
        FleetConfig::new(
            co.url.clone(),
            cfg.nodes,
            cfg.gpus,
            cfg.interval,
            cfg.connections,
        ),
        play,
        stop.clone(),
    )
    .await?;
    out.register_s = t.elapsed().as_secs_f64();

    let spec = JobSpec {
        workload: "nccl".into(),
        all_nodes: cfg.only_nodes.is_empty(),
        node_count: cfg.only_nodes.len() as u32,
        only_nodes: cfg.only_nodes.clone(),
        params: [("pattern".to_string(), "search".to_string())].into(),
        ..Default::default()
    };
    eprintln!(
        "nccl --pattern search on {}…",
        if cfg.only_nodes.is_empty() {
            "every node".to_string()
        } else {
            format!("{} nodes", cfg.only_nodes.len())
        }
    );
    let t = Instant::now();
    let job = jobs
        .submit(SubmitRequest { spec: Some(spec) })
        .await
        .context("submitting nccl --pattern search")?
        .into_inner();
    out.job = job.id.clone();
    let mut rss = Peaks::default();
    let limit = Duration::from_secs(1800);
    let state = loop {
        rss.sample(pid);
        match jobs
            .get_job(GetJobRequest {
                job_id: job.id.clone(),
                max_ranks: gpuctl_proto::VIEW_RANKS,
            })
            .await
        {
            Ok(j) if j.get_ref().state().is_terminal() => break j.into_inner().state(),
            Ok(_) => {}
            // A coordinator busy judging answers late: not the end of the run.
            Err(e) => eprintln!("  polling {}: {}", job.id, e.message()),
        }
        if t.elapsed() > limit {
            bail!("{} did not end within {}s", job.id, limit.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let report: Report = loop {
        rss.sample(pid);
        match jobs
            .get_report_packed(GetReportRequest {
                job_id: job.id.clone(),
            })
            .await
        {
            Ok(r) => break r.into_inner().unpack()?,
            Err(e) if t.elapsed() > limit => {
                bail!("no report for {} ({}): {}", job.id, e.code(), e.message())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    out.job_s = t.elapsed().as_secs_f64();
    out.state = state.label().into();
    let count = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    out.results_refused = count(&fleet.stats.results_refused);
    out.rpc_errors = count(&fleet.stats.rpc_errors);
    stop.cancel();
    score(&report, &cfg.culprits, &mut out);
    out.modelled_s = out.rounds as f64 * cfg.round_model.as_secs_f64();
    out.coordinator_rss_peak = rss.coordinator;
    out.simulator_rss_peak = rss.simulator;
    // The fleet's tasks see the stop before the coordinator goes.
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(co);
    Ok(out)
}

/// Resident memory peaks, sampled while the job runs.
#[derive(Default)]
struct Peaks {
    coordinator: u64,
    simulator: u64,
}

impl Peaks {
    fn sample(&mut self, pid: u32) {
        let me = std::process::id();
        self.coordinator = self.coordinator.max(probe::rss_bytes(pid).unwrap_or(0));
        self.simulator = self.simulator.max(probe::rss_bytes(me).unwrap_or(0));
    }
}

/// The report's search findings and failed nodes against the culprits.
pub fn score(report: &Report, culprits: &Culprits, out: &mut SearchFleetReport) {
    out.verdict = report.verdict().label().into();
    out.rounds = report.bisect.len();
    out.tests = report.bisect.iter().map(|r| r.groups.len()).sum();
    out.ranks = report.world_size;
    out.ranks_judged = super::figures::ranks_judged(report);
    // The judge names a link `link A-B`, its nodes in the plan's order,
    // which is by name.
    let link_key = |a: &str, b: &str| format!("link {a}-{b}");
    let mut named = std::collections::BTreeSet::new();
    for f in report
        .findings
        .iter()
        .filter(|f| f.level() == Verdict::Fail)
    {
        if f.metric != "search" {
            out.other_fails
                .push(format!("{} {} {}: {}", f.node, f.metric, f.key, f.detail));
        } else if !f.node.is_empty() {
            if culprits.nodes.contains_key(&f.node) {
                named.insert(f.node.clone());
            } else {
                out.false_blames.push(f.node.clone());
            }
        } else {
            match culprits.links.keys().find(|(a, b)| link_key(a, b) == f.key) {
                Some((a, b)) => {
                    named.insert(format!("{a}:{b}"));
                }
                None => out.false_blames.push(f.key.clone()),
            }
        }
    }
    for n in &report.nodes {
        if n.verdict() == Verdict::Fail
            && !culprits.nodes.contains_key(&n.name)
            && !out.false_blames.contains(&n.name)
        {
            out.false_blames.push(n.name.clone());
        }
    }
    let in_job: std::collections::BTreeSet<&str> =
        report.nodes.iter().map(|n| n.name.as_str()).collect();
    let all = culprits
        .nodes
        .keys()
        .map(|n| (n.clone(), in_job.contains(n.as_str())))
        .chain(culprits.links.keys().map(|(a, b)| {
            (
                format!("{a}:{b}"),
                in_job.contains(a.as_str()) && in_job.contains(b.as_str()),
            )
        }));
    for (c, inside) in all {
        if named.contains(&c) {
            out.found.push(c);
        } else if inside {
            out.missed.push(c);
        } else {
            out.outside.push(c);
        }
    }
    out.search_notes = report
        .notes
        .iter()
        .filter(|n| n.starts_with("search") || n.starts_with("the report of"))
        .cloned()
        .collect();
}

impl SearchFleetReport {
    /// The table's header and this run's row.
    pub fn row(&self) -> String {
        format!(
            "{:>6} {:>5} {:>3} {:>7} {:>6} {:>7} {:>6} {:>6} {:>6} {:>9} {:>9} {:>8} {:>9}\n{:>6} {:>5} {:>3} {:>7} {:>6} {:>7} {:>6} {:>6} {:>6} {:>8.0}s {:>8.0}s {:>6.2}GB {:>7.2}GB",
            "N", "GPUs", "k", "verdict", "rounds", "tests", "found", "missed", "false",
            "modelled", "played", "coord", "sim",
            self.nodes,
            self.gpus,
            self.culprits,
            self.verdict,
            self.rounds,
            self.tests,
            self.found.len(),
            self.missed.len(),
            self.false_blames.len(),
            self.modelled_s,
            self.job_s,
            self.coordinator_rss_peak as f64 / 1e9,
            self.simulator_rss_peak as f64 / 1e9,
        )
    }

    pub fn print(&self) {
        println!("culprits placed: {}", self.placed);
        println!("{}", self.row());
        for (what, v) in [
            ("missed", &self.missed),
            ("placed outside the job", &self.outside),
            ("blamed where nothing was placed", &self.false_blames),
            ("other failing findings", &self.other_fails),
        ] {
            if !v.is_empty() {
                println!("{what}: {}", v.join("; "));
            }
        }
        for n in &self.search_notes {
            println!("note: {n}");
        }
        println!(
            "job {} {}; {} of {} ranks judged on a result; registered in {:.1}s",
            self.job, self.state, self.ranks_judged, self.ranks, self.register_s
        );
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "nodes": self.nodes,
            "gpus": self.gpus,
            "culprits": self.culprits,
            "placed": self.placed,
            "job": self.job,
            "state": self.state,
            "verdict": self.verdict,
            "rounds": self.rounds,
            "tests": self.tests,
            "found": self.found,
            "missed": self.missed,
            "outside": self.outside,
            "false_blames": self.false_blames,
            "other_fails": self.other_fails,
            "search_notes": self.search_notes,
            "ranks": self.ranks,
            "ranks_judged": self.ranks_judged,
            "register_s": self.register_s,
            "job_s": self.job_s,
            "modelled_s": self.modelled_s,
            "coordinator_rss_peak_bytes": self.coordinator_rss_peak,
            "simulator_rss_peak_bytes": self.simulator_rss_peak,
            "results_refused": self.results_refused,
            "rpc_errors": self.rpc_errors,
        })
    }
}

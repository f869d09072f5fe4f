//! A fake `nccl --pattern search` worker: what one rank of `gpuctl-worker`
//! sends for the search for slow nodes and links, without NCCL. The search
//! is the real one ([`gpuctl_core::search::Search`], as the worker's
//! `workloads/nccl/search.rs` runs it: slow ratio from the job's params, the
//! NVLink/InfiniBand spread of ±5 %), measured against the model
//! ([`gpuctl_core::search::model::Model`]) with the culprits the simulator
//! was told ([`crate::culprits`]). It runs once per job in this process,
//! not once per rank (131,072 ranks share it): every rank of a real job
//! reads the same figures from the rendezvous and decides the same.
//!
//! What is not played: the rendezvous (round barriers, each group's figure
//! put by its rank 0) and the communicators. A round's wall time is
//! `SearchPlay::round` here, whatever a real one takes (about 30 s at
//! fleet scale: communicators and one all_reduce); the run reports the
//! modelled time beside the played one. Each rank reports for itself only:
//! its progress (the round, its own group's busbw) and its result, with
//! the rounds and the verdict every rank of a real job carries.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuctl_core::catalogue::{NcclPattern, TypedParams};
use gpuctl_core::search::model::Model;
use gpuctl_core::search::Search;
use gpuctl_proto::pb::{
    rank_result::Detail, CollectiveResult, JobSpec, PhaseKind, PhaseMark, RankProgress,
    RankProgressReport, RankResult,
};
use tokio::sync::{watch, OnceCell};

use crate::counters::Stats;
use crate::culprits::Culprits;
use crate::ranks::{deliver, request, Clients, Outcome, RankJob};

/// A healthy group's all_reduce busbw (GB/s) between H200 nodes of eight
/// 400 Gb/s InfiniBand rails, give or take: the model's 1.0.
pub const HEALTHY_GBPS: f64 = 360.0;
/// The spread of one measurement the worker assumes over NVLink or
/// InfiniBand (`workloads/nccl/search.rs`), and the model's noise.
pub const SPREAD: f64 = 0.05;
/// Jobs whose search this process keeps: a bound, a job's rounds being
/// asked for only while it runs.
const KEPT_JOBS: usize = 16;
/// How long a rank waits for the job's other nodes to reach this process:
/// the search needs every node's name, and a job some of whose nodes are
/// simulated elsewhere cannot be played here.
const GATHER: Duration = Duration::from_secs(120);

/// Whether `spec` asks for the search.
pub fn wanted(spec: Option<&JobSpec>) -> bool {
    spec.is_some_and(|s| {
        s.workload == "nccl" && s.params.get("pattern").map(String::as_str) == Some("search")
    })
}

/// What the fleet's search ranks share: the culprits, and each job's search.
#[derive(Debug)]
pub struct SearchPlay {
    pub culprits: Culprits,
    /// The measurements' noise is drawn from it: the same fleet and seed
    /// measure the same.
    pub seed: u64,
    /// Wall time a round is played in.
    pub round: Duration,
    jobs: Mutex<VecDeque<(String, Arc<JobSearch>)>>,
}

impl Default for SearchPlay {
    fn default() -> Self {
        SearchPlay::new(Culprits::default(), 0, Duration::from_secs(1))
    }
}

impl SearchPlay {
    pub fn new(culprits: Culprits, seed: u64, round: Duration) -> SearchPlay {
        SearchPlay {
            culprits,
            seed,
            round,
            jobs: Mutex::default(),
        }
    }

    fn job(&self, id: &str, nnodes: usize) -> Arc<JobSearch> {
        let mut jobs = self.jobs.lock().unwrap();
        if let Some((_, j)) = jobs.iter().find(|(k, _)| k == id) {
            return j.clone();
        }
        if jobs.len() >= KEPT_JOBS {
            jobs.pop_front();
        }
        let j = Arc::new(JobSearch {
            names: Mutex::new(vec![None; nnodes]),
            filled: watch::channel(0).0,
            played: OnceCell::new(),
        });
        jobs.push_back((id.to_string(), j.clone()));
        j
    }
}

/// One job's search in this process: its nodes' names by node rank, as
/// their assignments arrive, and the search once every one is known.
#[derive(Debug)]
struct JobSearch {
    names: Mutex<Vec<Option<String>>>,
    filled: watch::Sender<usize>,
    played: OnceCell<Arc<Played>>,
}

impl JobSearch {
    /// A rank of node `rank` named `name`: an error when the job's node
    /// ranks disagree (two names for one rank).
    fn enter(&self, rank: usize, name: &str) -> Result<(), String> {
        let mut names = self.names.lock().unwrap();
        let total = names.len();
        let Some(slot) = names.get_mut(rank) else {
            return Err(format!("node rank {rank} of a job of {total} nodes"));
        };
        match slot {
            Some(n) if n == name => Ok(()),
            Some(n) => Err(format!("node rank {rank} is both {n} and {name}")),
            None => {
                *slot = Some(name.to_string());
                self.filled.send_modify(|n| *n += 1);
                Ok(())
            }
        }
    }
}

/// A job's search, played: the rounds and the verdict every rank reports,
/// and each round's figure for each node measured in it.
#[derive(Debug)]
struct Played {
    result: CollectiveResult,
    /// `result` without its rounds, as most ranks send it.
    verdict: CollectiveResult,
    /// Per round: (node rank, its group's busbw), by node rank.
    figures: Vec<Vec<(u32, f64)>>,
}

impl Played {
    fn mine(&self, round: usize, node: u32) -> Option<f64> {
        let f = self.figures.get(round)?;
        f.binary_search_by_key(&node, |(n, _)| *n)
            .ok()
            .map(|i| f[i].1)
    }
}

/// Runs the search of a job whose nodes are `names` (by node rank) against
/// the model of `culprits`: as `gpuctl-worker`'s search does with the
/// rounds it measures, but measured by the model.
fn play(names: &[String], culprits: &Culprits, slow_ratio: f64, seed: u64) -> Played {
    let index: HashMap<&str, usize> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    let mut node = vec![1.0; names.len()];
    for (n, s) in &culprits.nodes {
        if let Some(&i) = index.get(n.as_str()) {
            node[i] = *s;
        }
    }
    let links: Vec<((usize, usize), f64)> = culprits
        .links
        .iter()
        .filter_map(|((a, b), s)| Some(((*index.get(a.as_str())?, *index.get(b.as_str())?), *s)))
        .collect();
    let mut model = Model::new(node, &links, SPREAD, seed);
    let mut search = Search::new(names.len(), slow_ratio, None).with_spread(SPREAD);
    let mut result = CollectiveResult {
        backend: "nccl".into(),
        ..Default::default()
    };
    let mut figures = Vec::new();
    while let Some(groups) = search.tests() {
        let round = search.outcome().rounds - 1;
        let busbw: Vec<f64> = groups
            .iter()
            .map(|g| model.measure(g) * HEALTHY_GBPS)
            .collect();
        let decision = search.decide(&busbw);
        let mut mine: Vec<(u32, f64)> = groups
            .iter()
            .zip(&busbw)
            .flat_map(|(g, b)| g.iter().map(move |n| (*n as u32, *b)))
            .collect();
        mine.sort_unstable_by_key(|(n, _)| *n);
        figures.push(mine);
        result.bisect.push(gpuctl_core::search::wire::round(
            round, &groups, &busbw, decision,
        ));
    }
    // As the worker fills it.
    gpuctl_core::search::wire::verdict(&mut result, &search);
    let verdict = CollectiveResult {
        bisect: Vec::new(),
        ..result.clone()
    };
    Played {
        result,
        verdict,
        figures,
    }
}

/// One rank of a search job on a node of `nnodes`: waits for the job's
/// search (played once here), plays its rounds with progress, and sends
/// its result.
pub async fn run(
    job: RankJob,
    nnodes: u32,
    shared: Arc<SearchPlay>,
    clients: Clients,
    stats: Arc<Stats>,
    stop: gpuctl_core::shutdown::Shutdown,
) -> Outcome {
    let client = clients.get();
    let start = job.clock.now_ms();
    let mut marks = vec![PhaseMark {
        phase: "starting".into(),
        unix_ms: start,
        iterations: 0,
        kind: PhaseKind::Setup as i32,
    }];
    let played = tokio::select! {
        p = search_of(&job, nnodes as usize, &shared) => p,
        _ = stop.cancelled() => return Outcome::Cancelled,
    };
    let played = match played {
        Ok(p) => p,
        Err(e) => {
            let r = result(&job, start, marks, Err(e));
            return deliver(&job, r, client, &clients, &stats).await;
        }
    };
    let node = job.placement.node_rank;
    let rounds = played.result.bisect.len();
    // As the worker guesses the fraction done: about ⌈log₂ N⌉ + 2 rounds.
    let expect = (u32::BITS - nnodes.saturating_sub(1).leading_zeros()) as f64 + 2.0;
    let began = tokio::time::Instant::now();
    let mut client = client;
    let mut next_report = began;
    let mut sent = 0u64;
    for r in 0..rounds {
        let phase = format!("search round {r}");
        let at = job.clock.now_ms();
        marks.push(PhaseMark {
            phase: phase.clone(),
            unix_ms: at,
            iterations: r as u64,
            kind: PhaseKind::Measured as i32,
        });
        tokio::select! {
            _ = tokio::time::sleep_until(began + shared.round * (r as u32 + 1)) => {}
            _ = stop.cancelled() => return Outcome::Cancelled,
        }
        if tokio::time::Instant::now() < next_report {
            continue;
        }
        let mine = played.mine(r, node);
        let progress = RankProgressReport {
            job_id: job.job_id.clone(),
            attempt: job.attempt,
            progress: Some(RankProgress {
                rank: job.placement.rank,
                node: job.placement.node.clone(),
                phase,
                fraction: ((r + 1) as f64 / (expect + 1.0)).min(0.95),
                metrics: mine
                    .map(|b| ("busbw_gbps".to_string(), b))
                    .into_iter()
                    .collect(),
                message: String::new(),
                unix_ms: job.clock.now_ms(),
                iterations: 0,
                waiting_for: String::new(),
            }),
        };
        match clients
            .unless_away(client.report_progress(request(&job, progress)))
            .await
        {
            Ok(ack) if !ack.get_ref().ok => return Outcome::Cancelled,
            Ok(ack) => {
                let every = u64::from(ack.get_ref().next_report_ms);
                sent += 1;
                let pause = gpuctl_core::spec::progress_pause_ms(every, job.placement.rank, sent);
                next_report = tokio::time::Instant::now() + Duration::from_millis(pause);
            }
            Err(s) => {
                stats.rpc_error("ReportProgress", &s);
                client = clients.get();
            }
        }
    }
    marks.push(PhaseMark {
        phase: "done".into(),
        unix_ms: job.clock.now_ms(),
        iterations: rounds as u64,
        kind: PhaseKind::Measured as i32,
    });
    let r = result(&job, start, marks, Ok(&played));
    deliver(&job, r, client, &clients, &stats).await
}

/// The job's search: once every node of the job has a rank here, played
/// by the first rank that asks.
async fn search_of(
    job: &RankJob,
    nnodes: usize,
    shared: &SearchPlay,
) -> Result<Arc<Played>, String> {
    let params = match TypedParams::build("nccl", &job.spec.params, true) {
        Ok(TypedParams::Nccl(p)) if p.pattern == NcclPattern::Search => p,
        Ok(_) => return Err("gpuctl-sim: not an nccl --pattern search job".into()),
        Err(e) => return Err(format!("the job's parameters: {e}")),
    };
    let entry = shared.job(&job.job_id, nnodes);
    entry.enter(job.placement.node_rank as usize, &job.placement.node)?;
    let mut filled = entry.filled.subscribe();
    let all = tokio::time::timeout(GATHER, filled.wait_for(|n| *n >= nnodes))
        .await
        .is_ok_and(|r| r.is_ok());
    if !all {
        let have = *entry.filled.borrow();
        return Err(format!(
            "gpuctl-sim: {have} of the job's {nnodes} nodes have ranks in this simulator after {}s; the search is played where every node's name is known",
            GATHER.as_secs()
        ));
    }
    let played = entry
        .played
        .get_or_init(|| async {
            let names: Vec<String> = entry
                .names
                .lock()
                .unwrap()
                .iter()
                .map(|n| n.clone().unwrap_or_default())
                .collect();
            Arc::new(play(
                &names,
                &shared.culprits,
                params.slow_ratio,
                shared.seed,
            ))
        })
        .await;
    Ok(played.clone())
}

/// The rank's result: the search's rounds and verdict, or its error.
fn result(
    job: &RankJob,
    start: u64,
    phases: Vec<PhaseMark>,
    played: Result<&Played, String>,
) -> RankResult {
    let end = job.clock.now_ms();
    let (ok, error, detail) = match played {
        Ok(p) => {
            // As a worker: the rounds in two ranks' results, the verdict in
            // all (cloned without the rounds: 35 KB a rank at 16,384 nodes).
            let (node, local) = (job.placement.node_rank, job.placement.local_rank);
            let mut c = if gpuctl_core::search::carries_rounds(node as usize, local as usize) {
                p.result.clone()
            } else {
                p.verdict.clone()
            };
            c.world_size = job.world_size;
            (true, String::new(), Some(Detail::Collectives(c)))
        }
        Err(e) => (
            false,
            format!(
                "node {} rank {} (cuda:{}): {e}",
                job.placement.node, job.placement.rank, job.placement.local_rank
            ),
            None,
        ),
    };
    RankResult {
        job_id: job.job_id.clone(),
        attempt: job.attempt,
        rank: job.placement.rank,
        node: job.placement.node.clone(),
        device: format!("cuda:{}", job.placement.local_rank),
        device_name: "NVIDIA H200".into(),
        gpu_uuid: job.placement.gpu_uuid.clone(),
        ok,
        error,
        peak_memory_bytes: 1 << 30,
        elapsed_ms: end.saturating_sub(start),
        torch_version: "2.11.0+cu130".into(),
        nccl_version: "2.28.3".into(),
        detail,
        more_train: vec![],
        phases,
        partial: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_played_search_names_the_culprits_by_node_rank() {
        let names: Vec<String> = (0..64).map(|i| format!("sim-{i:05}")).collect();
        let c = Culprits::drawn(64, 2, 3).unwrap();
        let p = play(&names, &c, 0.8, 3);
        let blamed: Vec<String> = p
            .result
            .search_blamed
            .iter()
            .map(|b| match (b.node, b.link_a, b.link_b) {
                (Some(n), _, _) => names[n as usize].clone(),
                (_, Some(a), Some(b)) => format!("{}:{}", names[a as usize], names[b as usize]),
                _ => unreachable!(),
            })
            .collect();
        let mut want: Vec<String> = c.nodes.keys().cloned().collect();
        want.extend(c.links.keys().map(|(a, b)| format!("{a}:{b}")));
        let mut got = blamed.clone();
        got.sort();
        want.sort();
        assert_eq!(got, want);
        // Every node measured in the first round, with its group's figure.
        assert_eq!(p.figures[0].len(), 64);
        assert!(p.mine(0, 5).is_some());
    }
}

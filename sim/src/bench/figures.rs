//! What one bench run measured: per phase of the run, per job, and the
//! fleet's own troubles. Apart from the run (`mod.rs`) because the phase
//! sampler fills these figures and `print.rs` shows them, and neither needs
//! the run that drives them.

use std::collections::BTreeMap;

use crate::fleet::RankConnections;

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
    /// Those by call and gRPC code, most first.
    pub rpc_error_kinds: Vec<(String, u64)>,
    pub results_refused: u64,
    /// The store at the end, by the key's first part: (keys, bytes of
    /// keys and values); empty where the file could not be read.
    pub store_use: BTreeMap<String, (u64, u64)>,
}

#[derive(Debug, Default, Clone)]
pub struct PhaseFigures {
    pub name: String,
    /// When it began, ms since the Unix epoch.
    pub started_unix_ms: u64,
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
    /// Every call as `slowest`, in the order each ended (the JSON's
    /// `calls`): to see a slow call beside the job's own moments. Each
    /// `fleet` call's decoding of its rows, named [`super::calls::DECODE`],
    /// ends before the call does and comes before it.
    pub calls: Vec<(String, f64, f64)>,
}

#[derive(Debug, Default, Clone)]
pub struct JobFigures {
    pub id: String,
    pub state: String,
    pub ranks: u32,
    /// Ranks the report judged on a result ([`ranks_judged`]).
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

/// Ranks `report` judged on a result. Not the results left in the report:
/// past 64 MB (131,072 ranks) the answer leaves passing ranks' results out
/// (`judge/thin.rs`), each still judged on its own.
pub fn ranks_judged(report: &gpuctl_proto::pb::Report) -> u32 {
    use gpuctl_proto::pb::Verdict;
    report
        .nodes
        .iter()
        .flat_map(|n| &n.ranks)
        .filter(|r| !matches!(r.verdict(), Verdict::Incomplete | Verdict::Unspecified))
        .count() as u32
}

//! The key space of docs/architecture.md ("Stored state"), in one place: every
//! key the coordinator stores is built here, so that the layout can be read
//! (and changed) without hunting through the code that writes it.

pub const JOB_SEQ: &str = "meta/job_seq";
/// The key of the workers' per-rank secrets (gpuctl_core::auth::RankKey).
pub const RANK_KEY: &str = "meta/rank_key";
pub const NODES: &str = "nodes/";
pub const JOBS: &str = "jobs/";
pub const BASELINES: &str = "baselines/";
pub const HISTORY: &str = "history/";
pub const SUITES: &str = "suites/";
pub const ACCEPTANCE: &str = "acceptance/";

/// One node's run of one job; the time first so a node's runs sort by age.
pub fn history(node: &str, finished_ms: u64, job: &str) -> String {
    format!("history/{node}/{finished_ms:013}-{job}")
}
pub fn history_of(node: &str) -> String {
    format!("history/{node}/")
}

/// A key of what the fleet history reads, taken apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryInput<'a> {
    /// A run of this node ([`history`]).
    Run(&'a str),
    /// This node's acceptance state ([`acceptance`]).
    Acceptance(&'a str),
    /// This node of the inventory ([`node`]).
    Node(&'a str),
}

/// Whose run, acceptance or inventory entry `key` is, if it is one.
pub fn history_input(key: &str) -> Option<HistoryInput<'_>> {
    if let Some(rest) = key.strip_prefix(HISTORY) {
        return rest
            .rsplit_once('/')
            .map(|(node, _)| HistoryInput::Run(node));
    }
    if let Some(node) = key.strip_prefix(ACCEPTANCE) {
        return Some(HistoryInput::Acceptance(node));
    }
    key.strip_prefix(NODES).map(HistoryInput::Node)
}
/// Jobs whose report is stored and whose runs may not be: see
/// [`crate::history::store_runs`].
pub const HISTORY_DUE: &str = "history-due/";
pub fn history_due(job: &str) -> String {
    format!("history-due/{job}")
}

pub fn baseline(name: &str) -> String {
    format!("baselines/{name}")
}

pub fn suite(id: &str) -> String {
    format!("suites/{id}")
}
/// A node's last acceptance suite.
pub fn acceptance(node: &str) -> String {
    format!("acceptance/{node}")
}

pub fn node(name: &str) -> String {
    format!("nodes/{name}")
}
pub fn job(id: &str) -> String {
    format!("jobs/{id}")
}
/// A job's plan, apart from its record: written once when the job starts,
/// while the record is written again at each change of state. At 131,072
/// ranks the plan is 7.8 MB, which the end's record wrote again unchanged,
/// in the same commit as the report.
pub const PLANS: &str = "plans/";
pub fn plan(id: &str) -> String {
    format!("plans/{id}")
}
pub fn result(job: &str, attempt: u32, rank: u32) -> String {
    format!("results/{job}/{attempt}/{rank:06}")
}
/// The trailing slash keeps `job-1` from matching `job-10`.
pub fn results(job: &str, attempt: u32) -> String {
    format!("results/{job}/{attempt}/")
}
/// Every attempt's results of a job.
pub fn results_of(job: &str) -> String {
    format!("results/{job}/")
}
pub fn report(job: &str) -> String {
    format!("reports/{job}")
}
pub fn log(job: &str, rank: u32, seq: u64) -> String {
    format!("logs/{job}/{rank:06}/{seq:010}")
}
/// One GPU's downsampled telemetry series of a job.
pub fn telemetry(job: &str, node: &str, gpu: u32) -> String {
    format!("telemetry/{job}/{node}/{gpu:03}")
}
pub fn telemetry_of(job: &str) -> String {
    format!("telemetry/{job}/")
}
/// Bytes the store holds of an ended job (`crate::store::sizes`), a decimal
/// number: read at load, so that `--keep-jobs-bytes` does not read every
/// kept job again.
pub const JOB_BYTES: &str = "job-bytes/";
pub fn job_bytes(job: &str) -> String {
    format!("job-bytes/{job}")
}
pub fn logs(job: &str, rank: Option<u32>) -> String {
    match rank {
        Some(r) => format!("logs/{job}/{r:06}/"),
        None => format!("logs/{job}/"),
    }
}

/// Acceptance certificates (issue 50, `crate::cert::records`): each node's
/// latest, the evidence of each suite's stage jobs, the revoked ids.
pub const CERTS_LATEST: &str = "certs/latest/";
pub const CERTS_REVOKED: &str = "certs/revoked/";
pub const CERTS_SUMMARY: &str = "certs/summary/";
pub fn cert_summary(node: &str) -> String {
    format!("certs/summary/{node}")
}
pub fn cert_latest(node: &str) -> String {
    format!("certs/latest/{node}")
}
pub fn cert_evidence(suite: &str, job: &str) -> String {
    format!("certs/evidence/{suite}/{job}")
}
/// The trailing slash keeps `acc-000001` from matching `acc-0000010`.
pub fn cert_evidence_of(suite: &str) -> String {
    format!("certs/evidence/{suite}/")
}
pub fn cert_revoked(id: &str) -> String {
    format!("certs/revoked/{id}")
}

/// The key prefixes that hold job `id`'s data, and its single keys, its
/// record last: what `StateStore::delete_job` deletes and what
/// `--keep-jobs-bytes` measures (the job's own figure, `job-bytes/`, apart).
pub fn job_keys(id: &str) -> ([String; 3], [String; 4]) {
    (
        [results_of(id), logs(id, None), telemetry_of(id)],
        [report(id), history_due(id), plan(id), job(id)],
    )
}

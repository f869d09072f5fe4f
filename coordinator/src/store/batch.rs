//! [`Batch`]: the typed builder of one atomic write. It knows which key each
//! message goes under and how it is encoded (a job's record apart from its
//! plan, a report without its ranks' results), so that callers hand the
//! store messages, never keys and bytes.

use gpuctl_proto::pb::{Acceptance, Job, Node, NodeRun, RankReport, Report, Suite};
use prost::Message;

use super::keys;
use crate::judge::telemetry::Encoded;

/// One write of a typed batch; see [`StateStore::write`].
///
/// [`StateStore::write`]: crate::store::StateStore::write
#[derive(Default)]
// The entries are open to `store/` alone: the typed layer hands them to the
// writer as they are, and no caller outside builds a key by hand.
pub struct Batch(pub(super) Vec<(String, Vec<u8>)>);

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Batch({} keys)", self.0.len())
    }
}

impl Batch {
    pub fn node(mut self, node: &Node) -> Self {
        self.0.push((keys::node(&node.name), node.encode_to_vec()));
        self
    }
    /// The job's record, without its plan ([`Batch::plan`] writes that) and
    /// its progress: progress changes every second and is served from
    /// memory, not stored. Both are set aside while the record is encoded,
    /// so that a 131,072-rank plan is neither copied nor written again.
    pub fn job(mut self, job: &mut Job) -> Self {
        let plan = job.plan.take();
        let progress = std::mem::take(&mut job.progress);
        self.0.push((keys::job(&job.id), job.encode_to_vec()));
        job.plan = plan;
        job.progress = progress;
        self
    }
    /// The job's plan under its own key ([`keys::plan`]); a job without
    /// one writes nothing. Readers put it back into the record
    /// (`StateStore::job`).
    pub fn plan(mut self, job: &Job) -> Self {
        if let Some(plan) = &job.plan {
            self.0.push((keys::plan(&job.id), plan.encode_to_vec()));
        }
        self
    }
    /// The report without its ranks' results: each is under its own key
    /// already, and [`StateStore::report`] puts them back. At 32,768 ranks
    /// they were most of a 40 MB value, encoded and written again at the
    /// job's end, when memory peaks.
    ///
    /// [`StateStore::report`]: crate::store::StateStore::report
    pub fn report(mut self, report: &mut Report) -> Self {
        let results: Vec<_> = ranks_of(report).map(|r| r.result.take()).collect();
        self = self.bare_report(report);
        for (rank, result) in ranks_of(report).zip(results) {
            rank.result = result;
        }
        self
    }
    /// As [`Batch::report`], for a report whose ranks carry no results
    /// yet (the judge attaches them after): encoded from a shared borrow,
    /// beside other work.
    pub fn bare_report(mut self, report: &Report) -> Self {
        debug_assert!(report
            .nodes
            .iter()
            .flat_map(|n| &n.ranks)
            .all(|r| r.result.is_none()));
        self.0
            .push((keys::report(&report.job_id), report.encode_to_vec()));
        self
    }
    pub fn suite(mut self, suite: &Suite) -> Self {
        self.0.push((keys::suite(&suite.id), suite.encode_to_vec()));
        self
    }
    pub fn acceptance(mut self, a: &Acceptance) -> Self {
        self.0.push((keys::acceptance(&a.node), a.encode_to_vec()));
        self
    }
    /// Marks `job`'s runs as due: written with its report, deleted once
    /// they are committed too.
    pub fn history_due(mut self, job: &str) -> Self {
        self.0.push((keys::history_due(job), Vec::new()));
        self
    }
    pub fn run(mut self, run: &NodeRun) -> Self {
        let key = keys::history(&run.node, run.finished_unix_ms, &run.job_id);
        self.0.push((key, run.encode_to_vec()));
        self
    }
    pub fn telemetry(mut self, job: &str, series: Encoded) -> Self {
        self.0.push((
            keys::telemetry(job, &series.node, series.index),
            series.bytes,
        ));
        self
    }
    pub fn job_seq(mut self, seq: u64) -> Self {
        self.0
            .push((keys::JOB_SEQ.to_string(), seq.to_string().into_bytes()));
        self
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many keys it writes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Keys and values, in bytes.
    pub fn bytes(&self) -> usize {
        self.0.iter().map(|(k, v)| k.len() + v.len()).sum()
    }

    /// Each of `series` under `job`, handed to `write` in batches of about
    /// `max_bytes` as each fills.
    pub fn telemetry_parts(
        job: &str,
        series: impl Iterator<Item = Encoded>,
        max_bytes: usize,
        mut write: impl FnMut(Batch),
    ) {
        let (mut part, mut bytes) = (Batch::default(), 0);
        for s in series {
            if bytes >= max_bytes {
                write(std::mem::take(&mut part));
                bytes = 0;
            }
            part = part.telemetry(job, s);
            bytes += part.0.last().map_or(0, |(k, v)| k.len() + v.len());
        }
        if !part.is_empty() {
            write(part);
        }
    }
}

pub(super) fn ranks_of(report: &mut Report) -> impl Iterator<Item = &mut RankReport> {
    report.nodes.iter_mut().flat_map(|n| &mut n.ranks)
}

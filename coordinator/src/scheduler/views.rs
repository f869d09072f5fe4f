//! What people read: every [`Query`] is answered here, top to bottom, and
//! what they are shown of a big fleet is made here: a job bounded to the
//! ranks furthest behind, and nodes as a table shows them. At 4,096 nodes
//! a whole job is 32,768 placements, progress reports and some 200,000
//! preflight checks, tens of megabytes a call; `gpuctl status` and the
//! live view ask each second, and show a screenful.

use std::cmp::Reverse;

use gpuctl_proto::listing::{NodeRow, TableBuilder};
use gpuctl_proto::pb::{Job, Node, NodeTable, PreflightCheck, RankProgress, Verdict};

use super::events::{Listing, Query, Reply};
use super::state::{Fixed, JobEntry, PlanFaults};
use super::Scheduler;
use crate::error::CoordinatorError;

impl Scheduler {
    /// Answers a read. No read changes what a person sees: a report waited
    /// for, or one kept a while, only changes how it is answered. Each is
    /// answered here or by the file that owns what it reads (`jobs`,
    /// `ranks`, `reports`, `snapshot`, `suites`, `planning`).
    pub(super) async fn on_query(&mut self, q: Query) {
        match q {
            Query::GetJob {
                job_id,
                max_ranks,
                reply,
            } => self.get_job(&job_id, max_ranks, reply),
            Query::LogsSettled { job_id, reply } => {
                let _ = reply.send(self.logs_settled(&job_id));
            }
            Query::ListJobs { limit, reply } => {
                let _ = reply.send(self.list_jobs(limit));
            }
            Query::ListNodes { brief, reply } => {
                let _ = reply.send(self.list_nodes(brief));
            }
            Query::GetTelemetry { job_id, reply } => {
                let _ = reply.send(self.latest_telemetry(&job_id));
            }
            Query::GetReport { job_id, reply } => self.get_report(&job_id, reply).await,
            Query::Metrics { reply } => {
                let _ = reply.send(self.snapshot());
            }
            Query::GetSuite { id, reply } => {
                let _ = reply.send(self.suite(&id));
            }
            Query::Session { node, reply } => {
                let tx = self.nodes.get(&node).and_then(|n| n.session.as_ref());
                let _ = reply.send(tx.map(|s| s.tx.clone()));
            }
            Query::Plan {
                spec,
                max_ranks,
                reply,
            } => self.plan_later(spec, max_ranks, reply),
        }
    }

    /// The listings and views kept for readers made again when due
    /// (`listing.rs`, `kept_view.rs`): after an event that changed what
    /// they show, and while part of it moves (heartbeats, a running job's
    /// results), for as long as people read them. A job's start or end
    /// then answers `gpuctl nodes`, `jobs` and `status` at once, not after
    /// the task got through its fleet.
    pub(super) fn keep_listings(&self) {
        let now = self.cfg.clock.now_ms();
        if self.job_listing.due(now) {
            let jobs = self.list_jobs(0);
            let moving = jobs.iter().any(|j| !j.state().is_terminal());
            self.job_listing
                .keep(std::sync::Arc::new(jobs), now, moving);
        }
        if self.listing.due(now) {
            let t = table(
                self.nodes
                    .values()
                    .map(|e| (e.node.as_ref(), e.fixed.as_ref())),
            );
            self.listing.keep(std::sync::Arc::new(t), now, true);
        }
        self.keep_views(now);
    }

    /// `ListNodes`: a brief listing's table is built here, from the nodes
    /// in place, and kept for readers who come before a node changes
    /// (`listing.rs`). Built by the
    /// caller, it held every node's `Arc` meanwhile, and a job's start or
    /// end, which changes all 4,096 nodes, copied each one held (GPUs,
    /// facts, checks) on this task. Whole nodes (`-o json`) are still
    /// copied by the caller: building them here held the task 15-30 ms a
    /// call.
    fn list_nodes(&self, brief: bool) -> Listing {
        let nodes = self.nodes.values();
        if brief {
            // Callers that queued behind a job's start, which changed every
            // node, take the table the first of them had built.
            if let Some(t) = self.listing.current(self.cfg.clock.now_ms()) {
                return Listing::Table(t);
            }
            let t = table(nodes.map(|e| (e.node.as_ref(), e.fixed.as_ref())));
            let t = std::sync::Arc::new(t);
            self.listing.keep(t.clone(), self.cfg.clock.now_ms(), true);
            Listing::Table(t)
        } else {
            Listing::Nodes(nodes.map(|e| e.node.clone()).collect())
        }
    }

    /// `GetJob`: from memory, or for a retired job (an ended big one) from
    /// the store on a task of its own.
    fn get_job(&self, id: &str, max_ranks: u32, reply: Reply<Result<Job, CoordinatorError>>) {
        let entry = match self.job(id) {
            Ok(e) => e,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        if !entry.retired || max_ranks == 1 {
            // One rank asked for: a check that the job exists.
            let _ = reply.send(Ok(entry.view_at(max_ranks, self.cfg.clock.now_ms())));
            return;
        }
        if let Some(view) = entry.retired_view.as_ref() {
            if max_ranks == gpuctl_proto::VIEW_RANKS {
                let _ = reply.send(Ok(view.clone()));
                return;
            }
        }
        let (store, summary) = (self.store.clone(), entry.job.clone());
        tokio::spawn(async move {
            let job = match store.job(&summary.id).await {
                Ok(Some(stored)) => stored,
                Ok(None) => summary,
                Err(e) => {
                    let doing = format!("reading job {}", summary.id);
                    let _ = reply.send(Err(CoordinatorError::store(doing, e)));
                    return;
                }
            };
            let entry = JobEntry {
                job,
                ..Default::default()
            };
            let _ = reply.send(Ok(entry.view_of(max_ranks)));
        });
    }
}

impl JobEntry {
    /// The job with live progress; with `max_ranks` > 0, bounded (see
    /// `GetJobRequest.max_ranks`).
    pub fn view_of(&self, max_ranks: u32) -> Job {
        let world = self.job.plan.as_ref().map_or(0, |p| p.ranks.len());
        let bounded = max_ranks > 0
            && (world > max_ranks as usize || self.progress.len() > max_ranks as usize);
        if !bounded {
            return self.view();
        }
        let mut job = self.summary();
        // Furthest behind first: no progress yet, then the oldest report,
        // then the least done; by rank among equals.
        let key = |rank: u32, p: Option<&RankProgress>| {
            (
                p.is_some(),
                p.map_or(0, |p| p.unix_ms),
                p.map_or(0, |p| (p.fraction * 1e6) as i64),
                rank,
            )
        };
        let full = self.job.plan.as_ref();
        // Each rank's key is made once, its progress found by index from one
        // walk of the map: at 32,768 ranks a map lookup per rank held the
        // scheduler ~9 ms a call (one in every comparison, ~15 ms), and
        // clients ask every second or faster while a job runs.
        let mut keyed: Vec<_> = match full {
            Some(p) if !p.ranks.is_empty() => {
                let mut by_rank: Vec<Option<&RankProgress>> = vec![None; p.ranks.len()];
                for (rank, progress) in self.progress.range(..p.ranks.len() as u32) {
                    by_rank[*rank as usize] = Some(progress);
                }
                p.ranks
                    .iter()
                    .map(|r| match by_rank.get(r.rank as usize) {
                        Some(found) => key(r.rank, *found),
                        None => key(r.rank, self.progress.get(&r.rank)),
                    })
                    .collect()
            }
            _ => self
                .progress
                .iter()
                .map(|(r, p)| key(*r, Some(p)))
                .collect(),
        };
        let total = keyed.len();
        let keep = (max_ranks as usize).min(total);
        if keep < total {
            keyed.select_nth_unstable(keep);
            keyed.truncate(keep);
        }
        keyed.sort_unstable();
        let ranks: Vec<u32> = keyed.into_iter().map(|k| k.3).collect();
        let mut left_out = 0;
        if let (Some(plan), Some(full)) = (job.plan.as_mut(), full) {
            plan.ranks = ranks
                .iter()
                .filter_map(|r| full.placement(*r).cloned())
                .collect();
            plan.env = full.env.clone();
            plan.spec = full.spec.clone();
            let (checks, left) = self.plan_faults(max_ranks as usize);
            plan.checks = checks;
            left_out += left;
        }
        job.progress = ranks
            .iter()
            .filter_map(|r| self.progress.get(r).cloned())
            .collect();
        job.ranks_left_out = (total - ranks.len()) as u32;
        let (checks, left) = not_passing(&self.job.start_checks, max_ranks as usize);
        job.start_checks = checks;
        job.checks_left_out = left_out + left;
        job
    }
}

impl JobEntry {
    /// [`not_passing`] for the plan's checks, found once per plan.
    fn plan_faults(&self, max: usize) -> (Vec<PreflightCheck>, u32) {
        let Some(checks) = self.job.plan.as_ref().map(|p| &p.checks[..]) else {
            return (Vec::new(), 0);
        };
        let of = (self.job.attempt, checks.len());
        let mut cached = self.plan_faults.lock().unwrap_or_else(|e| e.into_inner());
        let faults = match cached.take() {
            Some(f) if f.of == of => f,
            _ => PlanFaults {
                of,
                bad: worst_first(checks),
            },
        };
        let shown: Vec<PreflightCheck> = faults
            .bad
            .iter()
            .take(max)
            .map(|i| checks[*i as usize].clone())
            .collect();
        let left = (checks.len() - shown.len()) as u32;
        *cached = Some(faults);
        (shown, left)
    }
}

/// The indices of the checks that did not pass, worst first.
fn worst_first(checks: &[PreflightCheck]) -> Vec<u32> {
    let mut bad: Vec<u32> = (0..checks.len() as u32)
        .filter(|i| checks[*i as usize].verdict() != Verdict::Pass)
        .collect();
    bad.sort_by_key(|i| Reverse(severity(checks[*i as usize].verdict())));
    bad
}

/// The checks that did not pass, worst first, at most `max`; and how many
/// were left out.
pub(super) fn not_passing(checks: &[PreflightCheck], max: usize) -> (Vec<PreflightCheck>, u32) {
    let mut bad = worst_first(checks);
    bad.truncate(max);
    let left = (checks.len() - bad.len()) as u32;
    (
        bad.into_iter()
            .map(|i| checks[i as usize].clone())
            .collect(),
        left,
    )
}

fn severity(v: Verdict) -> u8 {
    match v {
        Verdict::Fail => 3,
        Verdict::Incomplete => 2,
        Verdict::Warn => 1,
        _ => 0,
    }
}

/// The brief listing of `nodes` (`ListNodesRequest.brief`), as the columns
/// of a table.
pub fn table<'a>(nodes: impl ExactSizeIterator<Item = (&'a Node, &'a Fixed)>) -> NodeTable {
    let mut b = TableBuilder::with_capacity(nodes.len());
    for (n, fixed) in nodes {
        b.push(NodeRow {
            name: &n.name,
            state: n.state(),
            slots: fixed.slots,
            last_heartbeat_unix_ms: n.last_heartbeat_unix_ms,
            shm_bytes: fixed.shm_bytes,
            model: &fixed.model,
            job: &n.current_job,
            reason: &n.state_reason,
        });
    }
    b.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::state::LISTED_NODES;
    use gpuctl_proto::pb::{GpuInfo, HostFacts, NodeState, Plan, RankPlacement};
    use prost::Message as _;

    fn job(world: u32) -> JobEntry {
        let ranks = (0..world)
            .map(|r| RankPlacement {
                rank: r,
                node: format!("n{}", r / 8),
                ..Default::default()
            })
            .collect();
        let mut e = JobEntry::default();
        e.job.id = "job-000001".into();
        e.job.plan = Some(Plan {
            ranks,
            world_size: world,
            checks: (0..world)
                .map(|r| PreflightCheck {
                    node: format!("n{}", r / 8),
                    verdict: if r == 77 {
                        Verdict::Warn
                    } else {
                        Verdict::Pass
                    } as i32,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        });
        for r in 0..world {
            e.progress.insert(
                r,
                RankProgress {
                    rank: r,
                    unix_ms: 10_000 + u64::from(r % 5),
                    fraction: 0.5,
                    ..Default::default()
                },
            );
        }
        e
    }

    #[test]
    fn a_big_job_shows_the_ranks_furthest_behind() {
        let mut e = job(1024);
        e.progress.remove(&900); // never reported
        e.progress.get_mut(&33).unwrap().unix_ms = 1_000; // stale
        e.progress.get_mut(&35).unwrap().fraction = 0.1; // behind among the oldest
        let v = e.view_of(8);
        let shown: Vec<u32> = v
            .plan
            .as_ref()
            .unwrap()
            .ranks
            .iter()
            .map(|r| r.rank)
            .collect();
        assert_eq!(shown.len(), 8);
        assert_eq!(&shown[..2], &[900, 33], "no progress, then the stalest");
        assert_eq!(v.progress.len(), 7, "rank 900 has no progress to show");
        assert_eq!(v.progress[0].rank, 33);
        assert_eq!(shown[2], 35, "the least done of the oldest reports");
        assert_eq!(shown[3], 0, "then by rank");
        assert_eq!(v.ranks_left_out, 1016);
        let checks = &v.plan.as_ref().unwrap().checks;
        assert_eq!(checks.len(), 1, "only the check that did not pass");
        assert_eq!(v.checks_left_out, 1023);
        assert_eq!(v.plan.as_ref().unwrap().world_size, 1024);
    }

    #[test]
    fn a_plan_in_any_rank_order_shows_the_same_ranks() {
        let mut e = job(1024);
        e.progress.remove(&900);
        e.progress.get_mut(&33).unwrap().unix_ms = 1_000;
        let shown = |e: &JobEntry| -> Vec<u32> {
            let v = e.view_of(8);
            v.plan.unwrap().ranks.iter().map(|r| r.rank).collect()
        };
        let in_order = shown(&e);
        assert_eq!(&in_order[..2], &[900, 33]);
        let ranks = &mut e.job.plan.as_mut().unwrap().ranks;
        ranks.reverse();
        // A rank past the plan's length is still found in the map: its
        // report is the newest, so it is not among the furthest behind (as
        // a rank with no progress it would come second).
        ranks[0].rank = 5000;
        e.progress.insert(
            5000,
            RankProgress {
                rank: 5000,
                unix_ms: 1_000_000,
                ..Default::default()
            },
        );
        let v = shown(&e);
        assert_eq!(&v[..2], &[900, 33]);
        assert!(!v.contains(&5000), "{v:?}");
    }

    #[test]
    fn a_retired_job_keeps_the_view_the_store_would_give() {
        use gpuctl_proto::VIEW_RANKS;
        let mut e = job(2048);
        e.job.set_state(gpuctl_proto::pb::JobState::Succeeded);
        e.job.start_checks = vec![PreflightCheck {
            node: "n3".into(),
            verdict: Verdict::Fail as i32,
            ..Default::default()
        }];
        // What `GetJob` read back from the store: the job, no progress.
        let stored = JobEntry {
            job: e.job.clone(),
            ..Default::default()
        };
        e.retire();
        assert!(e.retired);
        assert!(e.job.plan.as_ref().unwrap().ranks.is_empty(), "let go");
        let kept = e.retired_view.clone().expect("a view kept");
        assert_eq!(kept, stored.view_of(VIEW_RANKS));
        assert_eq!(kept.plan.unwrap().ranks.len(), VIEW_RANKS as usize);
        assert!(kept.progress.is_empty());
        assert_eq!(kept.start_checks.len(), 1);
        // A small job keeps its parts and needs no kept view.
        let mut small = job(16);
        small.job.set_state(gpuctl_proto::pb::JobState::Succeeded);
        small.retire();
        assert!(!small.retired && small.retired_view.is_none());
    }

    #[test]
    fn a_job_let_go_keeps_nothing_per_rank_whatever_its_size() {
        let mut small = job(16);
        small.let_go();
        assert!(!small.retired, "a running job is kept whole");
        small.job.set_state(gpuctl_proto::pb::JobState::Failed);
        small.let_go();
        assert!(small.retired && small.retired_view.is_none());
        assert!(small.job.plan.as_ref().unwrap().ranks.is_empty());
        assert_eq!(small.world_size(), 16, "its size stays known");
        let mut big = job(2048);
        big.job.set_state(gpuctl_proto::pb::JobState::Succeeded);
        big.retire();
        assert!(big.retired_view.is_some());
        big.let_go();
        assert!(big.retired && big.retired_view.is_none());
    }

    #[test]
    fn a_new_plan_s_failed_checks_are_found_again() {
        let mut e = job(1024);
        let shown = |e: &JobEntry| -> Vec<String> {
            let v = e.view_of(8);
            v.plan
                .unwrap()
                .checks
                .iter()
                .map(|c| c.node.clone())
                .collect()
        };
        assert_eq!(shown(&e), ["n9"]);
        // A second attempt planned again: a failure and a warning elsewhere.
        e.job.attempt = 2;
        let checks = &mut e.job.plan.as_mut().unwrap().checks;
        checks[77].verdict = Verdict::Pass as i32;
        checks[200].verdict = Verdict::Warn as i32;
        checks[300].verdict = Verdict::Fail as i32;
        assert_eq!(shown(&e), ["n37", "n25"], "worst first, of the new plan");
    }

    #[test]
    fn a_listing_names_a_few_of_a_big_job_s_nodes_and_counts_the_rest() {
        let mut e = job(4096);
        let nodes: Vec<String> = (0..512).map(|n| format!("n{n}")).collect();
        e.job.plan.as_mut().unwrap().nodes = nodes.clone();
        let listed = e.listed();
        assert_eq!(listed.plan.unwrap().nodes, nodes[..LISTED_NODES]);
        assert_eq!(listed.nodes_left_out, 512 - LISTED_NODES as u32);
        assert_eq!(e.summary().plan.unwrap().nodes.len(), 512);
        let small = job(16);
        assert_eq!(small.listed().nodes_left_out, 0);
    }

    #[test]
    fn a_small_job_and_zero_show_everything() {
        let e = job(16);
        assert_eq!(e.view_of(64).plan.unwrap().ranks.len(), 16);
        let e = job(256);
        let v = e.view_of(0);
        assert_eq!(v.plan.unwrap().ranks.len(), 256);
        assert_eq!(v.progress.len(), 256);
        assert_eq!(v.ranks_left_out, 0);
    }

    #[test]
    fn a_table_row_shows_each_run_of_one_model_once_and_counts_the_gpus() {
        let gpu = |index, name: &str| GpuInfo {
            index,
            name: name.into(),
            uuid: format!("GPU-{index}"),
            ..Default::default()
        };
        let mut n = Node {
            name: "n1".into(),
            slots: 8,
            gpus: (0..8).map(|i| gpu(i, "NVIDIA H200")).collect(),
            current_job: "job-000003".into(),
            state: NodeState::Busy as i32,
            last_heartbeat_unix_ms: 1_700_000_000_000,
            facts: Some(HostFacts {
                hostname: "n1.example.com".into(),
                shm_bytes: 1 << 30,
                ..Default::default()
            }),
            ..Default::default()
        };
        let cpu = Node {
            name: "c1".into(),
            state_reason: "drained: bad fan".into(),
            facts: Some(HostFacts {
                cpu_ranks: 2,
                ..Default::default()
            }),
            ..Default::default()
        };
        let shown = |n: &Node, cpu: &Node| {
            let t = NodeTable::decode(
                table(
                    [n, cpu]
                        .map(|n| (n, Fixed::of(n)))
                        .iter()
                        .map(|(n, f)| (*n, f)),
                )
                .encode_to_vec()
                .as_slice(),
            )
            .unwrap();
            let rows: Vec<(String, u32, String, String, String, u64)> = t
                .rows()
                .map(|r| {
                    (
                        r.name.to_string(),
                        r.slots,
                        r.model.to_string(),
                        r.job.to_string(),
                        r.reason.to_string(),
                        r.shm_bytes,
                    )
                })
                .collect();
            (t.row(0).state, t.row(0).last_heartbeat_unix_ms, rows)
        };
        let (state, heard, rows) = shown(&n, &cpu);
        assert_eq!((state, heard), (NodeState::Busy, 1_700_000_000_000));
        assert_eq!(
            rows,
            [
                (
                    "n1".into(),
                    8,
                    "NVIDIA H200".into(),
                    "job-000003".into(),
                    String::new(),
                    1 << 30
                ),
                // No GPUs: its CPU ranks, from its facts.
                (
                    "c1".into(),
                    2,
                    String::new(),
                    String::new(),
                    "drained: bad fan".into(),
                    0
                ),
            ]
        );
        n.gpus[5].name = "NVIDIA H100".into();
        let (_, _, rows) = shown(&n, &cpu);
        assert_eq!(
            rows[0].2, "NVIDIA H200, NVIDIA H100, NVIDIA H200",
            "a node of mixed models still shows it"
        );
    }
}

//! The scheduler's time-dependent rules, driven by a manual [`Clock`]: each
//! test holds time at the edge of a rule, then one millisecond past it, and
//! looks at the state on both sides. Nothing sleeps: events, the tick
//! among them, are dispatched directly, as the event loop would.

use std::sync::Arc;
use std::time::Duration;

use gpuctl_core::spec::DEADLINE_GRACE_MS;
use gpuctl_proto::pb::{
    CoordinatorMessage, Heartbeat, HostFacts, JobSpec, JobState, NodeState, RankProgress,
    RankProgressReport, RankResult, RegisterRequest, WorkerExited,
};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::oneshot;

use super::*;
use crate::store::RedbStore;

/// Some Unix time, in ms.
pub(super) const T0: u64 = 1_700_000_000_000;

pub(super) struct Fixture {
    pub(super) sched: Scheduler,
    pub(super) clock: Clock,
    /// The agents' ends of their sessions, kept open.
    sessions: Vec<UnboundedReceiver<Box<CoordinatorMessage>>>,
    _dir: tempfile::TempDir,
}

impl Fixture {
    pub(super) async fn new(node_timeout: Duration) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let raw = RedbStore::open(&dir.path().join("state.redb")).unwrap();
        Fixture::on(node_timeout, Arc::new(raw), dir).await
    }

    /// As [`Fixture::new`], on `raw` (kept in `dir`).
    async fn on(
        node_timeout: Duration,
        raw: Arc<dyn crate::store::Store>,
        dir: tempfile::TempDir,
    ) -> Fixture {
        let clock = Clock::manual(T0);
        let store = StateStore::new(raw);
        let (logs, _) = LogSink::spawn(store.clone());
        let cfg = SchedulerConfig {
            certs: None,
            node_timeout,
            adopt_grace: Duration::from_secs(60),
            heartbeat_interval: Duration::from_secs(1),
            agent_messages_per_s: 2_048,
            health_rules: Arc::default(),
            perf_rules: Arc::default(),
            keep_jobs: 100,
            keep_jobs_bytes: u64::MAX,
            max_nodes: 16,
            clock: clock.clone(),
            refusals: Default::default(),
        };
        let sched = Scheduler::load(cfg, store, Rendezvous::default(), logs)
            .await
            .unwrap();
        // Read from the start, so that every test's events keep both
        // listings made and check the job list's ([`Scheduler::dispatch`]).
        sched.listing.current(T0);
        sched.job_listing.current(T0);
        Fixture {
            sched,
            clock,
            sessions: Vec::new(),
            _dir: dir,
        }
    }

    /// Registers a CPU node with two ranks and opens its session (id 1),
    /// as its agent would.
    pub(super) async fn join(&mut self, name: &str) {
        let req = RegisterRequest {
            protocol_version: gpuctl_proto::PROTOCOL_VERSION,
            name: name.into(),
            facts: Some(HostFacts {
                hostname: name.into(),
                addresses: vec!["127.0.0.1".into()],
                cpu_count: 4,
                cpu_ranks: 2,
                ..Default::default()
            }),
            ..Default::default()
        };
        let (reply, answer) = oneshot::channel();
        self.sched
            .dispatch(
                AgentEvent::AgentRegistered {
                    req,
                    coordinator_url: "http://127.0.0.1:1".into(),
                    reply,
                }
                .into(),
            )
            .await;
        answer.await.unwrap().unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (reply, answer) = oneshot::channel();
        self.sched
            .dispatch(
                AgentEvent::SessionOpened {
                    node: name.into(),
                    session: 1,
                    tx,
                    first: Heartbeat::default(),
                    reply,
                }
                .into(),
            )
            .await;
        answer.await.unwrap().unwrap();
        self.sessions.push(rx);
    }

    pub(super) async fn beat(&mut self, name: &str) {
        let hb = AgentEvent::Heartbeat {
            node: name.into(),
            session: 1,
            hb: Heartbeat::default(),
        };
        self.sched.dispatch(hb.into()).await;
    }

    fn node_state(&self, name: &str) -> NodeState {
        self.sched.nodes[name].node.state()
    }

    /// Submits `spec` on the task, as a suite's stage is; it starts at
    /// once on the free node.
    async fn submit(&mut self, spec: JobSpec) -> String {
        let job = self.sched.submit(spec).await.unwrap();
        assert_eq!(self.job(&job.id).state(), JobState::Running);
        job.id
    }

    fn job(&self, id: &str) -> &JobEntry {
        &self.sched.jobs[id]
    }

    async fn progress(&mut self, job: &str, rank: u32, iterations: u64) {
        self.progress_arrived(job, rank, iterations, self.clock.now_ms())
            .await;
    }

    /// A progress report that reached the coordinator at `arrived_ms` and
    /// is read now.
    async fn progress_arrived(&mut self, job: &str, rank: u32, iterations: u64, arrived_ms: u64) {
        let (reply, answer) = oneshot::channel();
        let report = RankProgressReport {
            job_id: job.into(),
            attempt: 1,
            progress: Some(RankProgress {
                rank,
                iterations,
                ..Default::default()
            }),
        };
        let ev = RankEvent::WorkerProgress {
            report,
            arrived_ms,
            reply,
        };
        self.sched.dispatch(ev.into()).await;
        let ack = answer.await.unwrap();
        assert!(ack.ok, "{}", ack.message);
    }

    /// Sends rank `rank`'s result; the worker's answer, once it comes.
    async fn result(&mut self, job: &str, rank: u32) -> (bool, String) {
        let (reply, answer) = oneshot::channel();
        let result = RankResult {
            job_id: job.into(),
            attempt: 1,
            rank,
            ok: true,
            ..Default::default()
        };
        let ev = RankEvent::WorkerResult {
            result,
            arrived_ms: self.clock.now_ms(),
            reply,
        };
        self.sched.dispatch(ev.into()).await;
        tokio::time::timeout(Duration::from_secs(30), answer)
            .await
            .expect("answered once stored")
            .unwrap()
    }

    /// Moves the clock to `at` and runs one tick there.
    async fn tick_at(&mut self, at: u64) {
        self.clock.set(at);
        self.sched.dispatch(Event::Tick).await;
    }
}

impl Scheduler {
    /// Every test's events check that a kept job list still counted as
    /// current lists the jobs as they are (but for a running job's count of
    /// results): a change no one counted would show callers an old list.
    pub(super) fn job_list_is_current_or_not_kept(&self) {
        let Some(kept) = self.job_listing.current(0) else {
            return;
        };
        let uncounted = |mut j: gpuctl_proto::pb::Job| {
            j.results_in = 0;
            j
        };
        let kept: Vec<_> = kept.iter().cloned().map(uncounted).collect();
        let now: Vec<_> = self.list_jobs(0).into_iter().map(uncounted).collect();
        assert_eq!(kept, now, "a job changed uncounted (listing.rs)");
    }
}

fn stress(timeout_ms: u64, hang_timeout_ms: u64) -> JobSpec {
    JobSpec {
        workload: "stress".into(),
        node_count: 1,
        timeout_ms,
        hang_timeout_ms,
        ..Default::default()
    }
}

#[tokio::test]
async fn a_silent_node_is_lost_exactly_after_the_node_timeout() {
    let timeout = Duration::from_secs(15);
    let mut f = Fixture::new(timeout).await;
    f.join("n1").await;
    // A heartbeat five seconds in starts the node's silence again.
    f.clock.advance(Duration::from_secs(5));
    f.beat("n1").await;
    let heard = T0 + 5_000;
    f.tick_at(heard + 15_000).await;
    assert_eq!(
        f.node_state("n1"),
        NodeState::Ready,
        "silent for the timeout exactly"
    );
    f.tick_at(heard + 15_001).await;
    assert_eq!(f.node_state("n1"), NodeState::Lost);
    assert_eq!(
        f.sched.nodes["n1"].node.state_reason,
        "no heartbeat for 15s"
    );
    // Another node that kept beating stays.
    let mut g = Fixture::new(timeout).await;
    g.join("n2").await;
    for s in 1..=40 {
        g.clock.set(T0 + s * 1_000);
        g.beat("n2").await;
        g.sched.dispatch(Event::Tick).await;
    }
    assert_eq!(g.node_state("n2"), NodeState::Ready);
}

#[tokio::test]
async fn a_running_job_fails_once_its_deadline_and_grace_have_passed() {
    let mut f = Fixture::new(Duration::from_secs(3_600)).await;
    f.join("n1").await;
    let id = f.submit(stress(60_000, 0)).await;
    let job = &f.job(&id).job;
    assert_eq!(job.started_unix_ms, T0);
    assert_eq!(f.job(&id).deadline_unix_ms, T0 + 60_000);
    let due = T0 + 60_000 + DEADLINE_GRACE_MS;
    f.tick_at(due).await;
    assert_eq!(f.job(&id).state(), JobState::Running, "at the grace's end");
    f.tick_at(due + 1).await;
    let job = &f.job(&id).job;
    assert_eq!(job.state(), JobState::Failed);
    assert_eq!(job.finished_unix_ms, due + 1);
    assert!(
        job.message
            .starts_with("deadline passed (1m after start); ranks without a result: 0 on n1"),
        "{}",
        job.message
    );
    assert_eq!(f.node_state("n1"), NodeState::Ready, "the node is freed");
}

/// A stress job on one node with hang timeout `hang` (ms), watched from
/// `T0`, where every rank has reported once: the fixture, job and world.
async fn watched_stress(hang: u64) -> (Fixture, String, u32) {
    let mut f = Fixture::new(Duration::from_secs(3_600)).await;
    f.join("n1").await;
    let id = f.submit(stress(3_600_000, hang)).await;
    let world = f.job(&id).world_size();
    assert!(world >= 2, "two ranks on the node's two CPU slots: {world}");
    // The watch starts at the first tick; every rank reports once.
    f.tick_at(T0).await;
    for rank in 0..world {
        f.progress(&id, rank, 1).await;
    }
    (f, id, world)
}

#[tokio::test]
async fn a_rank_without_progress_is_hung_only_after_the_hang_timeout() {
    let hang = 30_000;
    let (mut f, id, world) = watched_stress(hang).await;
    // Ten seconds on, all but the last rank progress again.
    f.clock.set(T0 + 10_000);
    for rank in 0..world - 1 {
        f.progress(&id, rank, 2).await;
    }
    f.tick_at(T0 + hang - 1).await;
    assert_eq!(f.job(&id).state(), JobState::Running, "not yet a timeout");
    assert!(f.job(&id).watch.hung.is_none());
    f.tick_at(T0 + hang).await;
    let e = f.job(&id);
    assert_eq!(e.state(), JobState::Failed);
    assert_eq!(e.watch.hung.as_ref().and_then(|h| h.rank), Some(world - 1));
    assert!(
        e.job.message.contains("no progress for 30s"),
        "{}",
        e.job.message
    );
}

#[tokio::test]
async fn time_rank_reports_wait_for_the_scheduler_is_not_silence() {
    let hang = 30_000;
    let (mut f, id, world) = watched_stress(hang).await;
    // The last rank goes quiet. A report of rank 0 that arrived at 15 s is
    // read at 25 s: the lane lagged 10 s, and may still lag.
    f.clock.set(T0 + 25_000);
    f.progress_arrived(&id, 0, 2, T0 + 15_000).await;
    f.tick_at(T0 + hang).await;
    assert_eq!(f.job(&id).state(), JobState::Running, "15 s heard of 30");
    // A report read on time: the lane keeps up again, and silence counts.
    f.clock.set(T0 + 31_000);
    f.progress(&id, 0, 3).await;
    f.tick_at(T0 + hang + 9_999).await;
    assert_eq!(f.job(&id).state(), JobState::Running, "10 s were deaf");
    f.tick_at(T0 + hang + 10_000).await;
    let e = f.job(&id);
    assert_eq!(e.state(), JobState::Failed);
    assert_eq!(e.watch.hung.as_ref().and_then(|h| h.rank), Some(world - 1));
    assert!(
        e.job.message.contains("no progress for 30s")
            && e.job.message.contains(
                "(not counting 10s during which rank reports waited for the coordinator)"
            ),
        "{}",
        e.job.message
    );
}

#[tokio::test]
async fn a_result_is_taken_for_a_minute_after_its_job_ended_and_not_after() {
    let mut f = Fixture::new(Duration::from_secs(3_600)).await;
    f.join("n1").await;
    let id = f.submit(stress(60_000, 0)).await;
    let ended = T0 + 60_000 + DEADLINE_GRACE_MS + 1;
    f.tick_at(ended).await;
    assert_eq!(f.job(&id).state(), JobState::Failed);
    f.clock.set(ended + 60_000);
    let (taken, why) = f.result(&id, 0).await;
    assert!(taken, "in flight as the job ended: {why}");
    f.clock.set(ended + 60_001);
    let (taken, why) = f.result(&id, 1).await;
    assert!(!taken);
    assert_eq!(
        why,
        format!("job {id} ended 60 s ago: results are taken for 60 s after a job's end")
    );
    // Sent again, it is refused again: not "stored already".
    let (taken, again) = f.result(&id, 1).await;
    assert!(!taken, "{again}");
    assert_eq!(again, why);
    // One stored in time and sent again after is still answered as stored.
    let (taken, why) = f.result(&id, 0).await;
    assert!(taken, "{why}");
}

#[tokio::test]
async fn late_results_rebuild_one_report_at_a_time_and_a_job_not_again_before_its_gap() {
    use super::reports::{refold_gap_ms, STALE_QUIET_MS};
    let mut f = Fixture::new(Duration::from_secs(60)).await;
    // Two ended jobs of 4,096 ranks whose late results stopped coming at T0.
    for id in ["job-000001", "job-000002"] {
        let mut e = JobEntry::default();
        e.job.id = id.into();
        e.job.set_state(JobState::Failed);
        e.job.plan = Some(gpuctl_proto::pb::Plan {
            world_size: 4_096,
            ..Default::default()
        });
        e.stale = Some((T0, T0));
        f.sched.jobs.insert(id.into(), e);
    }
    let quiet = T0 + STALE_QUIET_MS;
    f.clock.set(quiet);
    f.sched.refold_stale();
    assert_eq!(f.sched.refolding.as_deref(), Some("job-000001"));
    assert!(f.job("job-000002").pending.is_none(), "one at a time");
    f.sched.refold_stale();
    assert!(f.job("job-000002").pending.is_none(), "still one at a time");
    // The first comes back (not stored: the stored report stands); the
    // second goes next.
    f.sched.refolded("job-000001".into(), Err(())).await;
    f.sched.refold_stale();
    assert_eq!(f.sched.refolding.as_deref(), Some("job-000002"));
    f.sched.refolded("job-000002".into(), Err(())).await;
    // More late results for the first: not rebuilt before its gap is over.
    f.sched.jobs.get_mut("job-000001").unwrap().stale = Some((quiet, quiet));
    let again = quiet + refold_gap_ms(4_096);
    f.clock.set(again - 1);
    f.sched.refold_stale();
    assert_eq!(f.sched.refolding, None);
    f.clock.set(again);
    f.sched.refold_stale();
    assert_eq!(f.sched.refolding.as_deref(), Some("job-000001"));
}

/// The pace messages a session was sent, in order, as (heartbeat, telemetry) ms.
fn paces(rx: &mut UnboundedReceiver<Box<CoordinatorMessage>>) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    while let Ok(m) = rx.try_recv() {
        if let Some(gpuctl_proto::pb::coordinator_message::Msg::Pace(p)) = m.msg {
            out.push((p.heartbeat_interval_ms, p.telemetry_send_ms));
        }
    }
    out
}

#[tokio::test]
async fn a_growing_fleet_tells_every_session_its_pace_at_each_doubling() {
    let mut f = Fixture::new(Duration::from_secs(60)).await;
    // One message a second for the whole fleet: paced from the second node.
    f.sched.cfg.agent_messages_per_s = 1;
    for n in ["n1", "n2", "n3", "n4"] {
        f.join(n).await;
    }
    let told: Vec<Vec<(u32, u32)>> = f.sessions.iter_mut().map(paces).collect();
    assert_eq!(
        told,
        vec![
            vec![(2_000, 2_000), (4_000, 4_000)],
            vec![(4_000, 4_000)],
            vec![],
            vec![]
        ],
        "n1 hears each change, n3 and n4 heard theirs when they registered"
    );
    // Three nodes round up to four: no change. Two: every session left hears it.
    for name in ["n4", "n3"] {
        let (reply, answer) = oneshot::channel();
        let ev = AgentEvent::RemoveNode {
            name: name.into(),
            reply,
        };
        f.sched.dispatch(ev.into()).await;
        answer.await.unwrap().unwrap();
    }
    let told: Vec<Vec<(u32, u32)>> = f.sessions.iter_mut().map(paces).collect();
    assert_eq!(told[..2], vec![vec![(2_000, 2_000)]; 2]);
}

/// `gpuctl jobs`' list as the scheduler keeps it made: (id, state, results).
fn jobs_kept(f: &Fixture) -> Option<Vec<(String, JobState, u32)>> {
    let kept = f.sched.job_listing.current(f.clock.now_ms())?;
    Some(
        kept.iter()
            .map(|j| (j.id.clone(), j.state(), j.results_in))
            .collect(),
    )
}

#[tokio::test]
async fn the_job_list_is_kept_made_after_each_change_and_while_a_job_runs() {
    let mut f = Fixture::new(Duration::from_secs(3_600)).await;
    f.join("n1").await;
    assert_eq!(jobs_kept(&f), Some(vec![]), "made after the first event");
    // Submitted on the task, before the next event ends: not current.
    let id = f.submit(stress(60_000, 0)).await;
    assert_eq!(jobs_kept(&f), None, "the scheduler answers");
    f.beat("n1").await;
    let running = |results| Some(vec![(id.clone(), JobState::Running, results)]);
    assert_eq!(jobs_kept(&f), running(0));
    // A result is not a listed change: shown once the list is made again.
    f.result(&id, 0).await;
    assert_eq!(jobs_kept(&f), running(0));
    f.clock
        .advance(Duration::from_millis(listing::JOBS.redo_ms));
    f.beat("n1").await;
    assert_eq!(jobs_kept(&f), running(1));
    // Its end is listed by the event that ended it (while someone reads).
    let overdue = T0 + 60_000 + DEADLINE_GRACE_MS + 1;
    f.clock.set(overdue);
    assert_eq!(jobs_kept(&f), None, "older than its results may be");
    f.tick_at(overdue).await;
    let kept = jobs_kept(&f).expect("made by the tick");
    assert_eq!((kept.len(), kept[0].1), (1, JobState::Failed));
    // Nothing moves in a list of ended jobs: it stays made, and current.
    let made = f.sched.job_listing.current(0).unwrap();
    f.clock.advance(Duration::from_secs(60));
    f.beat("n1").await;
    let again = jobs_kept(&f).and(f.sched.job_listing.current(0));
    assert!(
        again.is_some_and(|a| Arc::ptr_eq(&made, &a)),
        "not made again"
    );
}

/// `gpuctl nodes`' brief table, built on the task as a listing asks.
async fn listed(f: &mut Fixture) -> Arc<gpuctl_proto::pb::NodeTable> {
    let (reply, answer) = oneshot::channel();
    let q = Query::ListNodes { brief: true, reply };
    f.sched.dispatch(q.into()).await;
    match answer.await.unwrap() {
        events::Listing::Table(t) => t,
        events::Listing::Nodes(_) => panic!("a brief listing is a table"),
    }
}

#[tokio::test]
async fn the_kept_node_table_is_current_until_a_node_changes_what_it_lists() {
    let mut f = Fixture::new(Duration::from_secs(15)).await;
    f.join("n1").await;
    let built = listed(&mut f).await;
    let kept = f.sched.listing.current(T0).expect("kept once built");
    assert_eq!(kept.row(0).state, NodeState::Ready);
    // A heartbeat alone leaves it current, its column a second old at most.
    f.clock.advance(Duration::from_millis(400));
    f.beat("n1").await;
    assert!(f.sched.listing.current(f.clock.now_ms()).is_some());
    f.clock.advance(Duration::from_millis(600));
    assert!(f.sched.listing.current(f.clock.now_ms()).is_none());
    let heard = listed(&mut f).await.row(0).last_heartbeat_unix_ms;
    assert_eq!((built.row(0).last_heartbeat_unix_ms, heard), (T0, T0 + 400));
    // A job's start is listed at once: the kept table is not current.
    let job = f.submit(stress(60_000, 30_000)).await;
    assert!(f.sched.listing.current(f.clock.now_ms()).is_none());
    let t = listed(&mut f).await;
    assert_eq!(
        (t.row(0).state, t.row(0).job),
        (NodeState::Busy, job.as_str())
    );
    // The node's loss: the tick that lost it made the table again, since
    // people read it.
    f.tick_at(T0 + 400 + 15_001).await;
    let t = f
        .sched
        .listing
        .current(f.clock.now_ms())
        .expect("made again");
    assert_eq!(t.row(0).state, NodeState::Lost);
}

/// A redb store whose commits of a job's record wait while it is closed,
/// or fail while it refuses.
struct Gated {
    inner: RedbStore,
    open: tokio::sync::watch::Sender<bool>,
    refuse: std::sync::atomic::AtomicBool,
}

impl crate::store::Store for Gated {
    fn put_many(
        &self,
        entries: Vec<(String, Vec<u8>)>,
    ) -> futures::future::BoxFuture<'_, crate::store::StoreResult<()>> {
        let job = entries
            .iter()
            .any(|(k, _)| k.starts_with(crate::store::keys::JOBS));
        let refuse = job && self.refuse.load(std::sync::atomic::Ordering::SeqCst);
        let mut open = self.open.subscribe();
        Box::pin(async move {
            if refuse {
                return Err(crate::store::StoreError::Backend("refused".into()));
            }
            if job {
                let _ = open.wait_for(|o| *o).await;
            }
            self.inner.put_many(entries).await
        })
    }
    fn get(
        &self,
        key: String,
    ) -> futures::future::BoxFuture<'_, crate::store::StoreResult<Option<Vec<u8>>>> {
        self.inner.get(key)
    }
    fn delete(
        &self,
        key: String,
    ) -> futures::future::BoxFuture<'_, crate::store::StoreResult<bool>> {
        self.inner.delete(key)
    }
    fn scan_prefix(
        &self,
        prefix: String,
    ) -> futures::future::BoxFuture<'_, crate::store::StoreResult<crate::store::Entries>> {
        self.inner.scan_prefix(prefix)
    }
}

/// A submitted job starts without the scheduler waiting for its record to
/// be committed (behind a big job's telemetry that held it 1.4 s); the
/// submitter is told once the record is committed, and not before. A
/// record that cannot be committed fails the submit and the job.
#[tokio::test]
async fn a_submit_does_not_hold_the_scheduler_while_its_record_is_committed() {
    let dir = tempfile::tempdir().unwrap();
    let gated = Arc::new(Gated {
        inner: RedbStore::open(&dir.path().join("state.redb")).unwrap(),
        open: tokio::sync::watch::Sender::new(true),
        refuse: Default::default(),
    });
    let mut f = Fixture::on(Duration::from_secs(30), gated.clone(), dir).await;
    f.join("a").await;
    f.join("b").await;
    // Made once, before: a job's start reads it.
    f.sched.store.rank_key().await.unwrap();

    gated.open.send_replace(false);
    let (reply, mut answer) = oneshot::channel();
    let plan = f.sched.plan(stress(60_000, 0));
    let planned = JobEvent::Planned { plan, reply };
    tokio::time::timeout(Duration::from_secs(10), f.sched.dispatch(planned.into()))
        .await
        .expect("the scheduler waited for the job's record");
    let id = f.sched.jobs.keys().last().unwrap().clone();
    assert_eq!(f.job(&id).state(), JobState::Running);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        answer.try_recv().is_err(),
        "told before the record is committed"
    );
    gated.open.send_replace(true);
    assert_eq!(answer.await.unwrap().unwrap().id, id);

    gated
        .refuse
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let (reply, answer) = oneshot::channel();
    let plan = f.sched.plan(stress(60_000, 0));
    f.sched
        .dispatch(JobEvent::Planned { plan, reply }.into())
        .await;
    let refused = f.sched.jobs.keys().last().unwrap().clone();
    let e = answer.await.unwrap().unwrap_err().to_string();
    assert!(e.contains("could not store the job"), "{e}");
    // What the scheduler's threads sent back (the jobs' assignments, the
    // failure), handled as the event loop would.
    while f.job(&refused).state() != JobState::Failed {
        let lane = &mut f.sched.lanes.as_mut().unwrap().people.1;
        let ev = tokio::time::timeout(Duration::from_secs(10), lane.recv()).await;
        let ev = ev.expect("the job's failure, sent back").unwrap();
        f.sched.dispatch(ev).await;
    }
    assert!(f
        .job(&refused)
        .job
        .message
        .contains("could not store the job"));
}

// A job's entry (`state`).

fn plan_of(nodes: std::ops::Range<u32>) -> gpuctl_proto::pb::Plan {
    gpuctl_proto::pb::Plan {
        nodes: nodes.map(|i| format!("n{i}")).collect(),
        ..Default::default()
    }
}

#[test]
fn a_plans_nodes_are_known_and_a_new_plan_replaces_them() {
    let mut e = super::state::JobEntry::default();
    assert!(!e.has_node("n1"), "no plan, no node");
    e.set_plan(plan_of(0..40));
    assert!(e.has_node("n0") && e.has_node("n39"));
    assert!(!e.has_node("n40") && !e.has_node("n"));
    e.set_plan(plan_of(100..140));
    assert!(!e.has_node("n0"), "the set of the plan before");
    assert!(e.has_node("n139"));
    e.set_plan(plan_of(0..3));
    assert!(e.has_node("n2") && !e.has_node("n139"));
}

/// A worker that gave up sending its result (`UNDELIVERED_EXIT`) does not
/// end the job as a worker that exited 1 does: it is judged once every
/// other rank reported, without that one.
#[tokio::test]
async fn a_rank_whose_result_did_not_reach_us_leaves_the_job_running_until_the_rest_reported() {
    use gpuctl_core::retry::outage::UNDELIVERED_EXIT;
    let exited = |id: &str, rank: u32, exit_code: i32| RankEvent::WorkerExited {
        node: "n1".into(),
        exited: WorkerExited {
            job_id: id.into(),
            attempt: 1,
            rank,
            exit_code,
            ..Default::default()
        },
    };
    let (mut f, id, world) = watched_stress(120_000).await;
    let last = world - 1;
    f.sched
        .dispatch(exited(&id, last, UNDELIVERED_EXIT).into())
        .await;
    let e = f.job(&id);
    assert_eq!(e.state(), JobState::Running, "{}", e.job.message);
    assert!(e.undelivered.contains(&last) && !e.judging());
    for rank in 0..last {
        let (ok, why) = f.result(&id, rank).await;
        assert!(ok, "{why}");
    }
    assert!(f.job(&id).judging(), "every other rank reported: judged");

    // The same exit with code 1 ends the job at once, naming the rank.
    let (mut f, id, world) = watched_stress(120_000).await;
    f.sched.dispatch(exited(&id, world - 1, 1).into()).await;
    let e = f.job(&id);
    assert_eq!(e.state(), JobState::Failed);
    assert!(
        e.job.message.contains("exited with code 1"),
        "{}",
        e.job.message
    );
}

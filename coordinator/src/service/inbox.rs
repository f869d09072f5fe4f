//! What one agent's session has read and the scheduler has not taken yet.
//!
//! A session is read as its messages come, whether or not the scheduler's
//! fleet lane has room: at thousands of nodes a job's end fills that lane
//! for seconds, and a session that stopped reading meanwhile left its
//! frames in HTTP/2's receive queue, each holding the whole 8 KB read
//! buffer it arrived in (~350 MB at 4,096 nodes, heaptrack). Read here, a
//! message is decoded into a few hundred bytes, and what piles up is kept
//! small: a newer heartbeat replaces one still waiting, telemetry samples
//! join the batch still waiting (the oldest dropped past a bound), and
//! other messages wait in order, up to a bound past which the session
//! stops reading until the scheduler takes some.
//!
//! The telemetry waiting is bounded per session and for all sessions
//! together ([`FLEET_WAITING_SAMPLES`]): at 16,384 nodes a scheduler that
//! fell behind could leave a minute of samples waiting in every session:
//! 480 decoded samples of ~350 bytes (296 in place, the GPU's UUID beside),
//! 2.7 GB, and the coordinator logged "telemetry samples dropped while the
//! scheduler was busy" while its memory grew by gigabytes (issue 51).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use gpuctl_proto::pb::{GpuSample, TelemetryBatch};

use crate::scheduler::{AgentEvent, Event, RankEvent};

/// Messages other than telemetry waiting for the scheduler; past this the
/// session is not read until it takes one.
pub const READ_AHEAD: usize = 64;

/// Telemetry samples waiting for the scheduler: a minute of 8 GPUs at one
/// sample a second. The oldest go first: the job's series keeps buckets,
/// and the newest samples are what `gpuctl watch` shows.
pub const WAITING_SAMPLES: usize = 8 * 60;

/// Sample slots the telemetry waiting in every session together may hold:
/// ~78 MB (a decoded sample is 296 bytes in place), two seconds of a
/// 16,384 × 8 fleet; 512 sessions of 8 GPUs at their own bound hold 262,144,
/// so a fleet that size never meets it. Past it a session keeps only the
/// newest [`FULL_KEEP`] samples it read, so the sessions together hold at
/// most this and [`FULL_KEEP`] each (~78 MB more at 16,384 sessions). The
/// series a job keeps are in buckets of seconds to minutes: a scheduler
/// seconds behind loses samples of a GPU, not what its series says.
pub const FLEET_WAITING_SAMPLES: usize = 1 << 18;

/// Samples a session keeps of the newest batch it read once the fleet's room
/// is taken: two seconds of 8 GPUs. "The newest batch alone" is no bound: a
/// batch is as big as its agent makes it (up to the message limit), and
/// every session may keep one.
pub const FULL_KEEP: usize = 16;

/// Slots an emptied queue keeps; past this it gives its memory back.
const KEPT_SLOTS: usize = 4;

/// Telemetry samples waiting in every session's inbox (shared by the
/// sessions of one coordinator).
#[derive(Clone, Default)]
pub struct Waiting(Arc<AtomicUsize>);

impl Waiting {
    pub fn samples(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// Jobs whose telemetry waits apart in one session. An agent sends a batch
/// per running job each second; while a cancelled job's ranks still run
/// beside the next job's, its batches alternate between two jobs, and with
/// one slot every batch was handed on as an event of its own: 64 a session,
/// 1.5 GB at 16,384 sessions in the heap profile of a 16,384 × 8 run.
pub const JOBS_WAITING: usize = 4;

#[derive(Default)]
pub struct Inbox {
    events: VecDeque<Event>,
    /// One batch per job and attempt, oldest first.
    telemetry: Vec<TelemetryBatch>,
    /// Samples dropped past [`WAITING_SAMPLES`] or [`FLEET_WAITING_SAMPLES`],
    /// for the log.
    pub dropped: u64,
    /// Every session's waiting samples, this one's (`telemetry`) counted in.
    fleet: Waiting,
}

impl Drop for Inbox {
    fn drop(&mut self) {
        self.uncount_telemetry();
    }
}

impl Inbox {
    /// An inbox whose waiting telemetry counts against `fleet`.
    pub fn new(fleet: Waiting) -> Inbox {
        Inbox {
            events: VecDeque::new(),
            telemetry: Vec::new(),
            dropped: 0,
            fleet,
        }
    }

    /// Sample slots the waiting telemetry holds: its capacity, not its
    /// length, since a batch trimmed to its newest samples keeps what it
    /// grew to (counted by length, 1,048,576 samples at 16,384 sessions held
    /// 1.5 GB of the coordinator's heap, not the ~350 MB reckoned).
    fn held(&self) -> usize {
        self.telemetry.iter().map(|t| t.samples.capacity()).sum()
    }

    fn uncount_telemetry(&mut self) {
        self.fleet.0.fetch_sub(self.held(), Ordering::Relaxed);
    }

    /// Moves the fleet's count by what this session holds now against
    /// `before`, what it held when the change began.
    fn recount(&self, before: usize) {
        let after = self.held();
        if after >= before {
            self.fleet.0.fetch_add(after - before, Ordering::Relaxed);
        } else {
            self.fleet.0.fetch_sub(before - after, Ordering::Relaxed);
        }
    }

    /// Whether the session may read another message.
    pub fn has_room(&self) -> bool {
        self.events.len() < READ_AHEAD
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty() && self.telemetry.is_empty()
    }

    /// Queues `ev` behind what waits, a heartbeat in place of one waiting
    /// last (keeping its preflight checks when the newer one has none: an
    /// agent sends them now and then, not every time).
    pub fn push(&mut self, mut ev: Event) {
        if let (
            Event::Agent(AgentEvent::Heartbeat { session, hb, .. }),
            Some(Event::Agent(AgentEvent::Heartbeat {
                session: waiting,
                hb: old,
                ..
            })),
        ) = (&mut ev, self.events.back_mut())
        {
            if session == waiting {
                if hb.preflight.is_empty() {
                    hb.preflight = std::mem::take(&mut old.preflight);
                }
                *self.events.back_mut().expect("a heartbeat waits") = ev;
                return;
            }
        }
        self.events.push_back(ev);
    }

    /// Joins `batch`'s samples to the telemetry of its job and attempt
    /// waiting; a batch of a job with none waiting waits beside the others,
    /// past [`JOBS_WAITING`] the oldest going first as an event.
    pub fn push_telemetry(&mut self, node: &str, batch: TelemetryBatch) {
        let before = self.held();
        let same = |w: &&mut TelemetryBatch| w.job_id == batch.job_id && w.attempt == batch.attempt;
        match self.telemetry.iter_mut().find(same) {
            Some(w) => {
                let added = batch.samples.len();
                let cap = w.samples.capacity();
                // The slots held once `keep` older samples and the batch are
                // in: grown here by doubling, never past the session's bound.
                let slots = |keep: usize| {
                    let need = keep + added;
                    if need <= cap {
                        cap
                    } else {
                        (2 * cap).clamp(need, WAITING_SAMPLES.max(need))
                    }
                };
                let others = self.fleet.samples().saturating_sub(before);
                let mut keep = WAITING_SAMPLES.saturating_sub(added).min(w.samples.len());
                if others + slots(keep) > FLEET_WAITING_SAMPLES {
                    keep = 0;
                }
                let over = w.samples.len() - keep;
                self.dropped += over as u64;
                if keep == 0 {
                    // The newest of the batch alone, in an allocation of
                    // its own: the one that held the older samples goes.
                    let mut batch = batch;
                    self.dropped += newest(&mut batch.samples) as u64;
                    *w = batch;
                } else {
                    w.samples.drain(..over);
                    let want = slots(keep);
                    if want > w.samples.capacity() {
                        w.samples.reserve_exact(want - keep);
                    }
                    w.samples.extend(batch.samples);
                }
            }
            None => {
                let mut batch = batch;
                let others = self.fleet.samples().saturating_sub(before);
                if others + batch.samples.capacity() > FLEET_WAITING_SAMPLES {
                    self.dropped += newest(&mut batch.samples) as u64;
                }
                if self.telemetry.len() == JOBS_WAITING {
                    // Handed on as an event: the read-ahead bounds it.
                    let old = self.telemetry.remove(0);
                    self.events.push_back(
                        RankEvent::Telemetry {
                            node: node.to_string(),
                            batch: old,
                        }
                        .into(),
                    );
                }
                self.telemetry.push(batch);
            }
        }
        self.recount(before);
    }

    /// The next event for the scheduler: messages in the order they came,
    /// then the telemetry waiting.
    pub fn pop(&mut self, node: &str) -> Option<Event> {
        let ev = self.events.pop_front();
        if self.events.is_empty() && self.events.capacity() > KEPT_SLOTS {
            // Grown in a burst (a job's end): each of thousands of sessions
            // kept ~2.4 KB for the next one.
            self.events = VecDeque::new();
        }
        ev.or_else(|| {
            if self.telemetry.is_empty() {
                return None;
            }
            let before = self.held();
            let batch = self.telemetry.remove(0);
            self.recount(before);
            if self.telemetry.is_empty() {
                self.telemetry = Vec::new();
            }
            Some(
                RankEvent::Telemetry {
                    node: node.to_string(),
                    batch,
                }
                .into(),
            )
        })
    }
}

/// Cuts `samples` to its newest [`FULL_KEEP`] in a buffer of that size
/// (`drain` would keep the whole allocation; `split_off` copies what it
/// keeps into one of its own); returns how many went.
fn newest(samples: &mut Vec<GpuSample>) -> usize {
    let over = samples.len().saturating_sub(FULL_KEEP);
    if over > 0 || samples.capacity() > FULL_KEEP {
        *samples = samples.split_off(over);
    }
    over
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb::{AssignmentAck, Heartbeat};

    fn hb(session: u64, seq: u64) -> Event {
        AgentEvent::Heartbeat {
            node: "n".into(),
            session,
            hb: Heartbeat {
                unix_ms: seq,
                ..Default::default()
            },
        }
        .into()
    }

    fn batch(job: &str, from: u64, n: u64) -> TelemetryBatch {
        TelemetryBatch {
            job_id: job.into(),
            attempt: 1,
            samples: (from..from + n)
                .map(|unix_ms| GpuSample {
                    unix_ms,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn ack() -> Event {
        AgentEvent::AssignmentAck {
            node: "n".into(),
            ack: AssignmentAck::default(),
        }
        .into()
    }

    #[test]
    fn a_newer_heartbeat_replaces_the_last_one_waiting_only() {
        let mut inbox = Inbox::default();
        inbox.push(hb(1, 1));
        inbox.push(hb(1, 2));
        inbox.push(ack());
        inbox.push(hb(1, 3));
        let mut order = Vec::new();
        while let Some(ev) = inbox.pop("n") {
            order.push(match ev {
                Event::Agent(AgentEvent::Heartbeat { hb, .. }) => format!("hb{}", hb.unix_ms),
                other => other.name().to_string(),
            });
        }
        assert_eq!(order, ["hb2", "AssignmentAck", "hb3"]);
    }

    #[test]
    fn a_replaced_heartbeat_hands_on_its_preflight() {
        let mut inbox = Inbox::default();
        let Event::Agent(AgentEvent::Heartbeat {
            node,
            session,
            hb: mut first,
        }) = hb(1, 1)
        else {
            unreachable!()
        };
        first.preflight.push(Default::default());
        inbox.push(
            AgentEvent::Heartbeat {
                node,
                session,
                hb: first,
            }
            .into(),
        );
        inbox.push(hb(1, 2));
        let Some(Event::Agent(AgentEvent::Heartbeat { hb, .. })) = inbox.pop("n") else {
            panic!("a heartbeat waits");
        };
        assert_eq!((hb.unix_ms, hb.preflight.len()), (2, 1));
    }

    #[test]
    fn telemetry_joins_up_to_a_bound_and_a_new_job_goes_after_the_old() {
        let mut inbox = Inbox::default();
        inbox.push_telemetry("n", batch("a", 0, 300));
        inbox.push_telemetry("n", batch("a", 300, 300));
        assert_eq!(inbox.dropped, 600 - WAITING_SAMPLES as u64);
        inbox.push_telemetry("n", batch("b", 0, 8));
        let Some(Event::Rank(RankEvent::Telemetry { batch: a, .. })) = inbox.pop("n") else {
            panic!("job a's telemetry first");
        };
        assert_eq!(a.samples.len(), WAITING_SAMPLES);
        assert_eq!(a.samples.last().unwrap().unix_ms, 599, "the newest kept");
        let Some(Event::Rank(RankEvent::Telemetry { batch: b, .. })) = inbox.pop("n") else {
            panic!("then job b's");
        };
        assert_eq!((b.job_id.as_str(), b.samples.len()), ("b", 8));
        assert!(inbox.pop("n").is_none() && inbox.is_empty());
    }

    #[test]
    fn the_sessions_together_keep_at_most_the_fleets_room_and_a_batch_each() {
        let fleet = Waiting::default();
        let sessions = FLEET_WAITING_SAMPLES / WAITING_SAMPLES + 10;
        let mut inboxes: Vec<Inbox> = (0..sessions).map(|_| Inbox::new(fleet.clone())).collect();
        // A scheduler far behind: each session reads a minute of 8 GPUs.
        for second in 0..60 {
            for inbox in &mut inboxes {
                inbox.push_telemetry("n", batch("a", second * 8, 8));
            }
        }
        assert!(
            fleet.samples() <= FLEET_WAITING_SAMPLES + 8 * sessions,
            "{} waiting",
            fleet.samples()
        );
        let dropped: u64 = inboxes.iter().map(|i| i.dropped).sum();
        let waiting: usize = inboxes
            .iter()
            .map(|i| i.telemetry.iter().map(|t| t.samples.len()).sum::<usize>())
            .sum();
        assert_eq!(waiting as u64 + dropped, 60 * 8 * sessions as u64);
        // Counted by the slots held, which is what memory holds.
        let slots: usize = inboxes.iter().map(Inbox::held).sum();
        assert_eq!(fleet.samples(), slots);
        // What a session hands on is the newest it read; taken, it no
        // longer counts, nor what goes with its session.
        let before = fleet.samples();
        let Some(Event::Rank(RankEvent::Telemetry { batch, .. })) = inboxes[sessions - 1].pop("n")
        else {
            panic!("telemetry waits");
        };
        assert_eq!(batch.samples.last().unwrap().unix_ms, 60 * 8 - 1);
        assert_eq!(fleet.samples(), before - batch.samples.capacity());
        inboxes.clear();
        assert_eq!(fleet.samples(), 0);
    }

    #[test]
    fn a_session_cut_to_its_newest_batch_gives_back_what_it_grew_to() {
        let fleet = Waiting::default();
        let mut full = Inbox::new(fleet.clone());
        full.push_telemetry("n", batch("a", 0, FLEET_WAITING_SAMPLES as u64 - 1000));
        let mut grown = Inbox::new(fleet.clone());
        for second in 0..40 {
            grown.push_telemetry("n", batch("a", second * 8, 8));
        }
        // 320 samples, in slots grown by doubling up to the session's bound.
        assert_eq!(grown.held(), WAITING_SAMPLES);
        assert_eq!(grown.dropped, 0);
        // Other sessions take the fleet's last room: the next batch
        // alone stays, and the slots that held the older samples go.
        let others: Vec<Inbox> = (0..66)
            .map(|_| {
                let mut i = Inbox::new(fleet.clone());
                i.push_telemetry("n", batch("a", 0, 8));
                i
            })
            .collect();
        assert_eq!(fleet.samples(), FLEET_WAITING_SAMPLES + 8);
        grown.push_telemetry("n", batch("a", 320, 8));
        assert_eq!((grown.held(), grown.dropped), (8, 320));
        let rest: usize = others.iter().map(Inbox::held).sum();
        assert_eq!(fleet.samples(), full.held() + rest + 8);
    }

    #[test]
    fn a_big_batch_past_the_fleets_room_keeps_only_its_newest() {
        let fleet = Waiting::default();
        let mut full = Inbox::new(fleet.clone());
        full.push_telemetry("n", batch("a", 0, FLEET_WAITING_SAMPLES as u64));
        // A minute in one batch, as a session's first and as a later one.
        let mut late = Inbox::new(fleet.clone());
        late.push_telemetry("n", batch("a", 0, 480));
        assert_eq!(
            (late.held(), late.dropped),
            (FULL_KEEP, 480 - FULL_KEEP as u64)
        );
        late.push_telemetry("n", batch("a", 480, 480));
        assert_eq!(late.held(), FULL_KEEP);
        let Some(Event::Rank(RankEvent::Telemetry { batch: kept, .. })) = late.pop("n") else {
            panic!("telemetry waits");
        };
        assert_eq!(
            kept.samples.first().unwrap().unix_ms,
            960 - FULL_KEEP as u64
        );
        assert_eq!(fleet.samples(), full.held());
        // A short batch in a big buffer gives the buffer's slack back too.
        let mut roomy = batch("a", 0, 8);
        roomy.samples.reserve_exact(472);
        let mut small = Inbox::new(fleet.clone());
        small.push_telemetry("n", roomy);
        assert_eq!((small.held(), small.dropped), (8, 0));
        assert_eq!(fleet.samples(), full.held() + 8);
    }

    #[test]
    fn two_jobs_alternating_wait_apart_and_take_no_read_ahead() {
        let mut inbox = Inbox::default();
        for second in 0..100 {
            inbox.push_telemetry("n", batch("old", second, 8));
            inbox.push_telemetry("n", batch("new", second, 8));
        }
        assert!(inbox.has_room() && inbox.events.is_empty());
        let mut jobs = Vec::new();
        while let Some(Event::Rank(RankEvent::Telemetry { batch, .. })) = inbox.pop("n") {
            jobs.push((batch.job_id, batch.samples.len()));
        }
        assert_eq!(
            jobs,
            [
                ("old".into(), WAITING_SAMPLES),
                ("new".into(), WAITING_SAMPLES)
            ]
        );
        // A fifth job hands the oldest on as an event.
        for job in ["a", "b", "c", "d", "e"] {
            inbox.push_telemetry("n", batch(job, 0, 8));
        }
        assert_eq!(inbox.events.len(), 1);
    }

    #[test]
    fn room_runs_out_at_the_read_ahead() {
        let mut inbox = Inbox::default();
        for _ in 0..READ_AHEAD {
            assert!(inbox.has_room());
            inbox.push(ack());
        }
        assert!(!inbox.has_room());
        // Telemetry never takes room of its own.
        inbox.push_telemetry("n", batch("a", 0, 8));
        assert!(!inbox.has_room());
    }
}

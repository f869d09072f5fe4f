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

use gpuctl_proto::pb::TelemetryBatch;

use crate::scheduler::{AgentEvent, Event, RankEvent};

/// Messages other than telemetry waiting for the scheduler; past this the
/// session is not read until it takes one.
pub const READ_AHEAD: usize = 64;

/// Telemetry samples waiting for the scheduler: a minute of 8 GPUs at one
/// sample a second. The oldest go first: the job's series keeps buckets,
/// and the newest samples are what `gpuctl watch` shows.
pub const WAITING_SAMPLES: usize = 8 * 60;

/// Telemetry samples waiting in every session together: ~350 MB, eight
/// seconds of a 16,384 × 8 fleet; 2,048 sessions of 8 GPUs at their own
/// bound hold 983,040, so a fleet that size never meets it. Past it a session
/// keeps only the newest batch it read, so the sessions together hold at
/// most this and one batch each.
pub const FLEET_WAITING_SAMPLES: usize = 1 << 20;

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

#[derive(Default)]
pub struct Inbox {
    events: VecDeque<Event>,
    telemetry: Option<TelemetryBatch>,
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
            telemetry: None,
            dropped: 0,
            fleet,
        }
    }

    fn uncount_telemetry(&mut self) {
        let n = self.telemetry.as_ref().map_or(0, |t| t.samples.len());
        self.fleet.0.fetch_sub(n, Ordering::Relaxed);
    }

    /// Whether the session may read another message.
    pub fn has_room(&self) -> bool {
        self.events.len() < READ_AHEAD
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty() && self.telemetry.is_none()
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

    /// Joins `batch`'s samples to the telemetry waiting, when it is of the
    /// same job and attempt; a batch of another goes first, as an event.
    pub fn push_telemetry(&mut self, node: &str, batch: TelemetryBatch) {
        let added = batch.samples.len();
        let fleet = self.fleet.0.fetch_add(added, Ordering::Relaxed) + added;
        match self.telemetry.as_mut() {
            Some(w) if w.job_id == batch.job_id && w.attempt == batch.attempt => {
                w.samples.extend(batch.samples);
                let mut over = w.samples.len().saturating_sub(WAITING_SAMPLES);
                if fleet > FLEET_WAITING_SAMPLES {
                    // The fleet's room is taken: the newest batch only.
                    over = over.max(w.samples.len() - added);
                }
                if over > 0 {
                    w.samples.drain(..over);
                    self.dropped += over as u64;
                    self.fleet.0.fetch_sub(over, Ordering::Relaxed);
                }
            }
            _ => {
                self.uncount_telemetry();
                if let Some(old) = self.telemetry.replace(batch) {
                    self.events.push_back(
                        RankEvent::Telemetry {
                            node: node.to_string(),
                            batch: old,
                        }
                        .into(),
                    );
                }
            }
        }
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
            self.uncount_telemetry();
            self.telemetry.take().map(|batch| {
                RankEvent::Telemetry {
                    node: node.to_string(),
                    batch,
                }
                .into()
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb::{AssignmentAck, GpuSample, Heartbeat};

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
        assert_eq!(fleet.samples() as u64 + dropped, 60 * 8 * sessions as u64);
        // What a session hands on is the newest it read; taken, it no
        // longer counts, nor what goes with its session.
        let before = fleet.samples();
        let Some(Event::Rank(RankEvent::Telemetry { batch, .. })) = inboxes[sessions - 1].pop("n")
        else {
            panic!("telemetry waits");
        };
        assert_eq!(batch.samples.last().unwrap().unix_ms, 60 * 8 - 1);
        assert_eq!(fleet.samples(), before - batch.samples.len());
        inboxes.clear();
        assert_eq!(fleet.samples(), 0);
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

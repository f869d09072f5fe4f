//! The gate's queue: a free permit goes to the waiting call whose rank's
//! result arrived *first*, not to the call that came first. A result's call
//! that waited past its timeout is sent again; in a first-come queue it
//! waited at the back, again and again, while 131,072 results took ~100 s
//! to go through, until its rank gave up (issue 51, r17: four of five short
//! jobs failed so). Here it comes back to the place it had.
//!
//! Ranks are told apart by their secret (one per rank and job attempt),
//! hashed; what is remembered is bounded ([`REMEMBERED`], oldest forgotten
//! first), so a node sending made-up secrets can at worst make the queue
//! first-come again. A call without a secret is placed at its arrival.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;
use tokio::time::Instant;

/// Ranks whose first arrival is kept: a job of 131,072 ranks twice over.
pub const REMEMBERED: usize = 1 << 18;

/// Permits handed out in the order of each rank's first arrival.
pub struct Places {
    state: Mutex<State>,
    hasher: RandomState,
}

struct State {
    free: usize,
    seq: u64,
    /// Calls waiting, by (their rank's first arrival, order of asking).
    waiting: BTreeMap<(Instant, u64), oneshot::Sender<()>>,
    first: HashMap<u64, Instant>,
    /// Keys of `first`, oldest first, to forget past the bound.
    remembered: VecDeque<u64>,
}

impl State {
    fn first_arrival(&mut self, key: Option<u64>, now: Instant) -> Instant {
        let Some(key) = key else { return now };
        if let Some(t) = self.first.get(&key) {
            return *t;
        }
        if self.remembered.len() >= REMEMBERED {
            if let Some(old) = self.remembered.pop_front() {
                self.first.remove(&old);
            }
        }
        self.first.insert(key, now);
        self.remembered.push_back(key);
        now
    }

    /// A permit came back: to the first waiting call still there, else free.
    fn release(&mut self) {
        while let Some((_, handed)) = self.waiting.pop_first() {
            if handed.send(()).is_ok() {
                return;
            }
        }
        self.free += 1;
    }
}

/// Held while a call is inside the gate.
pub struct Permit(Arc<Places>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.lock().release();
    }
}

/// A call waiting for a permit; dropped before it has one (its caller gave
/// up), it leaves the queue, or hands on a permit it was given meanwhile.
struct Waiting {
    places: Arc<Places>,
    slot: (Instant, u64),
    done: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut s = self.places.lock();
        if s.waiting.remove(&self.slot).is_none() {
            s.release();
        }
    }
}

impl Places {
    pub fn new(permits: usize) -> Arc<Places> {
        Arc::new(Places {
            state: Mutex::new(State {
                free: permits,
                seq: 0,
                waiting: BTreeMap::new(),
                first: HashMap::new(),
                remembered: VecDeque::new(),
            }),
            hasher: RandomState::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a permit in the place of `rank`'s first arrival; returns it
    /// with that arrival.
    #[cfg(test)]
    pub async fn acquire(self: &Arc<Self>, rank: Option<&[u8]>) -> (Permit, Instant) {
        match self.enter(rank) {
            Entry::In(permit, first) => (permit, first),
            Entry::Queued(queued) => queued.wait().await,
        }
    }

    /// A permit now if one is free, else a place in the queue at `rank`'s
    /// first arrival: apart from the wait, so that a call can put what it
    /// holds in a smaller form only when it is going to wait.
    pub fn enter(self: &Arc<Self>, rank: Option<&[u8]>) -> Entry {
        let key = rank.map(|r| self.hasher.hash_one(r));
        let mut s = self.lock();
        let first = s.first_arrival(key, Instant::now());
        // Free permits mean nobody waits: `release` hands them on first.
        if s.free > 0 {
            s.free -= 1;
            return Entry::In(Permit(self.clone()), first);
        }
        s.seq += 1;
        let slot = (first, s.seq);
        let (tx, rx) = oneshot::channel();
        s.waiting.insert(slot, tx);
        let waiting = Waiting {
            places: self.clone(),
            slot,
            done: false,
        };
        Entry::Queued(Queued {
            waiting,
            handed: rx,
            first,
        })
    }
}

/// What [`Places::enter`] gives.
pub enum Entry {
    /// A permit was free, with the rank's first arrival.
    In(Permit, Instant),
    /// In the queue: [`Queued::wait`] for the permit.
    Queued(Queued),
}

/// A place in the queue; dropped, it leaves it (or hands on a permit it
/// was given meanwhile).
pub struct Queued {
    waiting: Waiting,
    handed: oneshot::Receiver<()>,
    first: Instant,
}

impl Queued {
    /// The permit once its turn comes, with the rank's first arrival.
    pub async fn wait(mut self) -> (Permit, Instant) {
        // The sender is only ever consumed by sending.
        let _ = (&mut self.handed).await;
        self.waiting.done = true;
        (Permit(self.waiting.places.clone()), self.first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_call_sent_again_gets_the_place_its_rank_first_had() {
        let places = Places::new(1);
        let (held, _) = places.acquire(Some(b"r0")).await;
        let t0 = Instant::now();
        // r1 waits, gives up, and is sent again after r2..r4 queued.
        let gave_up = tokio::time::timeout(Duration::from_millis(10), places.acquire(Some(b"r1")));
        assert!(gave_up.await.is_err());
        tokio::time::advance(Duration::from_millis(5)).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut calls = Vec::new();
        for r in [b"r2", b"r3", b"r4", b"r1"] {
            let (p, o) = (places.clone(), order.clone());
            calls.push(tokio::spawn(async move {
                let (permit, first) = p.acquire(Some(r)).await;
                o.lock().unwrap().push((r[1] - b'0', first));
                tokio::time::sleep(Duration::from_millis(1)).await;
                drop(permit);
            }));
            tokio::task::yield_now().await;
        }
        drop(held);
        for c in calls {
            c.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        let ranks: Vec<u8> = order.iter().map(|(r, _)| *r).collect();
        assert_eq!(ranks, vec![1, 2, 3, 4]);
        // r1 is dated from its first try.
        assert_eq!(order[0].1, t0);
        assert!(order[1].1 > t0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_permit_handed_to_a_call_that_gave_up_is_not_lost() {
        let places = Places::new(1);
        let (held, _) = places.acquire(None).await;
        let mut waiter = Box::pin(places.acquire(None));
        assert!(futures::poll!(&mut waiter).is_pending());
        // Handed on to the waiter, which is dropped before it looks.
        drop(held);
        drop(waiter);
        let got = tokio::time::timeout(Duration::from_millis(1), places.acquire(None)).await;
        assert!(
            got.is_ok(),
            "the permit was lost with the call that gave up"
        );
        assert_eq!(places.lock().free, 0);
        drop(got);
        assert_eq!(places.lock().free, 1);
    }

    #[test]
    fn first_arrivals_are_bounded_oldest_forgotten_first() {
        let places = Places::new(1);
        let mut s = places.lock();
        let t0 = Instant::now();
        for k in 0..REMEMBERED as u64 + 1 {
            s.first_arrival(Some(k), t0 + Duration::from_millis(k));
        }
        assert_eq!(s.first.len(), REMEMBERED);
        let later = t0 + Duration::from_secs(1_000);
        assert_eq!(s.first_arrival(Some(0), later), later);
        assert_eq!(
            s.first_arrival(Some(2), later),
            t0 + Duration::from_millis(2)
        );
    }
}

//! The side stream of [`super::nccl::NcclComm`]: a second CUDA stream on which
//! collectives run beside libtorch's compute, and the CUDA events that order
//! the two streams and time them.
//!
//! The compute stream is the legacy null stream that libtorch computes on
//! (DESIGN.md). The side stream is made `CU_STREAM_NON_BLOCKING`: a blocking
//! stream would be implicitly synchronised with the null stream and nothing
//! would overlap. Ordering between the two is therefore explicit, by events:
//!
//! * `begin`: event F on null, side waits for F, timing event S on side;
//! * `end`: timing event E on side; the ticket names E;
//! * `wait(ticket)`: event A on null, null waits for E, event B on null.
//!
//! Busy time is Σ (E − S) over the groups (groups queued back to back start
//! when the one before ends, so nothing is counted twice); stall time is
//! Σ (B − A), how long compute stood waiting for communication.
//!
//! Events come from a pool and are reused only once all of them completed:
//! after `times` (which the caller reads after synchronising) or after a fold,
//! which synchronises the device itself when more than [`POOL_MAX`] events are
//! in use, so memory stays bounded on a caller that never reads the times.
//! The bookkeeping ([`Ledger`]) is plain data, tested without a GPU.

use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use cudarc::driver::result::{ctx, event, stream};
use cudarc::driver::{sys, CudaContext, DriverError};

use super::{SideTimes, Ticket};

/// Events in use past which the device is synchronised and the pool folded.
pub(super) const POOL_MAX: usize = 65536;

/// Which events (pool indices) stand for what, and which tickets are alive.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    /// Events `0..used` of the pool are recorded and not yet recycled.
    used: usize,
    /// The start event of the side group now open.
    open: Option<usize>,
    /// (start, end) of every side group since the last fold.
    groups: Vec<(usize, usize)>,
    /// (A, B) of every wait since the last fold.
    stalls: Vec<(usize, usize)>,
    /// Tickets handed out so far (the n-th ticket is `Ticket(n)`, from 1).
    seq: u64,
    /// Tickets up to this one were handed out before the last `times`.
    times_base: u64,
    /// Tickets up to this one completed in a fold (waiting is a no-op).
    fold_base: u64,
    /// End events of tickets `fold_base+1 ..= seq`.
    tickets: Vec<usize>,
    busy_ms: f64,
    stalled_ms: f64,
}

/// Where a ticket stands.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Pending {
    /// Still to wait for: its end event.
    Event(usize),
    /// Known complete (the device was synchronised in a fold since).
    Done,
}

impl Ledger {
    fn take(&mut self) -> usize {
        self.used += 1;
        self.used - 1
    }

    /// Events in use.
    pub fn used(&self) -> usize {
        self.used
    }

    /// Opens a side group: (fork event for null, start event for side).
    pub fn begin(&mut self) -> Result<(usize, usize)> {
        if self.open.is_some() {
            bail!("side_begin while a side group is open (side_begin without side_end)");
        }
        let fork = self.take();
        let start = self.take();
        self.open = Some(start);
        Ok((fork, start))
    }

    /// One more fork event inside the open group (side waits again for null:
    /// for work that compute queued after `begin`, such as a copy of an input).
    pub fn fork(&mut self) -> Result<usize> {
        if self.open.is_none() {
            bail!("internal: a fork of the side stream outside a side group");
        }
        Ok(self.take())
    }

    /// Closes the open group: its end event and the ticket naming it.
    pub fn end(&mut self) -> Result<(usize, Ticket)> {
        let Some(start) = self.open.take() else {
            bail!("side_end without side_begin");
        };
        let end = self.take();
        self.groups.push((start, end));
        self.seq += 1;
        self.tickets.push(end);
        Ok((end, Ticket(self.seq)))
    }

    /// What waiting for `t` means now.
    pub fn ticket(&self, t: Ticket) -> Result<Pending> {
        let n = t.0;
        if n == 0 || n > self.seq {
            bail!(
                "side_wait for unknown ticket {n}: {} ticket(s) were handed out by side_end",
                self.seq
            );
        }
        if n <= self.times_base {
            bail!(
                "side_wait for stale ticket {n}: its events were recycled by side_times (tickets from {} on are alive)",
                self.times_base + 1
            );
        }
        if n <= self.fold_base {
            return Ok(Pending::Done);
        }
        Ok(Pending::Event(
            self.tickets[(n - self.fold_base - 1) as usize],
        ))
    }

    /// A wait of compute: (A, B) events for null.
    pub fn stall(&mut self) -> (usize, usize) {
        let ab = (self.take(), self.take());
        self.stalls.push(ab);
        ab
    }

    /// Whether the pool should be folded before taking more events.
    pub fn needs_fold(&self) -> bool {
        self.open.is_none() && self.used >= POOL_MAX
    }

    /// Adds up every group's and wait's time (`elapsed(a, b)` in ms, called
    /// only once every event completed) and frees every event. Tickets handed
    /// out so far count as complete from now on.
    pub fn fold(&mut self, mut elapsed: impl FnMut(usize, usize) -> Result<f64>) -> Result<()> {
        if self.open.is_some() {
            bail!("internal: folding the side-stream events while a side group is open");
        }
        for &(s, e) in &self.groups {
            self.busy_ms += elapsed(s, e)?;
        }
        for &(a, b) in &self.stalls {
            self.stalled_ms += elapsed(a, b)?;
        }
        self.groups.clear();
        self.stalls.clear();
        self.tickets.clear();
        self.used = 0;
        self.fold_base = self.seq;
        Ok(())
    }

    /// The times since the last call; every ticket handed out so far is stale after.
    pub fn times(&mut self, elapsed: impl FnMut(usize, usize) -> Result<f64>) -> Result<SideTimes> {
        if self.open.is_some() {
            bail!("side_times while a side group is open (side_begin without side_end)");
        }
        self.fold(elapsed)?;
        let t = SideTimes {
            busy_s: self.busy_ms / 1e3,
            stalled_s: self.stalled_ms / 1e3,
        };
        self.busy_ms = 0.0;
        self.stalled_ms = 0.0;
        self.times_base = self.seq;
        Ok(t)
    }
}

fn cu(what: &str, e: DriverError) -> anyhow::Error {
    anyhow!("{what} failed: {e}")
}

/// The null (legacy default) stream libtorch computes on.
fn null() -> sys::CUstream {
    std::ptr::null_mut()
}

/// The side stream and its events, in the CUDA context of one communicator.
pub(super) struct SideStream {
    ctx: Arc<CudaContext>,
    stream: sys::CUstream,
    /// The pool: created on demand, never destroyed before drop.
    events: Vec<sys::CUevent>,
    ledger: Ledger,
}

impl SideStream {
    /// Creates the stream in `ctx` (made current on this thread).
    pub fn new(ctx: Arc<CudaContext>) -> Result<Self> {
        ctx.bind_to_thread()
            .map_err(|e| cu("binding the CUDA context for the side stream", e))?;
        let stream = stream::create(stream::StreamKind::NonBlocking)
            .map_err(|e| cu("cuStreamCreate (non-blocking) for the side stream", e))?;
        Ok(Self {
            ctx,
            stream,
            events: Vec::new(),
            ledger: Ledger::default(),
        })
    }

    /// The raw stream, for NCCL calls.
    pub fn raw(&self) -> sys::CUstream {
        self.stream
    }

    fn event(&mut self, i: usize) -> Result<sys::CUevent> {
        while self.events.len() <= i {
            // Timing on: every event may be one end of an elapsed time.
            let e = event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
                .map_err(|e| cu("cuEventCreate for the side stream", e))?;
            self.events.push(e);
        }
        Ok(self.events[i])
    }

    fn record(&mut self, i: usize, on: sys::CUstream, what: &str) -> Result<()> {
        let ev = self.event(i)?;
        // SAFETY: an event of the pool and a live stream (ours or null) of
        // the context current on this thread.
        unsafe { event::record(ev, on) }.map_err(|e| cu(what, e))
    }

    fn wait_on(&mut self, on: sys::CUstream, i: usize, what: &str) -> Result<()> {
        let ev = self.event(i)?;
        // SAFETY: as in `record`; the event was recorded before.
        unsafe { stream::wait_event(on, ev, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) }
            .map_err(|e| cu(what, e))
    }

    fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| cu("binding the CUDA context for the side stream", e))
    }

    /// Side waits for everything queued on null so far; the group's timing starts.
    pub fn begin(&mut self) -> Result<()> {
        self.bind()?;
        if self.ledger.needs_fold() {
            // Nobody read the times for a long while: wait for the device so
            // the events can be reused, keeping what they measured.
            ctx::synchronize()
                .map_err(|e| cu("cuCtxSynchronize (recycling the side-stream events)", e))?;
            self.fold()?;
        }
        let (fork, start) = self.ledger.begin()?;
        self.record(
            fork,
            null(),
            "cuEventRecord on the compute stream (side_begin)",
        )?;
        let side = self.stream;
        self.wait_on(side, fork, "cuStreamWaitEvent for the side stream")?;
        self.record(start, side, "cuEventRecord on the side stream (side_begin)")
    }

    /// Inside a group: side waits again for what null queued since `begin`.
    pub fn follow_compute(&mut self) -> Result<()> {
        let fork = self.ledger.fork()?;
        self.record(
            fork,
            null(),
            "cuEventRecord on the compute stream (side fork)",
        )?;
        let side = self.stream;
        self.wait_on(side, fork, "cuStreamWaitEvent for the side stream")
    }

    /// Ends the group's timing; the ticket stands for the side work so far.
    pub fn end(&mut self) -> Result<Ticket> {
        self.bind()?;
        let (end, ticket) = self.ledger.end()?;
        let side = self.stream;
        self.record(end, side, "cuEventRecord on the side stream (side_end)")?;
        Ok(ticket)
    }

    /// Compute waits for `ticket`, timed by events on both sides of the wait.
    pub fn wait(&mut self, ticket: Ticket) -> Result<()> {
        self.bind()?;
        let end = match self.ledger.ticket(ticket)? {
            Pending::Done => return Ok(()),
            Pending::Event(end) => end,
        };
        let (a, b) = self.ledger.stall();
        self.record(a, null(), "cuEventRecord on the compute stream (side_wait)")?;
        self.wait_on(
            null(),
            end,
            &format!(
                "cuStreamWaitEvent of the compute stream for ticket {}",
                ticket.0
            ),
        )?;
        self.record(b, null(), "cuEventRecord on the compute stream (side_wait)")
    }

    fn elapsed_ms(events: &[sys::CUevent], a: usize, b: usize) -> Result<f64> {
        // SAFETY: recorded events of the pool, complete (`settle` ran first).
        unsafe { event::elapsed(events[a], events[b]) }
            .map(f64::from)
            .map_err(|e| cu("cuEventElapsedTime (side-stream times)", e))
    }

    /// Every event in use complete (a no-op after the caller's synchronize).
    fn settle(&self) -> Result<()> {
        for &ev in &self.events[..self.ledger.used().min(self.events.len())] {
            // SAFETY: a recorded event of the pool.
            unsafe { event::synchronize(ev) }
                .map_err(|e| cu("cuEventSynchronize (recycling the side-stream events)", e))?;
        }
        Ok(())
    }

    fn fold(&mut self) -> Result<()> {
        self.settle()?;
        let events = &self.events;
        self.ledger.fold(|a, b| Self::elapsed_ms(events, a, b))
    }

    /// Busy and stall time since the last call; recycles every event.
    pub fn times(&mut self) -> Result<SideTimes> {
        self.bind()?;
        // With a group open this fails and recycles nothing.
        self.settle()?;
        let events = &self.events;
        self.ledger.times(|a, b| Self::elapsed_ms(events, a, b))
    }
}

impl Drop for SideStream {
    fn drop(&mut self) {
        // Work still queued finishes first; the driver frees the resources then.
        let _ = self.ctx.bind_to_thread();
        // SAFETY: our events and stream, used by nobody after this.
        unsafe {
            for &ev in &self.events {
                let _ = event::destroy(ev);
            }
            let _ = stream::destroy(self.stream);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(a: usize, b: usize) -> Result<f64> {
        // A made-up clock: event i completes at i milliseconds.
        Ok((b - a) as f64)
    }

    #[test]
    fn groups_and_waits_add_up_and_recycle_the_events() {
        let mut l = Ledger::default();
        assert_eq!(l.begin().unwrap(), (0, 1));
        let f = l.fork().unwrap();
        assert_eq!(f, 2);
        let (e, t1) = l.end().unwrap();
        assert_eq!((e, t1), (3, Ticket(1)));
        assert_eq!(l.ticket(t1).unwrap(), Pending::Event(3));
        assert_eq!(l.stall(), (4, 5));
        l.begin().unwrap();
        let (_, t2) = l.end().unwrap();
        assert_eq!(t2, Ticket(2));
        assert_eq!(l.stall(), (9, 10));
        assert_eq!(l.used(), 11);
        // Busy: (3−1) + (8−7); stalled: (5−4) + (10−9).
        let t = l.times(ms).unwrap();
        assert_eq!((t.busy_s, t.stalled_s), (0.003, 0.002));
        assert_eq!(l.used(), 0);
        // The next read starts from zero.
        let t = l.times(ms).unwrap();
        assert_eq!((t.busy_s, t.stalled_s), (0.0, 0.0));
        // Recycled: the next group reuses event 0.
        assert_eq!(l.begin().unwrap(), (0, 1));
    }

    #[test]
    fn unknown_and_stale_tickets_are_errors_naming_them() {
        let mut l = Ledger::default();
        let e = l.ticket(Ticket(0)).unwrap_err().to_string();
        assert!(e.contains("unknown ticket 0"), "{e}");
        l.begin().unwrap();
        let (_, t) = l.end().unwrap();
        let e = l.ticket(Ticket(7)).unwrap_err().to_string();
        assert!(
            e.contains("unknown ticket 7") && e.contains("1 ticket(s)"),
            "{e}"
        );
        l.times(ms).unwrap();
        let e = l.ticket(t).unwrap_err().to_string();
        assert!(
            e.contains("stale ticket 1") && e.contains("from 2 on"),
            "{e}"
        );
    }

    #[test]
    fn a_fold_keeps_the_times_and_completes_the_tickets() {
        let mut l = Ledger::default();
        l.begin().unwrap();
        let (_, t1) = l.end().unwrap();
        l.stall();
        l.fold(ms).unwrap();
        assert_eq!(l.used(), 0);
        // Folded tickets are complete: waiting is a no-op, not an error.
        assert_eq!(l.ticket(t1).unwrap(), Pending::Done);
        l.begin().unwrap();
        let (_, t2) = l.end().unwrap();
        assert_eq!(l.ticket(t2).unwrap(), Pending::Event(2));
        let t = l.times(ms).unwrap();
        // Busy (2−1) before the fold and (2−1) after; stalled (4−3).
        assert_eq!((t.busy_s, t.stalled_s), (0.002, 0.001));
    }

    #[test]
    fn the_pool_folds_past_its_bound_but_never_inside_a_group() {
        let mut l = Ledger::default();
        while l.used() < POOL_MAX - 2 {
            l.begin().unwrap();
            l.end().unwrap();
        }
        l.begin().unwrap();
        l.stall();
        l.stall();
        assert!(l.used() >= POOL_MAX);
        assert!(!l.needs_fold(), "a group is open");
        l.end().unwrap();
        assert!(l.needs_fold());
        l.fold(ms).unwrap();
        assert!(!l.needs_fold());
    }

    #[test]
    fn groups_must_nest_properly() {
        let mut l = Ledger::default();
        assert!(l
            .end()
            .unwrap_err()
            .to_string()
            .contains("side_end without side_begin"));
        assert!(l.fork().is_err());
        l.begin().unwrap();
        let e = l.begin().unwrap_err().to_string();
        assert!(e.contains("side group is open"), "{e}");
        let e = l.times(ms).unwrap_err().to_string();
        assert!(e.contains("side_times while a side group is open"), "{e}");
        assert!(l.fold(ms).is_err());
    }
}

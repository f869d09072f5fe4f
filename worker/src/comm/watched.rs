//! A communicator that shows its rank's waits and, where asked, counts its
//! calls as progress.
//!
//! * While a call that needs the other ranks runs (a collective, a send or
//!   receive, a barrier), the rank is marked waiting ([`Progress::waiting`]):
//!   blocked on a slower peer, it is not the one a hang blames. Only where a
//!   call holds the host ([`Collectives::holds_host`]: the TCP ring): NCCL's
//!   calls only queue work, and marking each cost a lock and an allocation
//!   on a path nccl-tests' figures are read on.
//! * With [`Units::Calls`], each completed call is one unit of the rank's
//!   progress ([`Progress::tick`]): the nccl patterns and p2p do nothing
//!   else, so a rank blocked in a collective stops counting, which is how the
//!   coordinator tells a hang from a slow step. Training counts its own steps
//!   ([`Units::Own`]).

use anyhow::Result;
use tch::Tensor;

use super::{Collectives, Op, SideTimes, Ticket};
use crate::progress::Progress;

/// What counts as a unit of the rank's progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Units {
    /// Each completed call.
    Calls,
    /// The workload counts its own (training steps).
    Own,
}

pub struct Watched {
    inner: Box<dyn Collectives>,
    progress: Progress,
    units: Units,
    marks: bool,
}

/// Wraps `comm` so that its calls show as waits, and count toward
/// `progress` with [`Units::Calls`].
pub fn watched(
    comm: Box<dyn Collectives>,
    progress: &Progress,
    units: Units,
) -> Box<dyn Collectives> {
    Box::new(Watched {
        marks: comm.holds_host(),
        inner: comm,
        progress: progress.clone(),
        units,
    })
}

/// What a rank in a collective waits for, as its progress shows it.
struct PeersIn(Op);

impl std::fmt::Display for PeersIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "peers in {}", self.0.name())
    }
}

impl Watched {
    /// Runs `f`, marked as waiting for `what` where calls hold the host;
    /// the text is made only then.
    fn call(
        &mut self,
        what: &dyn std::fmt::Display,
        f: impl FnOnce(&mut dyn Collectives) -> Result<()>,
    ) -> Result<()> {
        let _mark = self.marks.then(|| self.progress.waiting(&what.to_string()));
        let r = f(self.inner.as_mut());
        if r.is_ok() && self.units == Units::Calls {
            self.progress.tick(1);
        }
        r
    }
}

impl Collectives for Watched {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn version(&self) -> String {
        self.inner.version()
    }
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn all_reduce(&mut self, send: &Tensor, recv: &Tensor) -> Result<()> {
        self.call(&PeersIn(Op::AllReduce), |c| c.all_reduce(send, recv))
    }
    fn all_gather(&mut self, send: &Tensor, recv: &Tensor) -> Result<()> {
        self.call(&PeersIn(Op::AllGather), |c| c.all_gather(send, recv))
    }
    fn reduce_scatter(&mut self, send: &Tensor, recv: &Tensor) -> Result<()> {
        self.call(&PeersIn(Op::ReduceScatter), |c| {
            c.reduce_scatter(send, recv)
        })
    }
    fn broadcast(&mut self, send: &Tensor, recv: &Tensor, root: usize) -> Result<()> {
        self.call(&PeersIn(Op::Broadcast), |c| c.broadcast(send, recv, root))
    }
    fn reduce(&mut self, send: &Tensor, recv: &Tensor, root: usize) -> Result<()> {
        self.call(&PeersIn(Op::Reduce), |c| c.reduce(send, recv, root))
    }
    fn alltoall(&mut self, send: &Tensor, recv: &Tensor) -> Result<()> {
        self.call(&PeersIn(Op::AllToAll), |c| c.alltoall(send, recv))
    }
    fn sendrecv(&mut self, send: &Tensor, to: usize, recv: &Tensor, from: usize) -> Result<()> {
        self.call(&PeersIn(Op::SendRecv), |c| c.sendrecv(send, to, recv, from))
    }
    fn send(&mut self, t: &Tensor, to: usize) -> Result<()> {
        self.call(&"a peer to receive", |c| c.send(t, to))
    }
    fn recv(&mut self, t: &Tensor, from: usize) -> Result<()> {
        self.call(&"a peer to send", |c| c.recv(t, from))
    }
    fn barrier(&mut self) -> Result<()> {
        self.call(&"peers in a barrier", |c| c.barrier())
    }
    // Waits for this rank's own device as much as for its peers: not marked,
    // so that a rank stuck on its own GPU is still the one blamed.
    fn synchronize(&mut self) -> Result<()> {
        self.inner.synchronize()
    }
    fn bind_thread(&self) -> Result<()> {
        self.inner.bind_thread()
    }
    fn holds_host(&self) -> bool {
        self.inner.holds_host()
    }
    fn run(&mut self, op: Op, send: &Tensor, recv: &Tensor) -> Result<()> {
        self.call(&PeersIn(op), |c| c.run(op, send, recv))
    }
    // The side stream is forwarded, not counted: without these the defaults
    // would run every collective synchronously and overlap would be lost.
    fn overlaps(&self) -> bool {
        self.inner.overlaps()
    }
    fn side_begin(&mut self) -> Result<()> {
        self.inner.side_begin()
    }
    fn side_end(&mut self) -> Result<Ticket> {
        self.inner.side_end()
    }
    fn side_wait(&mut self, ticket: Ticket) -> Result<()> {
        self.inner.side_wait(ticket)
    }
    fn side_times(&mut self) -> Result<Option<SideTimes>> {
        self.inner.side_times()
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::time::Duration;

    use tch::{Device, Kind};

    use super::*;
    use crate::comm::tcp::TcpComm;

    type Log = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

    /// A backend that overlaps, to see the side calls reach it, and reads
    /// inside some calls what the rank is marked as waiting for.
    struct Side {
        tcp: TcpComm,
        log: Log,
        progress: Progress,
        marks: Log,
        holds: bool,
    }

    impl Side {
        fn note(&self, call: String) {
            self.log.lock().unwrap().push(call);
        }
        fn peek(&self) {
            self.marks.lock().unwrap().push(self.progress.waiting_for());
        }
    }

    /// A [`Side`] of one rank under [`watched`]: the wrapped backend, its
    /// progress, the calls it logged and the marks it saw.
    fn side(holds: bool, units: Units) -> (Box<dyn Collectives>, Progress, Log, Log) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let tcp = TcpComm::establish(0, 1, listener, &[addr], Duration::from_secs(5)).unwrap();
        let (log, marks) = (Log::default(), Log::default());
        let progress = Progress::local();
        let inner = Side {
            tcp,
            log: log.clone(),
            progress: progress.clone(),
            marks: marks.clone(),
            holds,
        };
        (
            watched(Box::new(inner), &progress, units),
            progress,
            log,
            marks,
        )
    }

    impl Collectives for Side {
        fn backend(&self) -> &'static str {
            "side"
        }
        fn version(&self) -> String {
            String::new()
        }
        fn rank(&self) -> usize {
            0
        }
        fn world_size(&self) -> usize {
            1
        }
        fn all_reduce(&mut self, send: &Tensor, recv: &Tensor) -> Result<()> {
            self.note("all_reduce".into());
            self.peek();
            self.tcp.all_reduce(send, recv)
        }
        fn all_gather(&mut self, send: &Tensor, recv: &Tensor) -> Result<()> {
            self.tcp.all_gather(send, recv)
        }
        fn reduce_scatter(&mut self, send: &Tensor, recv: &Tensor) -> Result<()> {
            self.tcp.reduce_scatter(send, recv)
        }
        fn broadcast(&mut self, send: &Tensor, recv: &Tensor, root: usize) -> Result<()> {
            self.peek();
            self.tcp.broadcast(send, recv, root)
        }
        fn reduce(&mut self, send: &Tensor, recv: &Tensor, root: usize) -> Result<()> {
            self.tcp.reduce(send, recv, root)
        }
        fn alltoall(&mut self, send: &Tensor, recv: &Tensor) -> Result<()> {
            self.tcp.alltoall(send, recv)
        }
        fn sendrecv(&mut self, send: &Tensor, to: usize, recv: &Tensor, from: usize) -> Result<()> {
            self.tcp.sendrecv(send, to, recv, from)
        }
        fn barrier(&mut self) -> Result<()> {
            self.tcp.barrier()
        }
        fn synchronize(&mut self) -> Result<()> {
            self.peek();
            self.tcp.synchronize()
        }
        fn holds_host(&self) -> bool {
            self.holds
        }
        fn overlaps(&self) -> bool {
            true
        }
        fn side_begin(&mut self) -> Result<()> {
            self.note("begin".into());
            Ok(())
        }
        fn side_end(&mut self) -> Result<Ticket> {
            self.note("end".into());
            Ok(Ticket(41))
        }
        fn side_wait(&mut self, ticket: Ticket) -> Result<()> {
            self.note(format!("wait {}", ticket.0));
            Ok(())
        }
        fn side_times(&mut self) -> Result<Option<SideTimes>> {
            self.note("times".into());
            Ok(Some(SideTimes {
                busy_s: 1.5,
                stalled_s: 0.25,
            }))
        }
    }

    #[test]
    fn the_side_stream_calls_reach_the_backend_and_only_collectives_count() {
        let (mut c, progress, log, _) = side(true, Units::Calls);
        assert!(c.overlaps());
        let t = Tensor::ones([8], (Kind::Float, Device::Cpu));
        c.side_begin().unwrap();
        c.all_reduce(&t, &t).unwrap();
        let ticket = c.side_end().unwrap();
        assert_eq!(ticket, Ticket(41));
        c.side_wait(ticket).unwrap();
        let times = c.side_times().unwrap();
        assert_eq!(
            times,
            Some(SideTimes {
                busy_s: 1.5,
                stalled_s: 0.25
            })
        );
        assert_eq!(
            *log.lock().unwrap(),
            ["begin", "all_reduce", "end", "wait 41", "times"]
        );
        assert_eq!(progress.iterations(), 1);
    }

    #[test]
    fn completed_calls_count_and_failed_ones_do_not() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let one = TcpComm::establish(0, 1, listener, &[addr], Duration::from_secs(5)).unwrap();
        let progress = Progress::local();
        let mut c = watched(Box::new(one), &progress, Units::Calls);
        let t = Tensor::ones([8], (Kind::Float, Device::Cpu));
        c.all_reduce(&t, &t).unwrap();
        c.run(Op::AllGather, &t, &t).unwrap();
        c.barrier().unwrap();
        c.synchronize().unwrap();
        assert_eq!(progress.iterations(), 3);
        // TCP keeps the synchronous defaults, through the wrapper too.
        assert!(!c.overlaps());
        c.side_begin().unwrap();
        let ticket = c.side_end().unwrap();
        c.side_wait(ticket).unwrap();
        assert_eq!(c.side_times().unwrap(), None);
        assert_eq!(progress.iterations(), 3);
        // A wrong shape fails the call: no unit of work was done.
        let short = Tensor::ones([4], (Kind::Float, Device::Cpu));
        assert!(c.all_reduce(&t, &short).is_err());
        assert_eq!(progress.iterations(), 3);
    }

    /// A full CI run (2026-11-30) blamed a healthy rank blocked in a
    /// collective on a throttled peer: its progress showed no wait.
    #[test]
    fn a_rank_in_a_collective_shows_as_waiting_and_only_while_in_it() {
        // Training counts its own steps: the calls mark waits, never units.
        let (mut c, progress, _, seen) = side(true, Units::Own);
        let t = Tensor::ones([8], (Kind::Float, Device::Cpu));
        assert_eq!(progress.waiting_for(), "");
        c.all_reduce(&t, &t).unwrap();
        assert_eq!(progress.waiting_for(), "", "the mark outlived the call");
        c.broadcast(&t, &t, 0).unwrap();
        c.run(Op::AllReduce, &t, &t).unwrap();
        // Its own device's work: not a wait on peers.
        c.synchronize().unwrap();
        assert_eq!(progress.iterations(), 0);
        assert_eq!(
            *seen.lock().unwrap(),
            [
                "peers in all_reduce",
                "peers in broadcast",
                "peers in all_reduce",
                ""
            ]
        );
        assert_eq!(progress.waiting_for(), "");
    }

    #[test]
    fn a_backend_whose_calls_only_queue_work_is_not_marked_but_still_counted() {
        let (mut c, progress, _, seen) = side(false, Units::Calls);
        let t = Tensor::ones([8], (Kind::Float, Device::Cpu));
        c.all_reduce(&t, &t).unwrap();
        c.run(Op::AllReduce, &t, &t).unwrap();
        assert_eq!(*seen.lock().unwrap(), ["", ""]);
        assert_eq!(progress.iterations(), 2);
    }
}

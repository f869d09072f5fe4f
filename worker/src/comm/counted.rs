//! A communicator that counts each collective call it completes as one unit
//! of the rank's progress ([`Progress::tick`]): the nccl patterns do nothing
//! else, so a rank blocked in a collective stops counting, which is how the
//! coordinator tells a hang from a slow step.

use anyhow::Result;
use tch::Tensor;

use super::{Collectives, Op, SideTimes, Ticket};
use crate::progress::Progress;

pub struct Counted {
    inner: Box<dyn Collectives>,
    progress: Progress,
}

/// Wraps `comm` so that its calls count toward `progress`.
pub fn counted(comm: Box<dyn Collectives>, progress: &Progress) -> Box<dyn Collectives> {
    Box::new(Counted {
        inner: comm,
        progress: progress.clone(),
    })
}

impl Counted {
    fn count(&self, r: Result<()>) -> Result<()> {
        if r.is_ok() {
            self.progress.tick(1);
        }
        r
    }
}

impl Collectives for Counted {
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
        let r = self.inner.all_reduce(send, recv);
        self.count(r)
    }
    fn all_gather(&mut self, send: &Tensor, recv: &Tensor) -> Result<()> {
        let r = self.inner.all_gather(send, recv);
        self.count(r)
    }
    fn reduce_scatter(&mut self, send: &Tensor, recv: &Tensor) -> Result<()> {
        let r = self.inner.reduce_scatter(send, recv);
        self.count(r)
    }
    fn broadcast(&mut self, send: &Tensor, recv: &Tensor, root: usize) -> Result<()> {
        let r = self.inner.broadcast(send, recv, root);
        self.count(r)
    }
    fn reduce(&mut self, send: &Tensor, recv: &Tensor, root: usize) -> Result<()> {
        let r = self.inner.reduce(send, recv, root);
        self.count(r)
    }
    fn alltoall(&mut self, send: &Tensor, recv: &Tensor) -> Result<()> {
        let r = self.inner.alltoall(send, recv);
        self.count(r)
    }
    fn sendrecv(&mut self, send: &Tensor, to: usize, recv: &Tensor, from: usize) -> Result<()> {
        let r = self.inner.sendrecv(send, to, recv, from);
        self.count(r)
    }
    fn send(&mut self, t: &Tensor, to: usize) -> Result<()> {
        let r = self.inner.send(t, to);
        self.count(r)
    }
    fn recv(&mut self, t: &Tensor, from: usize) -> Result<()> {
        let r = self.inner.recv(t, from);
        self.count(r)
    }
    fn barrier(&mut self) -> Result<()> {
        let r = self.inner.barrier();
        self.count(r)
    }
    fn synchronize(&mut self) -> Result<()> {
        self.inner.synchronize()
    }
    fn bind_thread(&self) -> Result<()> {
        self.inner.bind_thread()
    }
    fn run(&mut self, op: Op, send: &Tensor, recv: &Tensor) -> Result<()> {
        let r = self.inner.run(op, send, recv);
        self.count(r)
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

    /// A backend that overlaps, to see the side calls reach it.
    struct Side {
        tcp: TcpComm,
        log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    }

    impl Side {
        fn note(&self, call: String) {
            self.log.lock().unwrap().push(call);
        }
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
            self.tcp.all_reduce(send, recv)
        }
        fn all_gather(&mut self, send: &Tensor, recv: &Tensor) -> Result<()> {
            self.tcp.all_gather(send, recv)
        }
        fn reduce_scatter(&mut self, send: &Tensor, recv: &Tensor) -> Result<()> {
            self.tcp.reduce_scatter(send, recv)
        }
        fn broadcast(&mut self, send: &Tensor, recv: &Tensor, root: usize) -> Result<()> {
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
            self.tcp.synchronize()
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
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let tcp = TcpComm::establish(0, 1, listener, &[addr], Duration::from_secs(5)).unwrap();
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let inner = Side {
            tcp,
            log: log.clone(),
        };
        let progress = Progress::local();
        let mut c = counted(Box::new(inner), &progress);
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
        let mut c = counted(Box::new(one), &progress);
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
}

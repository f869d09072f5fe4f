//! A communicator that counts each collective call it completes as one unit
//! of the rank's progress ([`Progress::tick`]): the nccl patterns do nothing
//! else, so a rank blocked in a collective stops counting, which is how the
//! coordinator tells a hang from a slow step.

use anyhow::Result;
use tch::Tensor;

use super::{Collectives, Op};
use crate::client::Progress;

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
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::time::Duration;

    use tch::{Device, Kind};

    use super::*;
    use crate::comm::tcp::TcpComm;

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
        // A wrong shape fails the call: no unit of work was done.
        let short = Tensor::ones([4], (Kind::Float, Device::Cpu));
        assert!(c.all_reduce(&t, &short).is_err());
        assert_eq!(progress.iterations(), 3);
    }
}

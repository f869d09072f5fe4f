//! Ranks as threads of the test process: each connects to the others through
//! the TCP backend and one in-process rendezvous (no coordinator), runs `f`,
//! and hands back what `f` returned, in rank order.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use gpuctl_worker::comm::tcp::TcpComm;
use gpuctl_worker::comm::Collectives;
use gpuctl_worker::rendezvous::{MemoryRendezvous, Rendezvous};

pub fn with_ranks<T: Send + 'static>(
    world: usize,
    f: impl Fn(&mut dyn Collectives) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let rdzv = MemoryRendezvous::new();
    let f = Arc::new(f);
    let hs: Vec<_> = (0..world)
        .map(|r| {
            let rdzv = rdzv.clone();
            let f = f.clone();
            thread::spawn(move || {
                // One thread per rank, as a CPU worker runs: results stay
                // deterministic and the ranks don't fight over the two cores.
                tch::set_num_threads(1);
                let mut c = TcpComm::connect(
                    r,
                    world,
                    &rdzv as &dyn Rendezvous,
                    "127.0.0.1",
                    Duration::from_secs(20),
                )
                .unwrap_or_else(|e| panic!("rank {r}: {e:#}"));
                assert_eq!(
                    (c.rank(), c.world_size(), c.backend()),
                    (r, world, "tcp-ring")
                );
                f(&mut c)
            })
        })
        .collect();
    hs.into_iter()
        .map(|h| h.join().expect("a rank panicked"))
        .collect()
}

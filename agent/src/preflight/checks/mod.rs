//! The checks themselves: pure functions of a `Snapshot`, so that every
//! verdict is tested with hand-made hosts (IB ports up and down, small
//! `/dev/shm`, GPUs with NVLinks down, ...).
//!
//! One file per group of checks that judge the same thing (`driver.rs`,
//! `gpus.rs`, `topology.rs`, `libraries.rs`, `limits.rs`, `network.rs`);
//! this one holds how a check is written and the order they are read in.

mod driver;
mod gpus;
mod libraries;
mod limits;
mod network;
mod topology;

pub use driver::driver;
pub use gpus::{ecc_mode, gpu_processes, gpus, persistence_mode, GPU_PROCESSES};
pub use libraries::{libtorch, nccl, MIN_NCCL};
pub use limits::{memlock, shm, MIN_SHM_BYTES};
pub use network::{gpudirect_rdma, infiniband};
pub use topology::topology;

use gpuctl_proto::pb::{PreflightCheck, Verdict};

use super::Snapshot;
use crate::facts::IbPort;

/// A passing check carries no fix, so that a fix is only ever read where
/// there is something to fix.
pub(super) fn check(
    node: &str,
    name: &str,
    verdict: Verdict,
    detail: String,
    fix: &str,
) -> PreflightCheck {
    PreflightCheck {
        node: node.to_string(),
        name: name.to_string(),
        verdict: verdict as i32,
        detail,
        fix: if verdict == Verdict::Pass {
            String::new()
        } else {
            fix.to_string()
        },
    }
}

/// Every check, in the order people read them.
pub fn evaluate(s: &Snapshot) -> Vec<PreflightCheck> {
    let has_ib = s.ib_ports.iter().any(IbPort::active);
    vec![
        driver(s),
        gpus(s),
        topology(s),
        libtorch(s),
        nccl(s),
        shm(&s.node, s.shm_bytes),
        memlock(&s.node, s.memlock_bytes, has_ib),
        infiniband(&s.node, &s.ib_ports),
        gpudirect_rdma(&s.node, s.peermem, has_ib, !s.gpus.is_empty()),
        persistence_mode(s),
        ecc_mode(s),
        gpu_processes(s),
    ]
}

pub(super) fn dash(s: &str) -> &str {
    if s.is_empty() {
        "?"
    } else {
        s
    }
}

/// `0, 1, 3`.
pub(super) fn list(idx: &[u32]) -> String {
    idx.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

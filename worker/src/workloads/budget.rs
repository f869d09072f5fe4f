//! The host memory a CPU rank may take while it grows until something does
//! not fit (maxbatch's search), so that the search ends with a figure and
//! never with the kernel's OOM killer, which may take any process of the
//! host (issue 47: a 1.3B GPT search grew a worker to 12 GB on a 23 GB host).
//!
//! The budget is the least of the host's available memory and of the room
//! under each memory cgroup limit above the rank, each divided among the
//! job's CPU ranks that draw on it: ranks on one kernel (by boot id) share
//! the host, ranks inside one cgroup share its limit. Every rank says where
//! it runs through the rendezvous, so ranks of several agents on one host
//! (a local fleet) count each other. A part of the budget is kept for what
//! the cap does not see (libraries' scratch, the allocator's free lists).
//! The C++ shim's cap on libtorch's CPU allocator enforces it: an allocation
//! past it fails as out of memory, which the search counts as "does not
//! fit". Before each trial the cap is lowered to what the host has then,
//! should something else have grown meanwhile.

use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, Result};
use gpuctl_core::host_memory::{mem_available, within, Limited, MemCgroup};
use gpuctl_core::rendezvous_keys::owned;
use gpuctl_core::units::format_bytes;

use crate::rendezvous::Rendezvous;
use crate::shim;

/// The share of a rank's part that CPU tensors may hold: tensors are nearly
/// all of a training step's memory, the rest is the process's own.
pub const TENSOR_SHARE: f64 = 0.8;

/// A rank's host-memory budget and how it was made.
#[derive(Clone, Debug, PartialEq)]
pub struct Budget {
    /// Bytes CPU tensors may hold at once.
    pub bytes: u64,
    /// The figures it came from, for the log and the report's note.
    pub why: String,
}

/// Where a rank runs, as the others read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place {
    pub cpu: bool,
    pub boot_id: String,
    /// Its memory cgroup's path (empty: none known).
    pub cgroup: String,
}

impl Place {
    pub fn here(cpu: bool) -> Place {
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let cgroup = MemCgroup::of(None).map(|g| g.path).unwrap_or_default();
        Place {
            cpu,
            boot_id,
            cgroup,
        }
    }

    fn encode(&self) -> String {
        let kind = if self.cpu { "cpu" } else { "gpu" };
        format!("{kind} {} {}", self.boot_id, self.cgroup)
    }

    fn decode(text: &str) -> Option<Place> {
        let mut f = text.splitn(3, ' ');
        let cpu = match f.next()? {
            "cpu" => true,
            "gpu" => false,
            _ => return None,
        };
        Some(Place {
            cpu,
            boot_id: f.next()?.to_string(),
            cgroup: f.next().unwrap_or("").to_string(),
        })
    }
}

/// Every rank's place through the rendezvous (`{name}@{rank}`); a GPU rank
/// only says its own (it takes no host budget) and gets an empty list.
pub fn places(
    rdzv: &dyn Rendezvous,
    name: &str,
    rank: usize,
    world: usize,
    me: &Place,
    timeout: Duration,
) -> Result<Vec<Place>> {
    rdzv.put(&owned(name, rank as u32), me.encode().as_bytes())?;
    if !me.cpu {
        return Ok(Vec::new());
    }
    (0..world)
        .map(|r| {
            if r == rank {
                return Ok(me.clone());
            }
            let v = rdzv
                .get(&owned(name, r as u32), timeout)
                .with_context(|| format!("waiting for rank {r} to say where it runs"))?;
            let text = String::from_utf8_lossy(&v);
            Place::decode(&text).with_context(|| format!("rank {r} says it runs at `{text}`"))
        })
        .collect()
}

/// The budget of the rank at `me` among `peers` (every rank of the job, `me`
/// included), from the host's available bytes and the limited cgroup levels
/// above the rank.
pub fn share(available: u64, me: &Place, peers: &[Place], limited: &[Limited]) -> Budget {
    let on_host = |p: &&Place| p.cpu && p.boot_id == me.boot_id;
    let host_ranks = peers.iter().filter(on_host).count().max(1) as u64;
    let mut least = available / host_ranks;
    let mut parts = vec![format!(
        "MemAvailable {} / {host_ranks} CPU rank(s) of the job on this host",
        format_bytes(available)
    )];
    for l in limited {
        let n = peers
            .iter()
            .filter(on_host)
            .filter(|p| within(&p.cgroup, &l.path))
            .count()
            .max(1) as u64;
        least = least.min(l.room / n);
        parts.push(format!(
            "memory cgroup {} ({} free of its {} limit) / {n} rank(s) in it",
            l.path,
            format_bytes(l.room),
            format_bytes(l.limit)
        ));
    }
    let bytes = (least as f64 * TENSOR_SHARE) as u64;
    Budget {
        bytes,
        why: format!(
            "this rank's host-memory budget is {} of CPU tensors: {TENSOR_SHARE} of the least of {}",
            format_bytes(bytes),
            parts.join(", ")
        ),
    }
}

/// The budget in force: set by [`install`], read before each trial.
static INSTALLED: Mutex<Option<u64>> = Mutex::new(None);

/// Sizes this CPU rank's budget among the job's ranks and caps libtorch's
/// CPU allocator at it; a GPU rank only says where it runs.
pub fn install(
    rdzv: &dyn Rendezvous,
    rank: usize,
    world: usize,
    cpu: bool,
    timeout: Duration,
) -> Result<Option<Budget>> {
    let me = Place::here(cpu);
    let peers = places(rdzv, "host-memory/place", rank, world, &me, timeout)?;
    if !cpu {
        return Ok(None);
    }
    let limited = MemCgroup::of(None).map(|g| g.limited()).unwrap_or_default();
    let available = mem_available().context("/proc/meminfo has no MemAvailable")?;
    let b = share(available, &me, &peers, &limited);
    shim::cpu_cap_install()?;
    let (held, _) = shim::cpu_cap_stats();
    shim::cpu_cap_set(held + b.bytes);
    *INSTALLED.lock().unwrap_or_else(|e| e.into_inner()) = Some(held + b.bytes);
    tracing::info!(budget_bytes = b.bytes, "{}", b.why);
    Ok(Some(b))
}

/// Before a trial: the cap lowered to what the host and the cgroups have
/// now (plus what this rank holds), when something else took memory since
/// the budget was made; a new peak. `None` without a budget.
pub fn before_trial() -> Option<u64> {
    let budget = (*INSTALLED.lock().unwrap_or_else(|e| e.into_inner()))?;
    let (held, _) = shim::cpu_cap_stats();
    let mut room = mem_available().unwrap_or(u64::MAX);
    if let Some(g) = MemCgroup::of(None) {
        for l in g.limited() {
            room = room.min(l.room);
        }
    }
    let cap = budget.min(held.saturating_add((room as f64 * TENSOR_SHARE) as u64));
    if cap < budget {
        tracing::warn!(
            budget_bytes = budget,
            cap_bytes = cap,
            "the host has less memory than when the budget was made: this trial may hold {}",
            format_bytes(cap)
        );
    }
    shim::cpu_cap_set(cap);
    shim::cpu_cap_reset_peak();
    Some(cap)
}

/// Whether a trial's error is the budget's cap.
pub fn is_budget(error: &str) -> bool {
    error.contains("host-memory budget")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(cpu: bool, boot: &str, cg: &str) -> Place {
        Place {
            cpu,
            boot_id: boot.into(),
            cgroup: cg.into(),
        }
    }

    #[test]
    fn places_round_trip_through_their_text() {
        for p in [
            place(true, "b1", "/a b/c"),
            place(false, "b2", ""),
            place(true, "b3", "/"),
        ] {
            assert_eq!(Place::decode(&p.encode()), Some(p));
        }
        assert_eq!(Place::decode("tpu x y"), None);
    }

    #[test]
    fn the_host_and_each_limit_are_shared_by_the_ranks_they_hold() {
        const G: u64 = 1 << 30;
        let me = place(true, "k1", "/agents/a");
        let peers = vec![
            me.clone(),
            place(true, "k1", "/agents/a"),
            place(true, "k1", "/agents/b"),
            place(true, "k2", "/agents/a"),  // another host
            place(false, "k1", "/agents/a"), // a GPU rank
        ];
        // Host: 12 GiB among 3 CPU ranks on k1 = 4 GiB.
        let b = share(12 * G, &me, &peers, &[]);
        assert_eq!(b.bytes, (4.0 * G as f64 * TENSOR_SHARE) as u64);
        assert!(b.why.contains("3 CPU rank(s)"), "{}", b.why);
        // /agents/a's 2 GiB of room among its 2 ranks on k1: 1 GiB.
        let a = Limited {
            path: "/agents/a".into(),
            limit: 3 * G,
            room: 2 * G,
        };
        // /agents's 9 GiB among all 3: 3 GiB, not the least.
        let agents = Limited {
            path: "/agents".into(),
            limit: 10 * G,
            room: 9 * G,
        };
        let b = share(12 * G, &me, &peers, &[a, agents]);
        assert_eq!(b.bytes, (G as f64 * TENSOR_SHARE) as u64);
        assert!(b.why.contains("memory cgroup /agents/a"), "{}", b.why);
        // Alone on its host, a rank has it all.
        let b = share(12 * G, &me, std::slice::from_ref(&me), &[]);
        assert_eq!(b.bytes, (12.0 * G as f64 * TENSOR_SHARE) as u64);
    }
}

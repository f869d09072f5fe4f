//! Key-value rendezvous: how ranks find each other before they can talk.
//!
//! In a job the coordinator serves it (`WorkerService.RendezvousPut/Get`, keys
//! scoped by job and attempt, see `client.rs`). [`MemoryRendezvous`] is the same
//! contract inside one process, for ranks run as threads (tests, local tries).
//!
//! Every key names the one rank that may write it
//! (`gpuctl_core::rendezvous_keys`): the coordinator refuses anyone else, so
//! a reader asks for the key of the rank it trusts, and a rank of a node
//! under test cannot plant another's address.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use gpuctl_core::rendezvous_keys;

use crate::progress::Progress;

/// Put a value under a key; get it, waiting until some rank has put it.
pub trait Rendezvous: Send + Sync {
    fn put(&self, key: &str, value: &[u8]) -> Result<()>;
    /// Waits up to `timeout` for `key`; an error names the key when it never came.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>>;
}

/// Another rendezvous seen under a key prefix, so that communicators of
/// different rank groups in one job (the pairs of `--pattern pairs`) use their
/// usual keys (`tcp/addr/{rank}`, `nccl/id`) without meeting each other.
/// Ranks in those keys are group ranks: a key's writer, group rank g, becomes
/// the job rank `members[g]` in the key's writer suffix, so that only g's own
/// worker may write it.
pub struct Scoped<'a> {
    inner: &'a dyn Rendezvous,
    prefix: String,
    /// The job rank of each group rank.
    members: Vec<u32>,
}

impl<'a> Scoped<'a> {
    /// Keys `k` written by group rank g become `{prefix}/{k}@{members[g]}`.
    pub fn new(inner: &'a dyn Rendezvous, prefix: &str, members: Vec<u32>) -> Self {
        Scoped {
            inner,
            prefix: format!("{prefix}/"),
            members,
        }
    }

    fn key(&self, key: &str) -> Result<String> {
        let (base, g) = rendezvous_keys::split(key)
            .ok_or_else(|| anyhow!("rendezvous key `{key}` names no writer"))?;
        let rank = self.members.get(g as usize).ok_or_else(|| {
            anyhow!(
                "rendezvous key `{key}` is group rank {g}'s; the group under `{}` has {} ranks",
                self.prefix,
                self.members.len()
            )
        })?;
        Ok(rendezvous_keys::owned(
            &format!("{}{base}", self.prefix),
            *rank,
        ))
    }
}

impl Rendezvous for Scoped<'_> {
    fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.put(&self.key(key)?, value)
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.inner.get(&self.key(key)?, timeout)
    }
}

/// A rendezvous whose waits show in the rank's progress (`waiting_for`):
/// a rank blocked on another rank's key is waiting, not hung, and the hang
/// detector looks past it to the rank it waits for.
pub struct Watched {
    inner: Arc<dyn Rendezvous>,
    progress: Progress,
}

impl Watched {
    pub fn new(inner: Arc<dyn Rendezvous>, progress: Progress) -> Self {
        Watched { inner, progress }
    }
}

impl Rendezvous for Watched {
    fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.put(key, value)
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let _mark = self.progress.waiting(key);
        self.inner.get(key, timeout)
    }
}

/// Returns when all `world` ranks have called it with the same `name`, through
/// the rendezvous only (no communicator needed). Each rank puts
/// `barrier/{name}/{rank}`; rank 0 waits for every one and then puts
/// `barrier/{name}/done`, which the others wait for: a key per rank and two
/// waits each, not one per pair of ranks.
pub fn barrier(
    rdzv: &dyn Rendezvous,
    name: &str,
    rank: usize,
    world: usize,
    timeout: Duration,
) -> Result<()> {
    rdzv.put(&format!("barrier/{name}/{rank}"), b"")?;
    let done = format!("barrier/{name}/done");
    if rank == 0 {
        for r in 1..world {
            rdzv.get(&format!("barrier/{name}/{r}"), timeout)
                .map_err(|e| e.context(format!("barrier `{name}`: waiting for rank {r}")))?;
        }
        rdzv.put(&done, b"")
    } else {
        rdzv.get(&done, timeout)
            .map_err(|e| e.context(format!("barrier `{name}`: waiting for rank 0")))?;
        Ok(())
    }
}

type Shared = Arc<(Mutex<HashMap<String, Vec<u8>>>, Condvar)>;

/// In-process rendezvous shared by ranks that are threads of one process.
/// It trusts its threads, but refuses keys that name no writer, as the
/// coordinator does: a unit test finds such a key before a job does.
#[derive(Clone, Default)]
pub struct MemoryRendezvous {
    inner: Shared,
}

impl MemoryRendezvous {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Rendezvous for MemoryRendezvous {
    fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        writable(key)?;
        let (map, cv) = &*self.inner;
        map.lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_string(), value.to_vec());
        cv.notify_all();
        Ok(())
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        writable(key)?;
        let deadline = Instant::now() + timeout;
        let (map, cv) = &*self.inner;
        let mut guard = map.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(v) = guard.get(key) {
                return Ok(v.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                bail!(
                    "rendezvous key `{key}` did not appear within {:.1}s",
                    timeout.as_secs_f64()
                );
            }
            guard = cv
                .wait_timeout(guard, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// Refuses a key no rank may write (the coordinator would refuse it).
fn writable(key: &str) -> Result<()> {
    match rendezvous_keys::writer(key) {
        Some(_) => Ok(()),
        None => bail!("rendezvous key `{key}` names no writer: no rank may write it"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scoped_keys_do_not_meet_and_the_barrier_waits_for_everyone() {
        let m = MemoryRendezvous::new();
        let (a, b) = (
            Scoped::new(&m, "a", vec![4, 6]),
            Scoped::new(&m, "b", vec![5, 7]),
        );
        a.put("tcp/addr/1", b"1").unwrap();
        b.put("tcp/addr/1", b"2").unwrap();
        a.put("nccl/id", b"3").unwrap();
        a.put("k@1", b"4").unwrap();
        // Group ranks become the job ranks that own the keys.
        assert_eq!(m.get("a/tcp/addr/1@6", Duration::ZERO).unwrap(), b"1");
        assert_eq!(m.get("a/nccl/id@4", Duration::ZERO).unwrap(), b"3");
        assert_eq!(m.get("a/k@6", Duration::ZERO).unwrap(), b"4");
        assert_eq!(b.get("tcp/addr/1", Duration::ZERO).unwrap(), b"2");
        assert!(m.get("tcp/addr/1", Duration::ZERO).is_err());
        // Keys that name no writer, or a rank outside the group, go nowhere.
        let e = a.put("k", b"").unwrap_err().to_string();
        assert!(e.contains("names no writer"), "{e}");
        let e = a.put("tcp/addr/2", b"").unwrap_err().to_string();
        assert!(
            e.contains("group rank 2's") && e.contains("has 2 ranks"),
            "{e}"
        );
        assert!(m.put("pairs/shape", b"").is_err());

        let arrived = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let hs: Vec<_> = (0..4)
            .map(|r| {
                let (m, arrived) = (m.clone(), arrived.clone());
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(30 * r as u64));
                    arrived.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    barrier(&m, "x", r, 4, Duration::from_secs(10)).unwrap();
                    // Nobody leaves before the last one came.
                    arrived.load(std::sync::atomic::Ordering::SeqCst)
                })
            })
            .collect();
        for h in hs {
            assert_eq!(h.join().unwrap(), 4);
        }
        // A rank that never comes: rank 0 names it.
        let e = barrier(&m, "y", 0, 2, Duration::from_millis(20)).unwrap_err();
        assert!(format!("{e:#}").contains("rank 1"), "{e:#}");
    }
}

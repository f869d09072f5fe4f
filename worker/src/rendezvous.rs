//! Key-value rendezvous: how ranks find each other before they can talk.
//!
//! In a job the coordinator serves it (`WorkerService.RendezvousPut/Get`, keys
//! scoped by job and attempt, see `client.rs`). [`MemoryRendezvous`] is the same
//! contract inside one process, for ranks run as threads (tests, local tries).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::client::Progress;

/// Put a value under a key; get it, waiting until some rank has put it.
pub trait Rendezvous: Send + Sync {
    fn put(&self, key: &str, value: &[u8]) -> Result<()>;
    /// Waits up to `timeout` for `key`; an error names the key when it never came.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>>;
}

/// Another rendezvous seen under a key prefix, so that communicators of
/// different rank groups in one job (the pairs of `--pattern pairs`) use their
/// usual keys (`tcp/addr/{rank}`, `nccl/id`) without meeting each other.
pub struct Scoped<'a> {
    inner: &'a dyn Rendezvous,
    prefix: String,
}

impl<'a> Scoped<'a> {
    /// Keys become `{prefix}/{key}`.
    pub fn new(inner: &'a dyn Rendezvous, prefix: &str) -> Self {
        Scoped {
            inner,
            prefix: format!("{prefix}/"),
        }
    }
}

impl Rendezvous for Scoped<'_> {
    fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.put(&format!("{}{key}", self.prefix), value)
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.inner.get(&format!("{}{key}", self.prefix), timeout)
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
        let (map, cv) = &*self.inner;
        map.lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_string(), value.to_vec());
        cv.notify_all();
        Ok(())
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scoped_keys_do_not_meet_and_the_barrier_waits_for_everyone() {
        let m = MemoryRendezvous::new();
        Scoped::new(&m, "a").put("k", b"1").unwrap();
        Scoped::new(&m, "b").put("k", b"2").unwrap();
        assert_eq!(m.get("a/k", Duration::ZERO).unwrap(), b"1");
        assert_eq!(Scoped::new(&m, "b").get("k", Duration::ZERO).unwrap(), b"2");
        assert!(m.get("k", Duration::ZERO).is_err());

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

//! Key-value rendezvous: how ranks find each other before they can talk.
//!
//! In a job the coordinator serves it (`WorkerService.RendezvousPut/Get`, keys
//! scoped by job and attempt, see `client.rs`). [`MemoryRendezvous`] is the same
//! contract inside one process, for ranks run as threads (tests, local tries).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

/// Put a value under a key; get it, waiting until some rank has put it.
pub trait Rendezvous: Send + Sync {
    fn put(&self, key: &str, value: &[u8]) -> Result<()>;
    /// Waits up to `timeout` for `key`; an error names the key when it never came.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>>;
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

//! Key-value rendezvous for workers, scoped by (job, attempt). Kept apart from
//! the scheduler task because gets block for up to their timeout: a waiter
//! parks on a `Notify` instead of holding up the event loop. The scheduler opens
//! a scope when a job starts and closes it when the job ends, which wakes every
//! waiter with `job_over`. Every key has one writer fixed by its name
//! (`gpuctl_core::rendezvous_keys`); the WorkerService handler lets only
//! that rank's secret write it, so what is stored here is the owner's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

/// The longest a single get may wait; workers loop for longer waits.
pub const MAX_WAIT: Duration = Duration::from_secs(600);

#[derive(Default)]
struct Scope {
    kv: Mutex<HashMap<String, Vec<u8>>>,
    over: std::sync::atomic::AtomicBool,
    changed: Notify,
}

/// What became of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    Stored,
    /// The job is not running under this attempt.
    NotRunning,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    Found(Vec<u8>),
    /// Not there before the timeout.
    Missing,
    /// The job ended (or never ran under this attempt); stop waiting.
    Over,
}

/// Scopes by (job, attempt).
type Scopes = HashMap<(String, u32), Arc<Scope>>;

#[derive(Default, Clone)]
pub struct Rendezvous {
    scopes: Arc<Mutex<Scopes>>,
}

impl Rendezvous {
    pub fn open(&self, job: &str, attempt: u32) {
        self.scopes
            .lock()
            .expect("rendezvous lock")
            .entry((job.to_string(), attempt))
            .or_default();
    }

    /// Ends a scope: its keys are dropped and every waiter returns `Over`.
    pub fn close(&self, job: &str, attempt: u32) {
        let scope = self
            .scopes
            .lock()
            .expect("rendezvous lock")
            .remove(&(job.to_string(), attempt));
        if let Some(s) = scope {
            s.over.store(true, std::sync::atomic::Ordering::SeqCst);
            s.changed.notify_waiters();
        }
    }

    /// Keys held over every open scope (for `/metrics`).
    pub fn key_count(&self) -> usize {
        let scopes: Vec<Arc<Scope>> = self
            .scopes
            .lock()
            .expect("rendezvous lock")
            .values()
            .cloned()
            .collect();
        scopes
            .iter()
            .map(|s| s.kv.lock().expect("rendezvous lock").len())
            .sum()
    }

    fn scope(&self, job: &str, attempt: u32) -> Option<Arc<Scope>> {
        self.scopes
            .lock()
            .expect("rendezvous lock")
            .get(&(job.to_string(), attempt))
            .cloned()
    }

    /// Stores a key, written by its owner (checked by the caller): the
    /// owner may write it again, e.g. a worker retrying a put.
    pub fn put(&self, job: &str, attempt: u32, key: &str, value: Vec<u8>) -> Put {
        let Some(s) = self.scope(job, attempt) else {
            return Put::NotRunning;
        };
        s.kv.lock()
            .expect("rendezvous lock")
            .insert(key.to_string(), value);
        s.changed.notify_waiters();
        Put::Stored
    }

    /// Waits up to `timeout` for the key.
    pub async fn get(&self, job: &str, attempt: u32, key: &str, timeout: Duration) -> Lookup {
        let Some(s) = self.scope(job, attempt) else {
            return Lookup::Over;
        };
        let deadline = tokio::time::Instant::now() + timeout.min(MAX_WAIT);
        loop {
            // Register interest before looking, so a put between the look and
            // the wait still wakes us.
            let notified = s.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if s.over.load(std::sync::atomic::Ordering::SeqCst) {
                return Lookup::Over;
            }
            if let Some(v) = s.kv.lock().expect("rendezvous lock").get(key) {
                return Lookup::Found(v.clone());
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Lookup::Missing;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn get_waits_for_put_and_close_ends_waiters() {
        let r = Rendezvous::default();
        assert_eq!(
            r.get("j", 1, "k", Duration::from_millis(1)).await,
            Lookup::Over
        );
        r.open("j", 1);
        assert_eq!(
            r.get("j", 1, "k", Duration::from_millis(10)).await,
            Lookup::Missing
        );
        let r2 = r.clone();
        let waiter =
            tokio::spawn(async move { r2.get("j", 1, "k", Duration::from_secs(10)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(r.put("j", 1, "k", b"v".to_vec()), Put::Stored);
        assert_eq!(waiter.await.unwrap(), Lookup::Found(b"v".to_vec()));
        assert_eq!(r.key_count(), 1);
        assert_eq!(
            r.put("j", 2, "k", vec![]),
            Put::NotRunning,
            "another attempt is another scope"
        );
        assert_eq!(r.put("j", 1, "k", b"v2".to_vec()), Put::Stored);
        assert_eq!(
            r.get("j", 1, "k", Duration::from_millis(1)).await,
            Lookup::Found(b"v2".to_vec())
        );

        let r3 = r.clone();
        let waiter =
            tokio::spawn(async move { r3.get("j", 1, "never", Duration::from_secs(10)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        r.close("j", 1);
        assert_eq!(waiter.await.unwrap(), Lookup::Over);
        assert_eq!(r.key_count(), 0);
    }
}

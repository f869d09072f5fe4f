//! A job's runs folded into the kept answer before they are written, so
//! that callers do not wait for them. After a job on 16,384 nodes the fold
//! and the rows made again took 0.4-0.7 s on a busy 2-core host, and every
//! `gpuctl fleet` that came meanwhile waited for them: a caller waits for
//! any write readable when it came. Folded ahead, the runs are not
//! readable until the answer with them is kept: a caller meanwhile gets the
//! answer without them at once, and the job's runs reach the fleet history
//! that much after its end. Only a big job's: at [`AHEAD_OVER_RUNS`] runs
//! and fewer the fold is tens of milliseconds, and the runs are written
//! with the job's end, so that the next `gpuctl fleet` has them.

use std::time::Instant;

use tokio::task::JoinHandle;
use tracing::debug;

use super::{lock, Inner, Kept};
use crate::history;
use crate::store::{Batch, SharedBatch, Since};

/// A job's runs are folded in ahead past this many (nodes).
pub const AHEAD_OVER_RUNS: usize = 1024;

impl super::FleetView {
    /// Queues job `job`'s runs to the store as [`history::store_runs`]
    /// does; past [`AHEAD_OVER_RUNS`], folded into the kept answer first
    /// when one is kept, on a task of their own (which this returns). Runs
    /// are queued in the order they come here.
    pub fn store_runs(&self, job: &str, runs: Batch) -> Option<JoinHandle<()>> {
        if runs.is_empty() {
            return None;
        }
        let inner = &self.0;
        let small = runs.len() <= inner.ahead_over;
        let idle = small || inner.kept.try_lock().is_ok_and(|k| k.is_none());
        let rt = tokio::runtime::Handle::try_current();
        // A small job's, or no answer kept nor being made: written now, the
        // runs are readable with the job's end (after any queued ahead).
        match rt {
            Ok(rt) if !idle || !lock(&inner.ahead).is_empty() => {
                lock(&inner.ahead).push_back((job.to_string(), SharedBatch::new(runs)));
                let inner = inner.clone();
                Some(rt.spawn(async move { inner.fold_ahead().await }))
            }
            _ => {
                history::store_runs(&inner.store, job, runs);
                None
            }
        }
    }
}

impl Inner {
    /// The oldest runs handed to [`super::FleetView::store_runs`], folded
    /// into the kept answer and queued; the answer with them kept as they
    /// become readable. When nothing is kept, or writes are waiting to be
    /// folded in, they are only queued, and callers fold them as before.
    async fn fold_ahead(&self) {
        let mut kept = self.kept.lock().await;
        let Some((job, runs)) = lock(&self.ahead).pop_front() else {
            return;
        };
        let ready = kept
            .as_ref()
            .is_some_and(|k| self.store.history_version() == k.built.version);
        if !ready {
            history::done_when_stored(&self.store, &job, self.store.queue_later_shared(runs));
            return;
        }
        let started = Instant::now();
        let Kept {
            built,
            fold,
            previous: older,
        } = kept.take().expect("a kept answer");
        super::let_go(older);
        let pack = built.packs();
        let writes = runs.history_writes();
        let n = writes.len();
        let folded = match self.fold_in(fold, writes).await {
            Ok(Ok(fold)) => Some(fold),
            Ok(Err(why)) => {
                debug!(why = %why.0, "a job's runs not folded in ahead: built afresh");
                None
            }
            Err(e) => {
                debug!("a job's runs not folded in ahead: {e}");
                None
            }
        };
        // The rows made while callers still take the answer before.
        let made_ahead = match folded {
            Some(fold) => self.rows_apart(fold, pack).await.ok(),
            None => None,
        };
        let (durable, since) = self.store.queue_later_folded(runs, built.version);
        history::done_when_stored(&self.store, &job, durable);
        let ((mut next, fold), version) = match (made_ahead, since) {
            (Some(ahead), Since::Writes(version, others)) if others.is_empty() => (ahead, version),
            // Written by someone else between the check and the queue (rare):
            // folded in after them, while callers wait.
            (Some((_, fold)), Since::Writes(version, others)) => {
                match self.fold_in(fold, others).await {
                    Ok(Ok(fold)) => match self.rows_apart(fold, pack).await {
                        Ok(again) => (again, version),
                        Err(_) => return self.keep(&mut kept, None),
                    },
                    _ => return self.keep(&mut kept, None),
                }
            }
            // Not folded, or past what the log keeps (what else was written
            // is not known): the next caller builds afresh.
            _ => return self.keep(&mut kept, None),
        };
        next.version = version;
        let ms = started.elapsed().as_millis() as u64;
        debug!(writes = n, ms, "fleet view: a job's runs folded in ahead");
        let previous = built.listed().then_some(built);
        self.keep(
            &mut kept,
            Some(Kept {
                built: std::sync::Arc::new(next),
                fold,
                previous,
            }),
        );
    }
}

#[cfg(test)]
mod tests;

//! What a rank had measured when it was stopped. A pattern that measures in
//! rounds keeps its figures here as each round ends ([`keep`]); when the
//! agent stops the worker (SIGTERM: the job failed or was cancelled), the
//! SIGTERM watcher sends them to the coordinator as a partial result
//! ([`send`]) before the process dies, so links measured before a failure
//! stay in the report and the history.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuctl_proto::pb::{rank_result::Detail, RankResult};

use crate::client::CoordinatorClient;

struct Slot {
    client: Arc<CoordinatorClient>,
    /// The rank's result as it stood before the work began (who, where).
    base: RankResult,
    detail: Option<Detail>,
}

static SLOT: Mutex<Option<Slot>> = Mutex::new(None);

/// Arms the slot for this process's rank; nothing is sent until a pattern
/// keeps something.
pub fn arm(client: Arc<CoordinatorClient>, base: RankResult) {
    *SLOT.lock().unwrap_or_else(|e| e.into_inner()) = Some(Slot {
        client,
        base,
        detail: None,
    });
}

/// Replaces what the rank has measured so far.
pub fn keep(detail: Detail) {
    if let Some(s) = SLOT.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        s.detail = Some(detail);
    }
}

/// What was kept so far, if anything.
pub fn kept() -> Option<Detail> {
    SLOT.lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|s| s.detail.clone())
}

/// Forgets it: the rank's whole result went the usual way.
pub fn clear() {
    if let Some(s) = SLOT.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        s.detail = None;
    }
}

/// Sends what was kept, once, as a partial result; at most `budget` (the
/// agent's SIGKILL follows a SIGTERM within seconds). Nothing kept: nothing sent.
pub fn send(budget: Duration) {
    let Some(slot) = SLOT.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        return;
    };
    let Some(detail) = slot.detail else {
        return;
    };
    let result = RankResult {
        ok: false,
        partial: true,
        error: "stopped before its end (SIGTERM); the figures it measured until then".into(),
        detail: Some(detail),
        ..slot.base
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let client = slot.client;
    std::thread::spawn(move || {
        let _ = tx.send(client.report_result(result));
    });
    match rx.recv_timeout(budget) {
        Ok(Ok(_)) => eprintln!("gpuctl-worker: SIGTERM: sent the figures measured so far"),
        Ok(Err(e)) => {
            eprintln!("gpuctl-worker: SIGTERM: could not send the figures measured so far: {e:#}")
        }
        Err(_) => {
            eprintln!("gpuctl-worker: SIGTERM: the figures measured so far were not taken in time")
        }
    }
}

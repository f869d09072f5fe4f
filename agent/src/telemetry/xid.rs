//! XID errors as they happen: an NVML event set with the critical-XID event
//! of every GPU, waited on by one blocking thread. Each XID goes into its
//! GPU's pending list, which the next telemetry reading takes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use tokio_util::sync::CancellationToken;

/// Waits are this long, so that the thread notices shutdown promptly.
const WAIT_MS: u32 = 500;
/// XIDs kept per GPU between two readings (a storm must not grow memory).
const MAX_PENDING: usize = 256;

#[derive(Debug, Default)]
struct GpuXids {
    pending: Vec<u32>,
    last: Option<u32>,
    count: u64,
}

/// XIDs per NVML index.
#[derive(Debug, Default)]
pub struct XidLog {
    by_gpu: Mutex<HashMap<u32, GpuXids>>,
}

impl XidLog {
    pub fn record(&self, index: u32, xid: u32) {
        let mut m = self.by_gpu.lock().unwrap();
        let g = m.entry(index).or_default();
        if g.pending.len() < MAX_PENDING {
            g.pending.push(xid);
        }
        g.last = Some(xid);
        g.count += 1;
    }

    /// (XIDs since the last call, the last XID ever, how many ever).
    pub fn take(&self, index: u32) -> (Vec<u32>, Option<u32>, u64) {
        let mut m = self.by_gpu.lock().unwrap();
        match m.get_mut(&index) {
            Some(g) => (std::mem::take(&mut g.pending), g.last, g.count),
            None => (Vec::new(), None, 0),
        }
    }
}

/// Starts the listener thread; returns false (after one log line) when no
/// GPU supports XID events.
pub fn spawn_xid_listener(
    nvml: Arc<Nvml>,
    gpus: Vec<u32>,
    log: Arc<XidLog>,
    shutdown: CancellationToken,
) -> bool {
    let spawned = std::thread::Builder::new()
        .name("nvml-xid".into())
        .spawn(move || listen(&nvml, &gpus, &log, &shutdown));
    match spawned {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!("cannot start the XID listener thread: {e}");
            false
        }
    }
}

fn listen(nvml: &Nvml, gpus: &[u32], log: &XidLog, shutdown: &CancellationToken) {
    let mut set = match nvml.create_event_set() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(
                "XID events unavailable (NVML event set: {e}); XIDs will not be reported"
            );
            return;
        }
    };
    let mut watched = 0;
    for &index in gpus {
        let Ok(d) = nvml.device_by_index(index) else {
            continue;
        };
        let supported = d
            .supported_event_types()
            .map(|t| t.contains(EventTypes::CRITICAL_XID_ERROR))
            .unwrap_or(false);
        if !supported {
            tracing::info!(gpu = index, "GPU does not report XID events");
            continue;
        }
        // A failed registration frees the set: then give up (logged once).
        set = match d.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(
                    gpu = index,
                    "cannot watch XID events ({e}); XIDs will not be reported"
                );
                return;
            }
        };
        watched += 1;
    }
    if watched == 0 {
        tracing::info!("no GPU reports XID events; XIDs will not be reported");
        return;
    }
    tracing::info!(gpus = watched, "watching XID events");
    let mut errors = 0u32;
    while !shutdown.is_cancelled() {
        match set.wait(WAIT_MS) {
            Ok(ev) => {
                errors = 0;
                if !ev.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                    continue;
                }
                let xid = match ev.event_data {
                    Some(XidError::Value(v)) => v as u32,
                    _ => 0,
                };
                let index = ev.device.index().unwrap_or(u32::MAX);
                tracing::warn!(gpu = index, xid, "XID error");
                log.record(index, xid);
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                // E.g. a GPU fallen off the bus: say it once, then slow down.
                errors += 1;
                if errors == 1 {
                    tracing::warn!("waiting for XID events failed: {e}");
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
    let _ = set.release_events();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_xids_are_taken_once_and_last_is_kept() {
        let log = XidLog::default();
        assert_eq!(log.take(0), (vec![], None, 0));
        log.record(0, 79);
        log.record(0, 48);
        log.record(1, 13);
        assert_eq!(log.take(0), (vec![79, 48], Some(48), 2));
        assert_eq!(log.take(0), (vec![], Some(48), 2));
        assert_eq!(log.take(1), (vec![13], Some(13), 1));
        for _ in 0..(MAX_PENDING + 10) {
            log.record(2, 31);
        }
        let (p, _, n) = log.take(2);
        assert_eq!((p.len(), n), (MAX_PENDING, MAX_PENDING as u64 + 10));
    }
}

//! One phase of a run (register, idle, long job, short jobs): the
//! coordinator's CPU, memory, faults and store size sampled through it, and
//! the CLI latencies seen meanwhile, summed up as [`PhaseFigures`]. Apart
//! from the run, which only says when a phase begins and ends.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::calls::{percentile, Latencies, DECODE};
use super::coordinator::Coordinator;
use super::figures::PhaseFigures;
use crate::probe;

/// Samples the coordinator's CPU and memory through one phase.
pub(super) struct Phase {
    name: String,
    start: Instant,
    /// `start` on the wall clock, to lay the calls beside the coordinator's log.
    started_unix_ms: u64,
    cpu0: f64,
    sim_cpu0: f64,
    majflt0: u64,
    refaults0: u64,
    rss_max: u64,
    rss_max_at: f64,
    /// The kernel's high-water mark as the phase began: one higher at its
    /// end was set within it.
    hwm0: u64,
    series: Vec<(f64, u64)>,
    watch: Arc<probe::Watch>,
}

impl Phase {
    pub(super) fn begin(
        name: &str,
        pid: u32,
        lat: &Mutex<Latencies>,
        watch: &Arc<probe::Watch>,
    ) -> Phase {
        // What the watch saw before the phase belongs to the one before.
        watch.take();
        {
            let mut l = lat.lock().unwrap();
            l.by_call.clear();
            l.calls.clear();
        }
        Phase {
            name: name.into(),
            start: Instant::now(),
            started_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            cpu0: probe::cpu_seconds(pid).unwrap_or(0.0),
            sim_cpu0: probe::cpu_seconds(std::process::id()).unwrap_or(0.0),
            majflt0: probe::major_faults(pid).unwrap_or(0),
            refaults0: probe::host_file_refaults().unwrap_or(0),
            rss_max: probe::rss_bytes(pid).unwrap_or(0),
            rss_max_at: 0.0,
            hwm0: probe::hwm_bytes(pid).unwrap_or(0),
            series: Vec::new(),
            watch: watch.clone(),
        }
    }

    pub(super) fn sample(&mut self, pid: u32) {
        let rss = probe::rss_bytes(pid).unwrap_or(0);
        let at = self.start.elapsed().as_secs_f64();
        if rss > self.rss_max {
            (self.rss_max, self.rss_max_at) = (rss, at);
        }
        if let Some((peak, when)) = self.watch.take() {
            if peak > self.rss_max {
                let at = when.saturating_duration_since(self.start).as_secs_f64();
                (self.rss_max, self.rss_max_at) = (peak, at);
            }
        }
        if self.series.last().is_none_or(|(t, _)| at - t >= 1.0) {
            self.series.push((at, rss));
        }
    }

    pub(super) fn end(mut self, co: &Coordinator, lat: &Mutex<Latencies>) -> PhaseFigures {
        self.sample(co.pid());
        // Samples 100 ms apart missed a job's end's peak by 5-40 MB at
        // 131,072 ranks; a mark that rose in this phase is its peak.
        // When is not known: the sampled peak's time stays.
        let hwm = probe::hwm_bytes(co.pid()).unwrap_or(0);
        if hwm > self.hwm0 {
            self.rss_max = self.rss_max.max(hwm);
        }
        let secs = self.start.elapsed().as_secs_f64();
        let cpu = probe::cpu_seconds(co.pid()).unwrap_or(0.0) - self.cpu0;
        let sim_cpu = probe::cpu_seconds(std::process::id()).unwrap_or(0.0) - self.sim_cpu0;
        let mut l = lat.lock().unwrap();
        let cli = l
            .by_call
            .iter_mut()
            .map(|(k, v)| {
                let n = v.len();
                let med = gpuctl_core::stats::median(v.clone()).unwrap_or(0.0);
                (k.clone(), (med, percentile(v, 0.99), n))
            })
            .collect();
        let calls: Vec<(String, f64, f64)> = std::mem::take(&mut l.calls)
            .into_iter()
            .map(|(t, name, ms)| {
                let at = t.saturating_duration_since(self.start).as_secs_f64();
                (name, at, ms)
            })
            .collect();
        let mut slowest: Vec<_> = calls.iter().filter(|c| c.0 != DECODE).cloned().collect();
        slowest.sort_by(|a, b| b.2.total_cmp(&a.2));
        slowest.truncate(5);
        PhaseFigures {
            slowest,
            calls,
            started_unix_ms: self.started_unix_ms,
            name: self.name,
            seconds: secs,
            cpu_per_s: cpu / secs.max(1e-9),
            sim_cpu_per_s: sim_cpu / secs.max(1e-9),
            rss_max: self.rss_max,
            rss_max_at: self.rss_max_at,
            rss_series: std::mem::take(&mut self.series),
            rss_end: probe::rss_bytes(co.pid()).unwrap_or(0),
            store_bytes: probe::dir_bytes(&co.dir.join("store")),
            major_faults: probe::major_faults(co.pid())
                .unwrap_or(0)
                .saturating_sub(self.majflt0),
            host_refaults: probe::host_file_refaults()
                .unwrap_or(0)
                .saturating_sub(self.refaults0),
            cli,
        }
    }
}

/// Sleeps `d`, sampling memory each half second.
pub(super) async fn hold(phase: &mut Phase, pid: u32, d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until {
        phase.sample(pid);
        tokio::time::sleep(Duration::from_millis(500).min(until - Instant::now())).await;
    }
}

//! GPU telemetry: one NVML reading per GPU every sample interval.
//!
//! The latest reading of every GPU is kept for `/metrics` (sampled also when
//! the agent is idle); while jobs run on this node's GPUs, each job gets a
//! `TelemetryBatch` with the samples of its own GPUs, sent on the session
//! once per interval. XID errors arrive as NVML events on a blocking thread
//! (`xid`) and go into the next sample of their GPU.
//!
//! Without NVML there is nothing to sample: one log line, no errors.

mod held;
mod links;
pub mod nvml;
mod xid;

pub use nvml::read_gpu;
pub use xid::{spawn_xid_listener, XidLog};

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuctl_core::clock::Clock;
use gpuctl_proto::pb::{GpuSample, TelemetryBatch};
use nvml_wrapper::Nvml;
use tokio_util::sync::CancellationToken;

use crate::workers::Workers;

/// One GPU's reading. `None` where NVML does not answer (the GPU or driver
/// does not support the query): `/metrics` leaves such series out, and the
/// wire sample (`to_sample`) carries 0.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuReading {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub unix_ms: u64,
    /// Percent.
    pub util_gpu: Option<u32>,
    pub util_mem: Option<u32>,
    pub mem_used_bytes: Option<u64>,
    pub mem_free_bytes: Option<u64>,
    pub mem_total_bytes: Option<u64>,
    pub temperature_c: Option<u32>,
    pub power_mw: Option<u32>,
    pub power_limit_mw: Option<u32>,
    pub sm_clock_mhz: Option<u32>,
    pub sm_clock_max_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    /// NVML's clock event (throttle) reasons bitmask.
    pub throttle_reasons: Option<u64>,
    /// NVML's clock-event counters (ns since the driver loaded): software
    /// thermal, hardware thermal and power-brake slowdown.
    pub slowdown_ns: [Option<u64>; 3],
    /// Volatile ECC totals (since the driver loaded).
    pub ecc_corrected: Option<u64>,
    pub ecc_uncorrected: Option<u64>,
    /// Pages retired for multiple single-bit / a double-bit error (pre-Ampere).
    pub retired_sbe: Option<u64>,
    pub retired_dbe: Option<u64>,
    /// Row remapping (Ampere and later).
    pub remapped_correctable: Option<u64>,
    pub remapped_uncorrectable: Option<u64>,
    pub remap_pending: Option<bool>,
    pub remap_failed: Option<bool>,
    pub pcie_gen: Option<u32>,
    pub pcie_width: Option<u32>,
    pub pcie_gen_max: Option<u32>,
    pub pcie_width_max: Option<u32>,
    pub pcie_replays: Option<u64>,
    /// This reading's links as NVML answered them (`links::LinkHistory`
    /// turns them into the counts below).
    pub nvlinks: Option<nvml::NvLinks>,
    /// Links that answered active in this reading.
    pub nvlinks_active: u32,
    /// Links known on the GPU: every link that has answered since the agent
    /// started.
    pub nvlinks_expected: u32,
    /// Links seen active before that now answer inactive.
    pub nvlinks_down: u32,
    /// Known links whose state could not be read this time.
    pub nvlinks_unknown: u32,
    /// Error counters since the agent started, summed link by link over the
    /// growth between two successful reads of that link (`None`: never read).
    pub nvlink_crc_flit: Option<u64>,
    pub nvlink_crc_data: Option<u64>,
    pub nvlink_replay: Option<u64>,
    pub nvlink_recovery: Option<u64>,
    /// XIDs since the previous reading of this GPU.
    pub xids: Vec<u32>,
    /// The last XID this GPU raised since the agent started, and how many.
    pub last_xid: Option<u32>,
    pub xid_count: u64,
}

impl GpuReading {
    /// The wire form. `retired_pages` is the retired pages of both causes, or
    /// on GPUs with row remapping the remapped rows (both kinds).
    pub fn to_sample(&self) -> GpuSample {
        let retired = match (self.retired_sbe, self.retired_dbe) {
            (None, None) => self
                .remapped_correctable
                .unwrap_or(0)
                .saturating_add(self.remapped_uncorrectable.unwrap_or(0)),
            (s, d) => s.unwrap_or(0).saturating_add(d.unwrap_or(0)),
        };
        GpuSample {
            index: self.index,
            uuid: self.uuid.clone(),
            unix_ms: self.unix_ms,
            util_gpu: self.util_gpu.unwrap_or(0) as f64,
            util_mem: self.util_mem.unwrap_or(0) as f64,
            mem_used_bytes: self.mem_used_bytes.unwrap_or(0),
            mem_total_bytes: self.mem_total_bytes.unwrap_or(0),
            temperature_c: self.temperature_c.unwrap_or(0) as f64,
            power_w: self.power_mw.unwrap_or(0) as f64 / 1000.0,
            power_limit_w: self.power_limit_mw.unwrap_or(0) as f64 / 1000.0,
            sm_clock_mhz: self.sm_clock_mhz.unwrap_or(0),
            sm_clock_max_mhz: self.sm_clock_max_mhz.unwrap_or(0),
            mem_clock_mhz: self.mem_clock_mhz.unwrap_or(0),
            throttle_reasons: self.throttle_reasons.unwrap_or(0),
            sw_thermal_slowdown_ns: self.slowdown_ns[0],
            hw_thermal_slowdown_ns: self.slowdown_ns[1],
            power_brake_slowdown_ns: self.slowdown_ns[2],
            ecc_corrected: self.ecc_corrected.unwrap_or(0),
            ecc_uncorrected: self.ecc_uncorrected.unwrap_or(0),
            retired_pages: retired,
            remap_failed: self.remap_failed.unwrap_or(false),
            pcie_gen: self.pcie_gen.unwrap_or(0),
            pcie_width: self.pcie_width.unwrap_or(0),
            pcie_gen_max: self.pcie_gen_max.unwrap_or(0),
            pcie_width_max: self.pcie_width_max.unwrap_or(0),
            pcie_replays: self.pcie_replays.unwrap_or(0),
            nvlinks_active: self.nvlinks_active,
            nvlinks_expected: self.nvlinks_expected,
            nvlinks_down: self.nvlinks_down,
            nvlinks_unknown: self.nvlinks_unknown,
            nvlink_crc_errors: self
                .nvlink_crc_flit
                .unwrap_or(0)
                .saturating_add(self.nvlink_crc_data.unwrap_or(0)),
            nvlink_crc_flit: self.nvlink_crc_flit.unwrap_or(0),
            nvlink_crc_data: self.nvlink_crc_data.unwrap_or(0),
            nvlink_replay: self.nvlink_replay.unwrap_or(0),
            nvlink_recovery: self.nvlink_recovery.unwrap_or(0),
            xids: self.xids.clone(),
        }
    }
}

/// The sampler and its latest readings.
pub struct Telemetry {
    nvml: Option<Arc<Nvml>>,
    /// (NVML index, UUID, model) of every GPU the inventory listed.
    gpus: Vec<(u32, String, String)>,
    latest: Mutex<BTreeMap<u32, GpuReading>>,
    xids: Arc<XidLog>,
    /// Per GPU (NVML index): which links were seen, and their counters.
    links: Mutex<BTreeMap<u32, links::LinkHistory>>,
    /// Stamps the readings. Always the system clock: a reading says when
    /// real GPUs were read, which no test has reason to hold still.
    clock: Clock,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("nvml", &self.nvml.is_some())
            .field("gpus", &self.gpus)
            .finish()
    }
}

impl Telemetry {
    /// `gpus`: (NVML index, UUID, model name) of the GPUs to sample.
    pub fn new(nvml: Option<Arc<Nvml>>, gpus: Vec<(u32, String, String)>) -> Arc<Telemetry> {
        Arc::new(Telemetry {
            nvml,
            gpus,
            latest: Mutex::new(BTreeMap::new()),
            xids: Arc::new(XidLog::default()),
            links: Mutex::new(BTreeMap::new()),
            clock: Clock::system(),
        })
    }

    pub fn has_nvml(&self) -> bool {
        self.nvml.is_some() && !self.gpus.is_empty()
    }

    pub fn xid_log(&self) -> Arc<XidLog> {
        self.xids.clone()
    }

    /// The latest reading of every GPU, by NVML index.
    pub fn latest(&self) -> Vec<GpuReading> {
        self.latest.lock().unwrap().values().cloned().collect()
    }

    /// Stores readings as the latest (tests and the sampling loop).
    pub fn store(&self, readings: &[GpuReading]) {
        let mut latest = self.latest.lock().unwrap();
        for r in readings {
            latest.insert(r.index, r.clone());
        }
    }

    /// Reads every GPU once (blocking NVML calls) and drains their pending
    /// XIDs into the readings.
    pub fn sample_all(&self) -> Vec<GpuReading> {
        let Some(nvml) = &self.nvml else {
            return Vec::new();
        };
        let now = self.clock.now_ms();
        let mut links = self.links.lock().unwrap();
        self.gpus
            .iter()
            .map(|(index, uuid, name)| {
                let mut r = read_gpu(nvml, *index);
                r.uuid = uuid.clone();
                r.name = name.clone();
                r.unix_ms = now;
                links.entry(*index).or_default().apply(&mut r);
                let (xids, last, count) = self.xids.take(*index);
                r.xids = xids;
                r.last_xid = last;
                r.xid_count = count;
                r
            })
            .collect()
    }

    /// Samples every `interval` until `shutdown`; while jobs run on this
    /// node's GPUs, sends each its batch through `workers`' event queue.
    pub async fn run(
        self: Arc<Self>,
        node: String,
        interval: Duration,
        workers: Arc<Workers>,
        pace: Arc<gpuctl_core::pace::Pace>,
        shutdown: CancellationToken,
    ) {
        if !self.has_nvml() {
            tracing::info!("telemetry: no NVML GPU to sample; no GPU samples will be sent");
            return;
        }
        tracing::info!(gpus = self.gpus.len(), interval = ?interval, "telemetry: sampling GPUs through NVML");
        let mut tick = tokio::time::interval(interval.max(Duration::from_millis(100)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut held = held::Held::default();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            let me = self.clone();
            let readings = match tokio::task::spawn_blocking(move || me.sample_all()).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!("telemetry sampling failed: {e}");
                    continue;
                }
            };
            self.store(&readings);
            let running = workers.gpu_jobs();
            let fresh = batches(&node, &readings, &running);
            let now = std::time::Instant::now();
            for batch in held.take(fresh, &running, pace.telemetry_send(), now) {
                for part in gpuctl_core::telemetry_parts::parts(batch) {
                    workers.send_telemetry(part);
                }
            }
        }
    }
}

/// One batch per job, holding the samples of that job's GPUs; jobs none of
/// whose GPUs were read get none.
pub fn batches(
    node: &str,
    readings: &[GpuReading],
    jobs: &[crate::workers::GpuJob],
) -> Vec<TelemetryBatch> {
    jobs.iter()
        .filter_map(|j| {
            let samples: Vec<GpuSample> = readings
                .iter()
                .filter(|r| j.gpus.contains(&r.index))
                .map(GpuReading::to_sample)
                .collect();
            (!samples.is_empty()).then(|| TelemetryBatch {
                node: node.to_string(),
                job_id: j.job_id.clone(),
                attempt: j.attempt,
                samples,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::GpuJob;

    fn reading(index: u32) -> GpuReading {
        GpuReading {
            index,
            uuid: format!("GPU-{index}"),
            power_mw: Some(612_500),
            retired_sbe: None,
            retired_dbe: None,
            remapped_correctable: Some(2),
            remapped_uncorrectable: Some(1),
            nvlink_crc_flit: Some(5),
            nvlink_crc_data: Some(1),
            xids: vec![79],
            ..Default::default()
        }
    }

    #[test]
    fn wire_sample_units_and_sums() {
        let s = reading(3).to_sample();
        assert_eq!(s.power_w, 612.5);
        assert_eq!(
            s.retired_pages, 3,
            "remapped rows when pages are not retired"
        );
        assert_eq!(s.nvlink_crc_errors, 6);
        assert_eq!(s.xids, vec![79]);
        let mut r = reading(3);
        r.retired_sbe = Some(4);
        r.retired_dbe = Some(1);
        assert_eq!(r.to_sample().retired_pages, 5);
    }

    #[test]
    fn each_job_gets_its_own_gpus() {
        let readings = vec![reading(0), reading(1), reading(2)];
        let jobs = vec![
            GpuJob {
                job_id: "a".into(),
                attempt: 1,
                gpus: vec![0, 2],
            },
            GpuJob {
                job_id: "b".into(),
                attempt: 3,
                gpus: vec![1],
            },
            GpuJob {
                job_id: "c".into(),
                attempt: 1,
                gpus: vec![7],
            },
        ];
        let b = batches("n1", &readings, &jobs);
        assert_eq!(b.len(), 2, "job c's GPU was not read");
        assert_eq!(
            b[0].samples.iter().map(|s| s.index).collect::<Vec<_>>(),
            vec![0, 2]
        );
        assert_eq!((b[1].job_id.as_str(), b[1].attempt), ("b", 3));
        assert_eq!(b[1].node, "n1");
    }

    #[test]
    fn without_nvml_nothing_is_sampled() {
        let t = Telemetry::new(None, vec![(0, "GPU-0".into(), "X".into())]);
        assert!(!t.has_nvml());
        assert!(t.sample_all().is_empty());
        t.store(&[reading(1)]);
        assert_eq!(t.latest().len(), 1);
    }
}

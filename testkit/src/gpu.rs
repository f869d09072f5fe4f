//! GPU fixtures: a healthy H200 as telemetry samples it and as an agent
//! registers it. Tests change what they test with struct update syntax,
//! `GpuSample { xids: vec![79], ..gpu::healthy(0) }`, so that what a test
//! sets is what it is about and everything else is a GPU no rule objects to.

use gpuctl_proto::pb::{GpuInfo, GpuSample, TelemetryBatch};

/// An H200's memory as NVML reports it: 143,771 MiB.
pub const MEMORY_BYTES: u64 = 150_754_820_096;

/// NVLinks of an H200 in an HGX board.
pub const NVLINKS: u32 = 18;

/// The UUID fixtures give GPU `index` when no node is named.
pub fn uuid(index: u32) -> String {
    format!("GPU-{index}")
}

/// A healthy H200 at full load, as one telemetry sample: busy, cool,
/// clocked near its maximum (held only by the software power cap, which is
/// a GPU at full power), every PCIe lane and NVLink up, no error counted.
/// Time 0: tests that keep a series set `unix_ms`.
pub fn healthy(index: u32) -> GpuSample {
    GpuSample {
        index,
        uuid: uuid(index),
        util_gpu: 99.0,
        util_mem: 60.0,
        mem_used_bytes: 80 << 30,
        mem_total_bytes: MEMORY_BYTES,
        temperature_c: 65.0,
        power_w: 690.0,
        power_limit_w: 700.0,
        sm_clock_mhz: 1_900,
        sm_clock_max_mhz: 1_980,
        mem_clock_mhz: 3_201,
        // NVML's software power cap: a GPU at its power limit, not held back.
        throttle_reasons: 0x4,
        pcie_gen: 5,
        pcie_width: 16,
        pcie_gen_max: 5,
        pcie_width_max: 16,
        nvlinks_active: NVLINKS,
        nvlinks_expected: NVLINKS,
        ..Default::default()
    }
}

/// A batch of `samples` as node `node` sends it for attempt 1 of `job`.
pub fn batch(node: &str, job: &str, samples: Vec<GpuSample>) -> TelemetryBatch {
    TelemetryBatch {
        node: node.into(),
        job_id: job.into(),
        attempt: 1,
        samples,
    }
}

/// The UUID of GPU `index` of node `node`: one per GPU across a fleet, so
/// that samples and inventory match.
pub fn uuid_on(node: &str, index: u32) -> String {
    format!("GPU-{node}-{index}")
}

/// GPU `index` of node `node` as its agent registers it: an H200 named by
/// [`uuid_on`].
pub fn info(node: &str, index: u32) -> GpuInfo {
    GpuInfo {
        index,
        uuid: uuid_on(node, index),
        name: "NVIDIA H200".into(),
        ..Default::default()
    }
}

/// GPUs `0..count` of node `node`, as [`info`].
pub fn infos(node: &str, count: u32) -> Vec<GpuInfo> {
    (0..count).map(|i| info(node, i)).collect()
}

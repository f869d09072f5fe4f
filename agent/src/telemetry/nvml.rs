//! One NVML reading of one GPU. Every query is best effort: a GPU or driver
//! that does not answer one leaves that field `None`.

use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, RetirementCause, TemperatureSensor,
};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::{Device, Nvml};

use super::GpuReading;

/// NVML's `NVML_NVLINK_MAX_LINKS` (18 on Hopper).
pub const NVLINK_MAX_LINKS: u32 = 18;

/// Reads every telemetry field of the GPU with this NVML index; a GPU that
/// cannot even be opened gives a reading with only its index.
pub fn read_gpu(nvml: &Nvml, index: u32) -> GpuReading {
    let mut r = GpuReading {
        index,
        ..Default::default()
    };
    let Ok(d) = nvml.device_by_index(index) else {
        return r;
    };
    if let Ok(u) = d.utilization_rates() {
        r.util_gpu = Some(u.gpu);
        r.util_mem = Some(u.memory);
    }
    if let Ok(m) = d.memory_info() {
        r.mem_used_bytes = Some(m.used);
        r.mem_free_bytes = Some(m.free);
        r.mem_total_bytes = Some(m.total);
    }
    r.temperature_c = d.temperature(TemperatureSensor::Gpu).ok();
    r.power_mw = d.power_usage().ok();
    r.power_limit_mw = d
        .enforced_power_limit()
        .or_else(|_| d.power_management_limit())
        .ok();
    r.sm_clock_mhz = d.clock_info(Clock::SM).ok();
    r.sm_clock_max_mhz = d.max_clock_info(Clock::SM).ok();
    r.mem_clock_mhz = d.clock_info(Clock::Memory).ok();
    r.throttle_reasons = throttle_reasons_raw(nvml, &d);
    r.slowdown_ns = slowdown_ns(&d);
    r.ecc_corrected = d
        .total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
        .ok();
    r.ecc_uncorrected = d
        .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
        .ok();
    r.retired_sbe = d
        .retired_pages(RetirementCause::MultipleSingleBitEccErrors)
        .ok()
        .map(|p| p.len() as u64);
    r.retired_dbe = d
        .retired_pages(RetirementCause::DoubleBitEccError)
        .ok()
        .map(|p| p.len() as u64);
    if let Some(rows) = remapped_rows(nvml, &d) {
        r.remapped_correctable = Some(rows.correctable);
        r.remapped_uncorrectable = Some(rows.uncorrectable);
        r.remap_pending = Some(rows.pending);
        r.remap_failed = Some(rows.failed);
    }
    r.pcie_gen = d.current_pcie_link_gen().ok();
    r.pcie_width = d.current_pcie_link_width().ok();
    r.pcie_gen_max = d.max_pcie_link_gen().ok();
    r.pcie_width_max = d.max_pcie_link_width().ok();
    r.pcie_replays = d.pcie_replay_counter().ok().map(u64::from);
    r.nvlinks = Some(nvlinks(&d));
    r
}

/// One link's answer in one reading: `None` where the call failed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkReading {
    pub active: Option<bool>,
    pub crc_flit: Option<u64>,
    pub crc_data: Option<u64>,
    pub replay: Option<u64>,
    pub recovery: Option<u64>,
}

/// NVLink state of one GPU: every link index NVML may know, as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvLinks {
    pub links: [LinkReading; NVLINK_MAX_LINKS as usize],
    /// (link, NVML's error) for each state read that failed on a link that
    /// exists: what the agent logs, so a misread can be told from a fault.
    pub errors: Vec<(u32, String)>,
}

impl NvLinks {
    /// Links that answered (active or not).
    pub fn present(&self) -> u32 {
        self.links.iter().filter(|l| l.active.is_some()).count() as u32
    }

    pub fn active(&self) -> u32 {
        self.links.iter().filter(|l| l.active == Some(true)).count() as u32
    }
}

/// Reads every link of `d`. A link whose state call fails is `None`
/// (unknown), never down; its counters are still asked for, since later
/// samples' growth is measured from them.
pub fn nvlinks(d: &Device) -> NvLinks {
    use nvml_wrapper::error::NvmlError;
    let mut n = NvLinks::default();
    for (l, out) in n.links.iter_mut().enumerate() {
        let link = d.link_wrapper_for(l as u32);
        match link.is_active() {
            Ok(a) => out.active = Some(a),
            // No such link on this GPU (or no NVLink at all): its counters
            // would fail too.
            Err(NvmlError::NotSupported | NvmlError::InvalidArg) => continue,
            Err(e) => n.errors.push((l as u32, e.to_string())),
        }
        out.crc_flit = link.error_counter(ErrorCounter::DlCrcFlit).ok();
        out.crc_data = link.error_counter(ErrorCounter::DlCrcData).ok();
        out.replay = link.error_counter(ErrorCounter::DlReplay).ok();
        out.recovery = link.error_counter(ErrorCounter::DlRecovery).ok();
    }
    n
}

/// NVML's clock-event counters, in the order of `GpuReading::slowdown_ns`.
/// The field ids moved between NVML releases; nvml-wrapper maps its ids to
/// the driver's.
fn slowdown_ns(d: &Device) -> [Option<u64>; 3] {
    use nvml_wrapper::enums::device::SampleValue;
    use nvml_wrapper::structs::device::FieldId;
    use nvml_wrapper::sys_exports::field_id::{
        NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN as BRAKE,
        NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN as HW,
        NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN as SW,
    };
    let mut out = [None; 3];
    let Ok(values) = d.field_values_for(&[FieldId(SW), FieldId(HW), FieldId(BRAKE)]) else {
        return out;
    };
    for (slot, v) in out.iter_mut().zip(values) {
        *slot = match v.map(|s| s.value) {
            Ok(Ok(SampleValue::U64(n))) => Some(n),
            Ok(Ok(SampleValue::I64(n))) if n >= 0 => Some(n as u64),
            Ok(Ok(SampleValue::U32(n))) => Some(n as u64),
            _ => None,
        };
    }
    out
}

/// `nvmlDeviceGetCurrentClocksThrottleReasons` through the raw library, so
/// that bits newer than nvml-wrapper's flags are kept.
fn throttle_reasons_raw(nvml: &Nvml, d: &Device) -> Option<u64> {
    let f = nvml
        .lib()
        .nvmlDeviceGetCurrentClocksThrottleReasons
        .as_ref()
        .ok()?;
    let mut reasons: std::os::raw::c_ulonglong = 0;
    // SAFETY: the handle belongs to `nvml`, which outlives the call; the
    // out-pointer is valid.
    let rc = unsafe { f(d.handle(), &mut reasons) };
    (rc == 0).then_some(reasons)
}

#[derive(Debug, Clone, Copy)]
struct RemappedRows {
    correctable: u64,
    uncorrectable: u64,
    pending: bool,
    failed: bool,
}

/// `nvmlDeviceGetRemappedRows` (Ampere and later), which nvml-wrapper 0.13
/// does not wrap. `None` when the GPU or driver does not support it.
fn remapped_rows(nvml: &Nvml, d: &Device) -> Option<RemappedRows> {
    let f = nvml.lib().nvmlDeviceGetRemappedRows.as_ref().ok()?;
    let (mut corr, mut unc, mut pending, mut failed) = (0u32, 0u32, 0u32, 0u32);
    // SAFETY: the handle belongs to `nvml`, which outlives the call; the
    // out-pointers are valid for the call.
    let rc = unsafe { f(d.handle(), &mut corr, &mut unc, &mut pending, &mut failed) };
    (rc == 0).then_some(RemappedRows {
        correctable: corr as u64,
        uncorrectable: unc as u64,
        pending: pending != 0,
        failed: failed != 0,
    })
}

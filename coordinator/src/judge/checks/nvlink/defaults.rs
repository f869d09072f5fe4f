//! The defaults of this family's settings (`--health-rules`, docs/reports.md);
//! `HealthRules::default` reads them.

use crate::judge::checks::Severity;

pub const NVLINK_DOWN_MIN_SAMPLES: u32 = 10;
pub const NVLINK_DOWN: Severity = Severity::Fail;
pub const NVLINK_DOWN_UNCONFIRMED: Severity = Severity::Warn;
// dcgm_gpu_hardware_limits.h, DCGM_LIMIT_MAX_NVLINK_CRC_ERROR:
// "CRC errors only matter at rates of 100+ per second".
pub const NVLINK_CRC_PER_MIN: f64 = 6000.0;
pub const NVLINK_CRC: Severity = Severity::Warn;
pub const NVLINK_CRC_PEER_RATIO: f64 = 10.0;
pub const NVLINK_CRC_PEER_MIN_PER_MIN: f64 = 600.0;
// DCGM_LIMIT_MAX_NVLINK_ERROR (1): any replay or recovery.
pub const NVLINK_REPLAY_LIMIT: u64 = 0;
pub const NVLINK_REPLAY: Severity = Severity::Warn;
pub const NVLINK_RECOVERY_LIMIT: u64 = 0;
pub const NVLINK_RECOVERY: Severity = Severity::Fail;

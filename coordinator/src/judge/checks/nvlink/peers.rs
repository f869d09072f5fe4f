//! `nvlink_crc` among the job's GPUs: the one NVLink rule that needs the
//! other GPUs, a GPU whose CRC errors run far beyond its peers'.

use gpuctl_proto::pb::GpuTelemetrySummary;

use super::counters::nvlink_crc;
use crate::judge::checks::health::rules::HealthRules;
use crate::judge::checks::health::run::{gpu_check, name_gpu, rate_minutes};
use crate::judge::checks::{Check, Phase};
use crate::judge::series::Bucket;

/// NVLink CRC errors a minute over the run (at least a minute, as the rules).
pub fn crc_per_min(t: &Bucket) -> f64 {
    let (first, last) = t.counter_ends();
    nvlink_crc(&first, &last) as f64 / rate_minutes(t)
}

/// `nvlink_crc` for a GPU far above its peers: its rate against the median
/// of the job's other NVLink GPUs. Needs three GPUs to have a median of
/// peers worth the name; a GPU the absolute rule already named is left alone.
pub fn peer_crc(
    rules: &HealthRules,
    summaries: &[GpuTelemetrySummary],
    rates: &[Option<f64>],
    per_gpu: &mut [Vec<Check>],
) {
    let Some(level) = rules.nvlink_crc.level() else {
        return;
    };
    if rates.iter().flatten().count() < 3 {
        return;
    }
    for (i, rate) in rates.iter().enumerate() {
        let Some(rate) = *rate else { continue };
        if rate <= rules.nvlink_crc_peer_min_per_min
            || per_gpu[i].iter().any(|f| f.rule == "nvlink_crc")
        {
            continue;
        }
        let others: Vec<f64> = rates
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .filter_map(|(_, r)| *r)
            .collect();
        let Some(median) = gpuctl_core::stats::median(others) else {
            continue;
        };
        if rate >= rules.nvlink_crc_peer_ratio * median {
            let s = &summaries[i];
            per_gpu[i].push(name_gpu(
                gpu_check(
                    level,
                    "nvlink_crc",
                    format!(
                        "{rate:.0} NVLink CRC errors a minute, {:.1}x the median of the job's other NVLink GPUs ({median:.0}/min; rule: {}x): one GPU's links erring far beyond its peers; check them with `nvidia-smi nvlink -e`",
                        rate / median.max(f64::MIN_POSITIVE),
                        rules.nvlink_crc_peer_ratio
                    ),
                    Phase::Run,
                ),
                &s.node,
                s.index,
                &s.uuid,
            ));
        }
    }
}

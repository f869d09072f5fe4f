//! Figures no device can make: a stress rank reporting more TFLOP/s than its
//! GPU's dense peak for the precision (or than any CPU) sent a corrupt or
//! forged result, and fails as such, named. With a rank's secret, a
//! 999 TFLOP/s result once passed a CPU rank (issue 35).

use std::collections::BTreeMap;

use gpuctl_proto::pb::{rank_result::Detail, RankResult};

use super::ranks::RankStates;

/// Dense peak TFLOP/s per GPU model (NVML's name, a prefix, without regard to
/// case) and precision, at boost clock. NVIDIA's H100 SXM5 / H200 datasheets
/// (2023-2024): fp8 1,979, bf16 and fp16 989, tf32 495, fp32 67 (sparsity
/// doubles the tensor figures; stress runs dense GEMMs).
const PEAKS: &[(&str, &[(&str, f64)])] = &[
    (
        "NVIDIA H100 80GB HBM3",
        &[
            ("fp8", 1979.0),
            ("bf16", 989.4),
            ("fp16", 989.4),
            ("tf32", 494.7),
            ("fp32", 66.9),
        ],
    ),
    (
        "NVIDIA H200",
        &[
            ("fp8", 1979.0),
            ("bf16", 989.4),
            ("fp16", 989.4),
            ("tf32", 494.7),
            ("fp32", 66.9),
        ],
    ),
];

/// Above every GPU listed and unlisted today (B200 fp8 dense: 4,500).
const ANY_GPU: f64 = 10_000.0;
/// Above any CPU a rank runs on (a two-socket server does ~10 TFLOP/s fp32).
const ANY_CPU: f64 = 100.0;
/// Clock and rounding slack over a datasheet's peak.
const SLACK: f64 = 1.02;

/// The most TFLOP/s `device_name` can do at `precision`.
fn peak(device: &str, device_name: &str, precision: &str) -> f64 {
    if device.starts_with("cpu") {
        return ANY_CPU;
    }
    let name = device_name.to_ascii_lowercase();
    PEAKS
        .iter()
        .find(|(model, _)| name.starts_with(&model.to_ascii_lowercase()))
        .and_then(|(_, p)| p.iter().find(|(d, _)| *d == precision))
        .map_or(ANY_GPU, |(_, v)| *v * SLACK)
}

/// Fails every stress rank with a figure over its device's peak.
pub(super) fn stress(results: &BTreeMap<u32, RankResult>, states: &mut RankStates) {
    for (rank, r) in results {
        let Some(Detail::Stress(s)) = &r.detail else {
            continue;
        };
        let most = peak(&r.device, &r.device_name, &s.dtype);
        let top = s
            .tflops_per_interval
            .iter()
            .copied()
            .fold(s.tflops_max, f64::max);
        if top > most || !top.is_finite() {
            if let Some(st) = states.get_mut(rank) {
                st.fail(format!(
                    "impossible figure: {top:.0} TFLOP/s {} on {} is above what the device can do ({most:.0}): the result is corrupt or was not made by this GPU",
                    s.dtype,
                    if r.device_name.is_empty() { &r.device } else { &r.device_name }
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peaks_bound_gpus_by_model_and_cpus_by_any() {
        assert!((peak("cuda:0", "NVIDIA H100 80GB HBM3", "bf16") - 1009.2).abs() < 0.1);
        assert!(peak("cuda:0", "NVIDIA H200", "fp32") < 70.0);
        assert_eq!(peak("cuda:0", "NVIDIA B200", "bf16"), ANY_GPU);
        assert_eq!(peak("cpu", "Test CPU", "fp32"), ANY_CPU);
        // Healthy figures measured on H100s (docs/benchmarks.md): 669-681 bf16.
        assert!(681.0 < peak("cuda:3", "NVIDIA H100 80GB HBM3", "bf16"));
    }
}

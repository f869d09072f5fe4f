//! Model FLOPs utilisation (MFU) of a training rank: the FLOPs its model
//! needs at the rate it trained, against its GPU's dense peak for the
//! compute type. One table of peaks and one FLOPs count, so that the report
//! and the benchmarks reckon it the same way.
//!
//! FLOPs per token of a GPT, forward and backward: 6·N + 12·L·d·T (PaLM,
//! Chowdhery et al. 2022, appendix B; nanoGPT's `estimate_mfu`), N the
//! trainable parameters (the tied token embedding counted once: the output
//! projection uses it), L layers, d width, T the sequence length; the
//! second term is attention's score and value products. Activation
//! recomputation is not counted (model FLOPs, not hardware FLOPs). The
//! vision models' FLOPs hang on every layer's shape and are not counted
//! here: their MFU is unknown, never guessed.

use crate::catalogue::gpt_shape;

/// Dense (no sparsity) tensor-core peak of `device_name` (as NVML names it)
/// for a training `precision`, in TFLOP/s; `None` for a GPU or precision
/// not in the table. Sources: NVIDIA's H100 datasheet (SXM5 and PCIe, H100
/// NVL), H200 datasheet (SXM and NVL: H200 SXM's tensor cores are H100
/// SXM5's), A100 datasheet; the datasheets give sparse figures, halved here.
pub fn peak_tflops(device_name: &str, precision: &str) -> Option<f64> {
    // (bf16 / fp16, tf32, fp32)
    let (half, tf32, fp32) = if device_name.contains("H200 NVL") || device_name.contains("H100 NVL")
    {
        (835.5, 417.5, 60.0)
    } else if device_name.contains("H100 PCIe") {
        (756.5, 378.0, 51.2)
    } else if device_name.contains("H100") || device_name.contains("H200") {
        (989.4, 494.7, 66.9)
    } else if device_name.contains("A100") {
        (312.0, 156.0, 19.5)
    } else {
        return None;
    };
    match precision {
        "bf16" | "fp16" => Some(half),
        "tf32" => Some(tf32),
        "fp32" => Some(fp32),
        _ => None,
    }
}

/// Training FLOPs per token of GPT size `size` with `parameters` trainable
/// parameters at sequence length `seq_len`.
pub fn gpt_flops_per_token(size: &str, parameters: u64, seq_len: u64) -> Option<f64> {
    let s = gpt_shape(size)?;
    Some(6.0 * parameters as f64 + 12.0 * (s.layers * s.dim * seq_len) as f64)
}

/// MFU (0..1, may pass 1 where the peak table is wrong) of a rank that
/// trained `tokens_per_s` at `flops_per_token`, against `peak_tflops`.
pub fn mfu(tokens_per_s: f64, flops_per_token: f64, peak_tflops: f64) -> f64 {
    tokens_per_s * flops_per_token / (peak_tflops * 1e12)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peaks_are_the_datasheets_dense_figures_and_unknown_gpus_have_none() {
        assert_eq!(peak_tflops("NVIDIA H100 80GB HBM3", "bf16"), Some(989.4));
        assert_eq!(peak_tflops("NVIDIA H200", "fp16"), Some(989.4));
        assert_eq!(peak_tflops("NVIDIA H100 PCIe", "bf16"), Some(756.5));
        assert_eq!(peak_tflops("NVIDIA H200 NVL", "tf32"), Some(417.5));
        assert_eq!(peak_tflops("NVIDIA A100-SXM4-80GB", "fp32"), Some(19.5));
        assert_eq!(peak_tflops("NVIDIA GeForce RTX 4090", "bf16"), None);
        assert_eq!(peak_tflops("NVIDIA H200", "fp8"), None);
        assert_eq!(peak_tflops("", "bf16"), None, "a CPU rank");
    }

    #[test]
    fn a_gpt_1_3b_at_issue_49s_rate_is_two_fifths_of_an_h200() {
        // 1.3B at seq 1024: 6N ≈ 7.88 GFLOP and attention 0.60 GFLOP a token;
        // 45,949 tok/s was gpuctl fsdp's on 2 x H200.
        let f = gpt_flops_per_token("1.3b", 1_313_722_368, 1024).unwrap();
        assert!((f / 1e9 - 8.486).abs() < 0.001, "{f}");
        let m = mfu(45_949.0, f, 989.4);
        assert!((m - 0.3941).abs() < 0.001, "{m}");
        assert_eq!(gpt_flops_per_token("resnet50", 25_000_000, 1024), None);
    }
}

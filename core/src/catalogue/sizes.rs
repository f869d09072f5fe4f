//! How big the trainable models are: parameter counts (what the planner's
//! memory check weighs) and the per-rank batch a job gets without
//! `--batch-size`. GPT's count hangs on `--gpt-size` and `--seq-len`; the
//! vision models' counts are torchvision's with 1000 classes.

/// A GPT size: vocabulary (padded to a multiple of 64), width, layers, heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GptShape {
    pub vocab: u64,
    pub dim: u64,
    pub layers: u64,
    pub heads: u64,
}

/// The shape of each of `GPT_SIZES`; `None` for a word not among them.
pub fn gpt_shape(size: &str) -> Option<GptShape> {
    let (vocab, dim, layers, heads) = match size {
        "toy" => (256, 64, 2, 4),
        "124m" => (50304, 768, 12, 12),
        "350m" => (50304, 1024, 24, 16),
        "1.3b" => (50304, 2048, 24, 16),
        "2.7b" => (50304, 2560, 32, 32),
        _ => return None,
    };
    Some(GptShape {
        vocab,
        dim,
        layers,
        heads,
    })
}

/// One transformer block: two layer norms (2d each), qkv (3d² + 3d),
/// projection (d² + d), MLP (4d² + 4d and 4d² + d): 12d² + 13d.
pub fn gpt_block_parameters(size: &str) -> Option<u64> {
    let d = gpt_shape(size)?.dim;
    Some(12 * d * d + 13 * d)
}

/// All of GPT's: the blocks, token and learned position embeddings
/// ((V + T)·d, the output layer tied to the token embedding) and the final
/// layer norm (2d).
pub fn gpt_parameters(size: &str, seq_len: u64) -> Option<u64> {
    let s = gpt_shape(size)?;
    let blocks = s.layers * gpt_block_parameters(size)?;
    Some(blocks + (s.vocab + seq_len) * s.dim + 2 * s.dim)
}

/// Trainable parameters of a model with 1000 classes (torchvision's counts),
/// where they do not hang on the job's parameters (`gpt`'s do:
/// `ModelParams::parameters`; `cnn` is too small to matter).
pub fn model_parameters(model: &str) -> Option<u64> {
    match model {
        "resnet18" => Some(11_689_512),
        "resnet50" => Some(25_557_032),
        "resnet101" => Some(44_549_160),
        "resnet152" => Some(60_192_808),
        "mobilenet_v2" => Some(3_504_872),
        _ => None,
    }
}

/// A model as reports name it: `gpt 1.3b` for a GPT with its size, the
/// bare name otherwise (other models, or a result that carries no size).
pub fn model_label(model: &str, variant: &str) -> String {
    if variant.is_empty() {
        model.to_string()
    } else {
        format!("{model} {variant}")
    }
}

/// The size a model's results carry as their variant: GPT's size, nothing
/// for the others.
pub fn model_variant<'a>(model: &str, gpt_size: &'a str) -> &'a str {
    if model == "gpt" {
        gpt_size
    } else {
        ""
    }
}

/// A sensible per-rank batch for the model on this kind of device.
///
/// GPT's hangs on its size and is chosen to fit an 80 GB GPU at seq_len 1024
/// with bf16 compute: ddp of 124m and 350m, fsdp of 1.3b and 2.7b on 2 GPUs
/// (activations dominate: about 1 GB a layer for 350m at batch 8, 1.2 GB for
/// 1.3b at batch 8 and 1 GB for 2.7b at batch 4, without flash attention).
/// On a CPU, the toy takes 4 and the real sizes 2 (they are slow there).
pub fn default_batch(model: &str, gpt_size: &str, gpu: bool) -> u64 {
    match (model, gpu) {
        ("gpt", true) => match gpt_size {
            "350m" | "1.3b" => 8,
            "2.7b" => 4,
            _ => 16,
        },
        ("gpt", false) if gpt_size == "toy" => 4,
        ("gpt", false) => 2,
        ("cnn", true) => 1024,
        ("cnn", false) => 8,
        ("resnet18" | "resnet50" | "mobilenet_v2", true) => 256,
        (_, true) => 128,
        (_, false) => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue::GPT_SIZES;

    #[test]
    fn gpt_sizes_have_their_published_parameter_counts() {
        // GPT-2 small with a 50304 vocabulary and 1024 positions: 124.5M
        // (GPT-2's 124.4M with 50257 tokens).
        assert_eq!(gpt_parameters("124m", 1024), Some(124_475_904));
        let near = |size, want: f64| {
            let got = gpt_parameters(size, 1024).unwrap() as f64 / 1e9;
            assert!((got - want).abs() < 0.01, "{size}: {got}");
        };
        near("350m", 0.355);
        near("1.3b", 1.314);
        near("2.7b", 2.651);
        // The toy: 2 blocks of 64 wide, 256 tokens and 32 positions.
        assert_eq!(
            gpt_parameters("toy", 32),
            Some(2 * (12 * 64 * 64 + 13 * 64) + 288 * 64 + 128)
        );
        // Every size the catalogue offers has a shape, and only those.
        assert!(GPT_SIZES.iter().all(|s| gpt_shape(s).is_some()));
        assert_eq!(gpt_shape("7b"), None);
        // More positions, more parameters.
        assert!(gpt_parameters("124m", 2048) > gpt_parameters("124m", 1024));
    }

    #[test]
    fn default_batches_shrink_as_gpt_grows() {
        let gpu: Vec<u64> = GPT_SIZES
            .iter()
            .map(|s| default_batch("gpt", s, true))
            .collect();
        assert_eq!(gpu, [16, 16, 8, 8, 4]);
        assert_eq!(default_batch("gpt", "toy", false), 4);
        assert_eq!(default_batch("gpt", "1.3b", false), 2);
        assert_eq!(model_label("gpt", model_variant("gpt", "1.3b")), "gpt 1.3b");
        assert_eq!(
            model_label("resnet50", model_variant("resnet50", "1.3b")),
            "resnet50"
        );
        // Other models ignore the size.
        assert_eq!(default_batch("resnet50", "2.7b", true), 256);
    }
}

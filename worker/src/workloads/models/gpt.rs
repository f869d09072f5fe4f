//! A GPT-2 style decoder: token and learned position embeddings, `layers`
//! pre-LayerNorm blocks of causal self-attention
//! (`scaled_dot_product_attention`, flash/memory-efficient kernels on a GPU)
//! and a 4× GELU MLP, a final LayerNorm and an output layer tied to the token
//! embedding. Sizes by name ([`GptConfig::sized`]): `124m` is GPT-2 small
//! (vocabulary padded to 50304), `350m`, `1.3b` and `2.7b` GPT-2/3 shapes
//! where parameters matter (fsdp), `toy` one that runs on a CPU.

use anyhow::{bail, Result};
use tch::{nn, Kind, Tensor};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GptConfig {
    pub vocab: i64,
    pub dim: i64,
    pub layers: i64,
    pub heads: i64,
    pub seq_len: i64,
}

impl GptConfig {
    /// The model of size `size` (one of `GPT_SIZES`: toy, 124m, 350m, 1.3b,
    /// 2.7b) with `seq_len` learned positions.
    pub fn sized(size: &str, seq_len: i64) -> Result<Self> {
        let Some(s) = gpuctl_core::catalogue::gpt_shape(size) else {
            bail!(
                "gpt size `{size}` is not one of {}",
                gpuctl_core::catalogue::GPT_SIZES.join(", ")
            );
        };
        Ok(GptConfig {
            vocab: s.vocab as i64,
            dim: s.dim as i64,
            layers: s.layers as i64,
            heads: s.heads as i64,
            seq_len,
        })
    }

    /// GPT-2 small, size `124m`: 12 layers, 768 wide, 12 heads (default
    /// seq_len 1024).
    pub fn gpu(seq_len: i64) -> Self {
        Self::sized("124m", seq_len).expect("124m is a size")
    }

    /// The `toy` size: 2 layers, 64 wide, 4 heads, 256 tokens (default
    /// seq_len 32).
    pub fn cpu(seq_len: i64) -> Self {
        Self::sized("toy", seq_len).expect("toy is a size")
    }
}

struct Block {
    ln1: (Tensor, Tensor),
    qkv: (Tensor, Tensor),
    proj: (Tensor, Tensor),
    ln2: (Tensor, Tensor),
    fc: (Tensor, Tensor),
    out: (Tensor, Tensor),
}

pub struct Gpt {
    cfg: GptConfig,
    wte: Tensor,
    wpe: Tensor,
    blocks: Vec<Block>,
    lnf: (Tensor, Tensor),
}

fn linear(p: &nn::Path, name: &str, d_in: i64, d_out: i64, std: f64) -> (Tensor, Tensor) {
    let p = p / name;
    (
        p.var(
            "weight",
            &[d_out, d_in],
            nn::Init::Randn {
                mean: 0.0,
                stdev: std,
            },
        ),
        p.var("bias", &[d_out], nn::Init::Const(0.0)),
    )
}

fn layer_norm(p: &nn::Path, name: &str, d: i64) -> (Tensor, Tensor) {
    let p = p / name;
    (
        p.var("weight", &[d], nn::Init::Const(1.0)),
        p.var("bias", &[d], nn::Init::Const(0.0)),
    )
}

fn ln(x: &Tensor, (w, b): &(Tensor, Tensor), d: i64) -> Result<Tensor> {
    Ok(x.f_layer_norm([d], Some(w), Some(b), 1e-5, true)?)
}

fn lin(x: &Tensor, (w, b): &(Tensor, Tensor)) -> Result<Tensor> {
    Ok(x.f_linear(w, Some(b))?)
}

impl Gpt {
    pub fn new(p: &nn::Path, cfg: GptConfig) -> Result<Self> {
        if cfg.dim % cfg.heads != 0 {
            bail!(
                "gpt: width {} does not divide into {} heads",
                cfg.dim,
                cfg.heads
            );
        }
        let d = cfg.dim;
        let std = 0.02;
        let proj_std = 0.02 / (2.0 * cfg.layers as f64).sqrt();
        let wte = p.var(
            "wte",
            &[cfg.vocab, d],
            nn::Init::Randn {
                mean: 0.0,
                stdev: std,
            },
        );
        let wpe = p.var(
            "wpe",
            &[cfg.seq_len, d],
            nn::Init::Randn {
                mean: 0.0,
                stdev: std,
            },
        );
        let blocks = (0..cfg.layers)
            .map(|i| {
                let b = p / "h" / i;
                Block {
                    ln1: layer_norm(&b, "ln1", d),
                    qkv: linear(&b, "qkv", d, 3 * d, std),
                    proj: linear(&b, "proj", d, d, proj_std),
                    ln2: layer_norm(&b, "ln2", d),
                    fc: linear(&b, "fc", d, 4 * d, std),
                    out: linear(&b, "out", 4 * d, d, proj_std),
                }
            })
            .collect();
        let lnf = layer_norm(p, "lnf", d);
        Ok(Gpt {
            cfg,
            wte,
            wpe,
            blocks,
            lnf,
        })
    }

    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    /// The unit of a variable by its name: `h.K.…` is block K's (unit K+1),
    /// the rest (embeddings, final LayerNorm) the root's.
    pub fn unit_of(&self, name: &str) -> usize {
        name.strip_prefix("h.")
            .and_then(|r| r.split('.').next())
            .and_then(|k| k.parse::<usize>().ok())
            .map(|k| k + 1)
            .unwrap_or(0)
    }

    /// Token and position embeddings of `tokens` `[batch, seq]`.
    pub fn embed(&self, tokens: &Tensor) -> Result<Tensor> {
        let (_, t) = tokens.size2()?;
        if t > self.cfg.seq_len {
            bail!(
                "gpt: {t} tokens but the model has {} positions",
                self.cfg.seq_len
            );
        }
        let pos = Tensor::f_arange(t, (Kind::Int64, tokens.device()))?;
        Ok(Tensor::f_embedding(&self.wte, tokens, -1, false, false)?
            .f_add(&Tensor::f_embedding(&self.wpe, &pos, -1, false, false)?)?)
    }

    /// Block `k` on `x` `[batch, seq, dim]`.
    pub fn block(&self, k: usize, x: &Tensor) -> Result<Tensor> {
        let (b, t, _) = x.size3()?;
        let (d, h) = (self.cfg.dim, self.cfg.heads);
        let blk = &self.blocks[k];
        let a = ln(x, &blk.ln1, d)?;
        // unbind, not three selects: backward then stacks the three
        // gradients into the projection's layout in one kernel, where each
        // select's backward zero-filled a whole qkv-sized tensor, copied its
        // third in and autograd added the three (about 4 ms of a GPT-1.3B
        // step on an H200, docs/benchmarks.md).
        let qkv = lin(&a, &blk.qkv)?
            .f_view([b, t, 3, h, d / h])?
            .f_unbind(2)?;
        let head_major = |x: &Tensor| x.f_transpose(1, 2);
        let (q, k, v) = (
            head_major(&qkv[0])?,
            head_major(&qkv[1])?,
            head_major(&qkv[2])?,
        );
        let y = Tensor::f_scaled_dot_product_attention::<Tensor>(
            &q, &k, &v, None, 0.0, true, None, false,
        )?
        .f_transpose(1, 2)?
        .f_reshape([b, t, d])?;
        let x = x.f_add(&lin(&y, &blk.proj)?)?;
        let m = lin(&ln(&x, &blk.ln2, d)?, &blk.fc)?.f_gelu("tanh")?;
        Ok(x.f_add(&lin(&m, &blk.out)?)?)
    }

    /// Logits `[batch, seq, vocab]` from the last block's output.
    pub fn head(&self, x: &Tensor) -> Result<Tensor> {
        let x = ln(x, &self.lnf, self.cfg.dim)?;
        Ok(x.f_linear::<Tensor>(&self.wte, None)?)
    }
}

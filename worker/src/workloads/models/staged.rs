//! Vision models in stages: a stem, residual (or plain) blocks and a head,
//! each a closure over its layers, so that training can run them (and their
//! backward) one at a time. The layers are tch's `nn` layers, built by tch's
//! own constructors (same variable names, same initialisation, in the same
//! order as tch's `vision` models, so a seed gives the same values), with
//! forwards of our own that call the same ops through `f_*`, so that an
//! out-of-memory comes back as an `Err` rather than a panic.
//!
//! Always in train mode, as the training workloads want: BatchNorm normalises
//! with the batch's statistics and updates its running statistics (which are
//! not trainable and belong to no unit).

use anyhow::{bail, Result};
use tch::{nn, Tensor};

/// One stage: its input to its output.
pub type Stage = Box<dyn Fn(&Tensor) -> Result<Tensor> + Send>;

/// A convolution without padding modes (zeros only) and a dilation of 1.
pub struct Conv {
    ws: Tensor,
    bs: Option<Tensor>,
    stride: i64,
    padding: i64,
    groups: i64,
}

/// Geometry of a square convolution: kernel, stride, padding, groups.
#[derive(Clone, Copy)]
pub struct Geom {
    pub k: i64,
    pub stride: i64,
    pub padding: i64,
    pub groups: i64,
}

impl Geom {
    /// A `k`×`k` kernel with `stride`, padding `pad`, no groups.
    pub fn new(k: i64, stride: i64, pad: i64) -> Self {
        Geom {
            k,
            stride,
            padding: pad,
            groups: 1,
        }
    }
}

/// `nn::conv2d` (tch's default initialisation), with or without a bias.
pub fn conv(p: nn::Path, c_in: i64, c_out: i64, g: Geom, bias: bool) -> Conv {
    let cfg = nn::ConvConfig {
        stride: g.stride,
        padding: g.padding,
        groups: g.groups,
        bias,
        ..Default::default()
    };
    let c = nn::conv2d(p, c_in, c_out, g.k, cfg);
    Conv {
        ws: c.ws,
        bs: c.bs,
        stride: g.stride,
        padding: g.padding,
        groups: g.groups,
    }
}

impl Conv {
    pub fn f(&self, x: &Tensor) -> Result<Tensor> {
        let (s, p) = (self.stride, self.padding);
        Ok(x.f_conv2d(
            &self.ws,
            self.bs.as_ref(),
            [s, s],
            [p, p],
            [1, 1],
            self.groups,
        )?)
    }
}

/// `nn::batch_norm2d` with tch's defaults (eps 1e-5, momentum 0.1, cuDNN on).
pub struct Bn(nn::BatchNorm);

pub fn bn(p: nn::Path, c: i64) -> Bn {
    Bn(nn::batch_norm2d(p, c, Default::default()))
}

impl Bn {
    /// Train mode: the batch's statistics, running statistics updated.
    pub fn f(&self, x: &Tensor) -> Result<Tensor> {
        let b = &self.0;
        Ok(Tensor::f_batch_norm(
            x,
            b.ws.as_ref(),
            b.bs.as_ref(),
            Some(&b.running_mean),
            Some(&b.running_var),
            true,
            0.1,
            1e-5,
            true,
        )?)
    }
}

/// `nn::linear` with tch's defaults (bias on).
pub struct Lin(nn::Linear);

pub fn lin(p: nn::Path, d_in: i64, d_out: i64) -> Lin {
    Lin(nn::linear(p, d_in, d_out, Default::default()))
}

impl Lin {
    pub fn f(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.f_linear(&self.0.ws, self.0.bs.as_ref())?)
    }
}

/// Global average pooling to `[batch, channels]` (tch's
/// `adaptive_avg_pool2d([1, 1]).flat_view()`).
pub fn pool_flat(x: &Tensor) -> Result<Tensor> {
    let n = x.size().first().copied().unwrap_or(0);
    Ok(x.f_adaptive_avg_pool2d([1, 1])?.f_view([n, -1])?)
}

/// A vision model in stages. The stem may be the identity (`None`): its
/// output is then the batch's input itself, which has no autograd graph and
/// uses no variable.
pub struct Staged {
    stem: Option<Stage>,
    /// Each block with the path of its variables (`layer1.0`, `features.3`).
    blocks: Vec<(String, Stage)>,
    /// The last block's output to the logits.
    head: Stage,
}

impl Staged {
    pub fn new(stem: Option<Stage>, blocks: Vec<(String, Stage)>, head: Stage) -> Self {
        Staged { stem, blocks, head }
    }

    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    pub fn stem(&self, x: &Tensor) -> Result<Tensor> {
        match &self.stem {
            Some(s) => s(x),
            None => Ok(x.shallow_clone()),
        }
    }

    pub fn block(&self, k: usize, x: &Tensor) -> Result<Tensor> {
        match self.blocks.get(k) {
            Some((_, b)) => b(x),
            None => bail!("internal: block {k} of a model with {}", self.blocks.len()),
        }
    }

    /// Logits `[batch, classes]`.
    pub fn head(&self, x: &Tensor) -> Result<Tensor> {
        (self.head)(x)
    }

    /// The whole forward: input to logits.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut x = self.stem(x)?;
        for (_, b) in &self.blocks {
            x = b(&x)?;
        }
        self.head(&x)
    }

    /// The unit of a variable by its name: block k's path (`layer1.0.…`) is
    /// unit k+1, the rest (stem and head) the root's, 0.
    pub fn unit_of(&self, name: &str) -> usize {
        self.blocks
            .iter()
            .position(|(path, _)| {
                name.strip_prefix(path.as_str())
                    .is_some_and(|rest| rest.starts_with('.'))
            })
            .map_or(0, |k| k + 1)
    }
}

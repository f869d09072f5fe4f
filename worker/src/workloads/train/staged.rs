//! Forward and backward stage by stage (stem, blocks, head), so that each
//! unit's gradients are complete at a known moment: tch has no autograd
//! hooks, but the models are ours. In forward each stage's output is kept and
//! the next stage starts from a detached leaf of it; in backward the head
//! runs from the loss, then each earlier stage from the gradient that reached
//! its leaf ([`backward_with`]). [`Hooks`] run between the stages: that is
//! where ddp starts a bucket's all_reduce and fsdp gathers parameters and
//! reduce-scatters gradients.

use anyhow::{bail, Result};
use tch::Tensor;

pub use crate::shim::backward_with;
use crate::workloads::models::{Batch, Model};

/// A stage of a model in training order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Stem,
    Block(usize),
    Head,
}

impl Stage {
    /// The stage after whose backward a unit's gradients are complete: the
    /// root's (unit 0) after the stem's, block k's (unit k+1) after its own.
    pub fn completing(unit: usize) -> Stage {
        match unit {
            0 => Stage::Stem,
            u => Stage::Block(u - 1),
        }
    }
}

/// What the training loop does between stages.
pub trait Hooks {
    fn before_forward(&mut self, _s: Stage) -> Result<()> {
        Ok(())
    }
    fn before_backward(&mut self, _s: Stage) -> Result<()> {
        Ok(())
    }
    /// The stage's backward is queued: on a GPU it may still be running.
    fn after_backward(&mut self, _s: Stage) -> Result<()> {
        Ok(())
    }
}

fn leaf(x: &Tensor) -> Result<Tensor> {
    if x.requires_grad() {
        Ok(x.f_detach()?.f_set_requires_grad(true)?)
    } else {
        Ok(x.shallow_clone())
    }
}

/// One forward and backward of `model` on `batch`, the loss multiplied by
/// `scale` for backward. Returns the (unscaled) fp32 loss.
pub fn forward_backward(
    model: &Model,
    batch: &Batch,
    scale: f64,
    hooks: &mut dyn Hooks,
) -> Result<Tensor> {
    let n = model.blocks();
    hooks.before_forward(Stage::Stem)?;
    let x = model.stem(batch)?;
    // Each stage's output and the leaf the next stage started from.
    let mut kept: Vec<(Tensor, Tensor)> = Vec::with_capacity(n + 1);
    let mut h = leaf(&x)?;
    kept.push((x, h.shallow_clone()));
    for k in 0..n {
        hooks.before_forward(Stage::Block(k))?;
        let x = model.block(k, &h)?;
        h = leaf(&x)?;
        kept.push((x, h.shallow_clone()));
    }
    hooks.before_forward(Stage::Head)?;
    let loss = model.head_loss(&h, batch)?;
    drop(h);
    hooks.before_backward(Stage::Head)?;
    if scale != 1.0 {
        loss.f_mul_scalar(scale)?.f_backward()?;
    } else {
        loss.f_backward()?;
    }
    hooks.after_backward(Stage::Head)?;
    for k in (0..n).rev() {
        let (x, h) = kept.pop().expect("one kept output per block");
        hooks.before_backward(Stage::Block(k))?;
        let g = h.f_grad()?;
        if !g.defined() {
            bail!("internal: no gradient reached block {k}'s output");
        }
        backward_with(&x, &g)?;
        hooks.after_backward(Stage::Block(k))?;
    }
    let (x, h) = kept.pop().expect("the stem's output");
    hooks.before_backward(Stage::Stem)?;
    if x.requires_grad() {
        let g = h.f_grad()?;
        if g.defined() {
            backward_with(&x, &g)?;
        }
    }
    hooks.after_backward(Stage::Stem)?;
    Ok(loss)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::models::{gpt::GptConfig, ModelConfig, Precision};
    use tch::{Device, Kind};

    #[test]
    fn staged_backward_gives_the_gradients_of_a_whole_backward() {
        let cfg = ModelConfig {
            name: "gpt".into(),
            precision: Precision::Fp32,
            channels_last: false,
            gpt: GptConfig::cpu(16),
        };
        let m = Model::build(&cfg, Device::Cpu, 5).unwrap();
        let b = m.batch(2, 9).unwrap();
        let vars = m.vs.trainable_variables();
        m.loss(&b).unwrap().backward();
        let whole: Vec<Tensor> = vars.iter().map(|v| v.grad().copy()).collect();
        for v in &vars {
            let _ = v.grad().zero_();
        }
        struct Order(Vec<Stage>);
        impl Hooks for Order {
            fn after_backward(&mut self, s: Stage) -> Result<()> {
                self.0.push(s);
                Ok(())
            }
        }
        let mut order = Order(Vec::new());
        let l = forward_backward(&m, &b, 1.0, &mut order).unwrap();
        assert!(l.double_value(&[]) > 0.0);
        assert_eq!(
            order.0,
            vec![Stage::Head, Stage::Block(1), Stage::Block(0), Stage::Stem]
        );
        for (v, w) in vars.iter().zip(&whole) {
            let d = (v.grad() - w).abs().max().double_value(&[]);
            let s = w.abs().max().double_value(&[]).max(1e-12);
            assert!(d <= 1e-5 * s, "gradient differs by {d} (scale {s})");
        }
        assert!(whole
            .iter()
            .any(|g| g.abs().sum(Kind::Float).double_value(&[]) > 0.0));
    }
}

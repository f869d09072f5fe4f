//! The update and its bookkeeping, shared by the replicated (ddp) and
//! sharded (fsdp) trainers: SGD with momentum as PyTorch writes it
//! (`buf = m·buf + g; p -= lr·buf`, no dampening, no weight decay) in
//! PyTorch's fused kernel, each element alone, so that both modes compute
//! bit-identical parameters when their gradient sums agree; dynamic loss scaling for fp16;
//! and the clock of communication time.

use std::time::Instant;

use anyhow::Result;
use tch::{Kind, Tensor};

use crate::comm::{Collectives, SideTimes};

/// Dynamic loss scaling as `torch.cuda.amp.GradScaler` does it: start at 2^16,
/// on a step whose gradients hold inf/NaN skip the update and halve the scale,
/// after `growth_interval` good steps in a row double it.
#[derive(Clone, Debug, PartialEq)]
pub struct LossScaler {
    pub scale: f64,
    pub growth_factor: f64,
    pub backoff_factor: f64,
    pub growth_interval: u32,
    good_steps: u32,
}

impl Default for LossScaler {
    fn default() -> Self {
        LossScaler::new(65536.0, 2000)
    }
}

impl LossScaler {
    pub fn new(scale: f64, growth_interval: u32) -> Self {
        LossScaler {
            scale,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval,
            good_steps: 0,
        }
    }

    /// Called once per step after the gradients are known; returns whether the
    /// optimizer step may be taken (false: skip it).
    pub fn update(&mut self, found_inf: bool) -> bool {
        if found_inf {
            self.scale = (self.scale * self.backoff_factor).max(f64::MIN_POSITIVE);
            self.good_steps = 0;
            return false;
        }
        self.good_steps += 1;
        if self.good_steps >= self.growth_interval {
            let grown = self.scale * self.growth_factor;
            if grown.is_finite() {
                self.scale = grown;
            }
            self.good_steps = 0;
        }
        true
    }
}

/// Learning rate and momentum of the update.
#[derive(Clone, Copy, Debug)]
pub struct Sgd {
    pub lr: f64,
    pub momentum: f64,
}

impl Sgd {
    /// A summed gradient `g` (any float kind) in fp32, for [`Self::apply`].
    pub fn grad32(g: &Tensor) -> Result<Tensor> {
        Ok(g.f_to_kind(Kind::Float)?)
    }

    /// `momentum = m·momentum + g32/(ranks·scale); master -= lr·momentum`,
    /// where `g32` is the fp32 gradient summed over `ranks` ranks under loss
    /// scale `scale`: one pass of PyTorch's fused kernel
    /// (`SGD(fused=True)`), so the update reads and writes each parameter
    /// once rather than once per operation. Both modes take it, each element
    /// alone, so ddp and fsdp stay bit-identical when their sums agree.
    /// The kernel leaves `g32` divided in place: each step passes its own.
    pub fn apply(
        &self,
        master: &mut Tensor,
        momentum: &mut Tensor,
        g32: &Tensor,
        ranks: usize,
        scale: f64,
    ) -> Result<()> {
        crate::shim::fused_sgd(
            master,
            momentum,
            g32,
            self.lr,
            self.momentum,
            ranks as f64 * scale,
        )
    }
}

/// Whether `g32` holds an inf or NaN, agreed over every rank when `comm` is
/// given (each rank checked only its part).
pub fn found_inf<'c>(g32: &Tensor, comm: Option<&mut (dyn Collectives + 'c)>) -> Result<bool> {
    let bad = g32
        .f_isfinite()?
        .f_all()?
        .f_logical_not()?
        .f_to_kind(Kind::Float)?
        .f_reshape([1])?;
    if let Some(c) = comm {
        c.all_reduce(&bad, &bad)?;
    }
    Ok(bad.f_double_value(&[0])? > 0.0)
}

/// Communication time of one step. Backends whose collectives run beside
/// compute time themselves ([`Collectives::side_times`]); for the others a
/// collective takes the caller's time while it runs, so all of it is exposed.
#[derive(Debug, Default)]
pub struct CommClock {
    wall_s: f64,
}

impl CommClock {
    pub fn time<T>(&mut self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let t = Instant::now();
        let r = f();
        self.wall_s += t.elapsed().as_secs_f64();
        r
    }

    /// The step's busy and exposed seconds (call after the device synchronised).
    pub fn finish(&mut self, comm: Option<&mut (dyn Collectives + '_)>) -> Result<SideTimes> {
        let wall = std::mem::take(&mut self.wall_s);
        if let Some(c) = comm {
            if let Some(t) = c.side_times()? {
                return Ok(t);
            }
        }
        Ok(SideTimes {
            busy_s: wall,
            stalled_s: wall,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_scaler_backs_off_skips_and_grows() {
        let mut s = LossScaler::new(1024.0, 3);
        assert!(s.update(false));
        assert!(s.update(false));
        assert_eq!(s.scale, 1024.0);
        assert!(!s.update(true), "inf must skip the step");
        assert_eq!(s.scale, 512.0);
        // the good-step count restarted after the overflow
        assert!(s.update(false) && s.update(false));
        assert_eq!(s.scale, 512.0);
        assert!(s.update(false));
        assert_eq!(s.scale, 1024.0);
        assert!(!s.update(true) && !s.update(true));
        assert_eq!(s.scale, 256.0);
        let d = LossScaler::default();
        assert_eq!((d.scale, d.growth_interval), (65536.0, 2000));
    }

    #[test]
    fn sgd_matches_pytorch_momentum() {
        let sgd = Sgd {
            lr: 0.5,
            momentum: 0.9,
        };
        let mut p = Tensor::from_slice(&[1.0f32, 2.0]);
        let mut m = Tensor::from_slice(&[0.0f32, 0.0]);
        // The kernel leaves the gradient it was given unscaled in place, as
        // PyTorch's does: each step takes its own.
        let grad = || Sgd::grad32(&Tensor::from_slice(&[2.0f32, 4.0]));
        sgd.apply(&mut p, &mut m, &grad().unwrap(), 2, 1.0).unwrap();
        let g = grad().unwrap();
        sgd.apply(&mut p, &mut m, &g, 2, 1.0).unwrap();
        assert!(
            (g.double_value(&[1]) - 2.0).abs() < 1e-6,
            "unscaled in place"
        );
        // buf: 1 → 1.9; p: 1 - 0.5 - 0.95
        assert!((p.double_value(&[0]) - (1.0 - 0.5 - 0.95)).abs() < 1e-6);
        assert!((m.double_value(&[1]) - 3.8).abs() < 1e-6);
        assert!(!found_inf(&g, None).unwrap());
        assert!(found_inf(&Tensor::from_slice(&[f32::INFINITY]), None).unwrap());
    }
}

//! ddp: every rank keeps the whole model. The flat gradient is cut into
//! buckets of whole units (about `bucket_bytes` each, from the end, the way
//! PyTorch DDP orders them; the root alone last), and each bucket's all_reduce starts on the side
//! stream as soon as the backward of the blocks it covers was queued, so it
//! runs under the rest of backward; the update waits for the last one. Every
//! rank applies the same update to its fp32 master copy, then refreshes its
//! compute copy.

use anyhow::{Context, Result};
use tch::{Device, Kind, Tensor};

use super::flat::{cast_buffers, initial_values, install, Layout};
use super::optim::{found_inf, CommClock, LossScaler, Sgd};
use super::staged::{forward_backward, Hooks, Stage};
use crate::comm::{Collectives, Ticket};
use crate::kernels::sgd::{Rates, SgdKernel};
use crate::workloads::models::{Batch, Model};

/// Elements of the fp32 update's temporaries at a time (about 128 MiB each).
const UPDATE_ELEMS: u64 = 32 << 20;

struct Bucket {
    grad: Tensor,
    after: Stage,
}

pub(crate) struct Replicated {
    pub layout: Layout,
    /// Flat parameters in the compute kind; the variables are views of it.
    pub compute: Tensor,
    /// Flat gradients in the compute kind; the variables' grads are views of it.
    pub grad: Tensor,
    /// fp32 master parameters (the compute buffer itself in fp32).
    pub master: Tensor,
    pub momentum: Tensor,
    pub scaler: Option<LossScaler>,
    pub skipped: u64,
    kind: Kind,
    world: usize,
    buckets: Vec<Bucket>,
    /// Runs of units (first, end) updated together.
    update_runs: Vec<(usize, usize)>,
    /// The one-pass update, for bf16 without a loss scale on a GPU.
    one_pass: Option<&'static SgdKernel>,
}

/// Units grouped from the last, each group at least `bytes` (the last group
/// what is left): (first unit, end unit) pairs, last group first.
pub(crate) fn bucket_units(unit_bytes: &[u64], bytes: u64) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut end = unit_bytes.len();
    let mut acc = 0;
    for u in (0..unit_bytes.len()).rev() {
        acc += unit_bytes[u];
        if acc >= bytes || u == 0 {
            out.push((u, end));
            end = u;
            acc = 0;
        }
    }
    out
}

impl Replicated {
    /// Moves the model into flat buffers, starting from rank 0's parameters
    /// when there is a communicator.
    pub fn new(
        model: &Model,
        kind: Kind,
        world: usize,
        bucket_bytes: u64,
        scaler: Option<LossScaler>,
        mut comm: Option<&mut (dyn Collectives + '_)>,
    ) -> Result<Replicated> {
        let dev = model.device;
        let mut units = model.units();
        let layout = Layout::new(&units, world);
        let compute = Tensor::f_zeros([layout.total], (kind, dev))?;
        let grad = Tensor::f_zeros([layout.total], (kind, dev))?;
        let mut master = Tensor::f_zeros([layout.total], (Kind::Float, dev))?;
        for (u, vars) in units.iter_mut().enumerate() {
            let lay = &layout.units[u];
            let (off, len) = (layout.offsets[u], lay.padded);
            let values = initial_values(vars, lay, dev, comm.as_deref_mut())?;
            master.f_narrow(0, off, len)?.f_copy_(&values)?;
            install(
                vars,
                lay,
                &compute.f_narrow(0, off, len)?,
                &grad.f_narrow(0, off, len)?,
                false,
            )?;
        }
        tch::no_grad(|| compute.shallow_clone().f_copy_(&master))?;
        cast_buffers(model, kind)?;
        if kind == Kind::Float {
            master = compute.shallow_clone();
        }
        let es = kind.elt_size_in_bytes() as u64;
        let unit_bytes: Vec<u64> = layout.units.iter().map(|u| u.padded as u64 * es).collect();
        let unit_elems: Vec<u64> = layout.units.iter().map(|u| u.padded as u64).collect();
        let update_runs = bucket_units(&unit_elems, UPDATE_ELEMS);
        // The root's gradients are complete only after the stem's backward,
        // when nothing is left to hide communication under: it goes alone,
        // as small as it is; the blocks go from the last, as PyTorch orders them.
        let mut runs: Vec<(usize, usize)> = bucket_units(&unit_bytes[1..], bucket_bytes)
            .into_iter()
            .map(|(a, b)| (a + 1, b + 1))
            .collect();
        runs.push((0, 1));
        let mut buckets = Vec::new();
        for (first, end) in runs {
            let start = layout.offsets[first];
            let stop = layout.end_of(end);
            buckets.push(Bucket {
                grad: grad.f_narrow(0, start, stop - start)?,
                after: Stage::completing(first),
            });
        }
        let one_pass = (kind == Kind::BFloat16 && scaler.is_none())
            .then(|| SgdKernel::get(dev))
            .flatten();
        Ok(Replicated {
            one_pass,
            momentum: master.f_zeros_like()?,
            layout,
            compute,
            grad,
            master,
            scaler,
            skipped: 0,
            kind,
            world,
            buckets,
            update_runs,
        })
    }

    /// One step; `comm: None` is the no-communication baseline (each rank
    /// updates from its own gradients). Returns the loss.
    pub fn step(
        &mut self,
        model: &Model,
        batch: &Batch,
        sgd: Sgd,
        mut comm: Option<&mut (dyn Collectives + '_)>,
        clock: &mut CommClock,
    ) -> Result<Tensor> {
        let _ = self.grad.shallow_clone().f_zero_()?;
        let scale = self.scaler.as_ref().map(|s| s.scale).unwrap_or(1.0);
        let mut hooks = BucketHooks {
            buckets: &self.buckets,
            comm: comm.as_deref_mut(),
            clock,
            last: None,
        };
        let loss = forward_backward(model, batch, scale, &mut hooks)?;
        let last = hooks.last;
        if let (Some(c), Some(t)) = (comm.as_deref_mut(), last) {
            c.side_wait(t)?;
        }
        let ranks = if comm.is_some() { self.world } else { 1 };
        tch::no_grad(|| -> Result<()> {
            let mut take = true;
            if let Some(scaler) = self.scaler.as_mut() {
                // Every rank holds the same summed gradient: no vote needed.
                take = scaler.update(found_inf(&self.grad, None)?);
                if !take {
                    self.skipped += 1;
                    tracing::debug!(scale, "inf/NaN gradients: step skipped, loss scale halved");
                }
            }
            if !take {
                return Ok(());
            }
            if let Some(k) = self.one_pass {
                // No temporaries: the whole model in one launch.
                let rates = Rates {
                    lr: sgd.lr,
                    momentum: sgd.momentum,
                    divisor: ranks as f64 * scale,
                };
                return k.step(
                    &self.master,
                    &self.momentum,
                    &self.grad,
                    Some(&self.compute),
                    rates,
                );
            }
            // In runs of whole units of UPDATE_ELEMS or more: the fp32
            // temporaries stay that small, and a small model is one run.
            for &(first, end) in &self.update_runs {
                let off = self.layout.offsets[first];
                let n = self.layout.end_of(end) - off;
                let g32 = Sgd::grad32(&self.grad.f_narrow(0, off, n)?)?;
                let mut master = self.master.f_narrow(0, off, n)?;
                let mut momentum = self.momentum.f_narrow(0, off, n)?;
                sgd.apply(&mut master, &mut momentum, &g32, ranks, scale)?;
                if self.kind != Kind::Float {
                    self.compute.f_narrow(0, off, n)?.f_copy_(&master)?;
                }
            }
            Ok(())
        })?;
        Ok(loss)
    }

    /// Host copies of the master and compute parameters (the baseline phase
    /// puts them back afterwards).
    pub fn save(&self) -> Result<(Tensor, Tensor)> {
        let host = |t: &Tensor| -> Result<Tensor> {
            let mut h = Tensor::f_empty(t.size(), (t.kind(), Device::Cpu))?;
            h.f_copy_(t)?;
            Ok(h)
        };
        Ok((host(&self.master)?, host(&self.compute)?))
    }

    pub fn restore(&mut self, saved: &(Tensor, Tensor)) -> Result<()> {
        tch::no_grad(|| -> Result<()> {
            self.master.shallow_clone().f_copy_(&saved.0)?;
            self.compute.shallow_clone().f_copy_(&saved.1)?;
            let _ = self.momentum.f_zero_()?;
            Ok(())
        })
    }
}

/// Starts each bucket's all_reduce once the backward of its units is queued.
struct BucketHooks<'b, 'c> {
    buckets: &'b [Bucket],
    comm: Option<&'b mut (dyn Collectives + 'c)>,
    clock: &'b mut CommClock,
    last: Option<Ticket>,
}

impl Hooks for BucketHooks<'_, '_> {
    fn after_backward(&mut self, s: Stage) -> Result<()> {
        let Some(c) = self.comm.as_deref_mut() else {
            return Ok(());
        };
        for b in self.buckets.iter().filter(|b| b.after == s) {
            c.side_begin()?;
            self.clock
                .time(|| c.all_reduce(&b.grad, &b.grad))
                .context("all_reduce of a gradient bucket")?;
            self.last = Some(c.side_end()?);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_hold_whole_units_from_the_end() {
        assert_eq!(
            bucket_units(&[10, 4, 4, 4, 30], 8),
            vec![(4, 5), (2, 4), (0, 2)]
        );
        assert_eq!(bucket_units(&[1, 1, 1], 100), vec![(0, 3)]);
        assert_eq!(bucket_units(&[5], 1), vec![(0, 1)]);
    }
}

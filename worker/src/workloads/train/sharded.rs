//! fsdp: each rank keeps only its shard (1/world of every unit) of the fp32
//! master parameters and of the momentum. The root unit (embeddings, head) is
//! gathered whole at the start of a step and kept to its end; blocks share two
//! gather slots, block k always in slot k mod 2:
//!
//! * before block k's forward its parameters are all-gathered into its slot
//!   (the next block's gather is already on its way: prefetch), and the slot
//!   is overwritten two blocks later;
//! * in backward, block k is gathered into the same slot again (the saved
//!   tensors of its forward point there), prefetched while block k+1 runs
//!   backward; the last two blocks are still in place;
//! * right after block k's backward is queued its gradients are
//!   reduce-scattered (in place, on the side stream) and its shard updated
//!   once they arrive, before its gradient slot is needed again.
//!
//! Gathers are in place, as FSDP2's: the master shard is cast to the compute
//! kind straight into this rank's part of the unit's buffer, and the
//! all-gather fills the rest around it (no staging copy, no local copy).
//! fp16 keeps the reduced shard gradients until every unit's are in, since
//! the loss scaler decides over the whole step.

use anyhow::{bail, Context, Result};
use tch::{Device, Kind, Tensor};

use super::flat::{cast_buffers, initial_values, install, Layout};
use super::optim::{found_inf, CommClock, LossScaler, Sgd};
use super::staged::{forward_backward, Hooks, Stage};
use crate::comm::{Collectives, Ticket};
use crate::digest::Digest;
use crate::kernels::sgd::{Rates, SgdKernel};
use crate::workloads::models::{Batch, Model};

pub(crate) struct Sharded {
    pub layout: Layout,
    rank: usize,
    world: usize,
    kind: Kind,
    /// fp32 master shard: every unit's shard end to end.
    pub master: Tensor,
    pub momentum: Tensor,
    root_params: Tensor,
    root_grads: Tensor,
    slot_params: [Tensor; 2],
    slot_grads: [Tensor; 2],
    /// fp16: the reduced shard gradients of the step, for the scaler's vote.
    grad_shard: Option<Tensor>,
    /// The one-pass update, for bf16 on a GPU.
    one_pass: Option<&'static SgdKernel>,
    pub scaler: Option<LossScaler>,
    pub skipped: u64,
}

/// Digests of the trained parameters (see `TrainResult`).
pub(crate) struct ShardDigests {
    pub full: String,
    pub own: String,
    pub gathered: Vec<String>,
}

impl Sharded {
    pub fn new(
        model: &Model,
        kind: Kind,
        rank: usize,
        world: usize,
        scaler: Option<LossScaler>,
        mut comm: Option<&mut (dyn Collectives + '_)>,
    ) -> Result<Sharded> {
        if comm.is_none() && world != 1 {
            bail!("internal: fsdp on {world} ranks without a communicator");
        }
        let dev = model.device;
        let mut units = model.units();
        let layout = Layout::new(&units, world);
        let root_params = Tensor::f_zeros([layout.units[0].padded], (kind, dev))?;
        let root_grads = Tensor::f_zeros([layout.units[0].padded], (kind, dev))?;
        let big = layout.largest_block().max(1);
        let zeros = |n: i64| Tensor::f_zeros([n], (kind, dev));
        let slot_params = [zeros(big)?, zeros(big)?];
        let slot_grads = [zeros(big)?, zeros(big)?];
        let master = Tensor::f_zeros([layout.shard_total], (Kind::Float, dev))?;
        let st = Sharded {
            momentum: master.f_zeros_like()?,
            grad_shard: (kind == Kind::Half)
                .then(|| master.f_zeros_like())
                .transpose()?,
            layout,
            rank,
            world,
            kind,
            master,
            root_params,
            root_grads,
            slot_params,
            slot_grads,
            one_pass: (kind == Kind::BFloat16)
                .then(|| SgdKernel::get(dev))
                .flatten(),
            scaler,
            skipped: 0,
        };
        for (u, vars) in units.iter_mut().enumerate() {
            let lay = &st.layout.units[u];
            let values = initial_values(vars, lay, dev, comm.as_deref_mut())?;
            let c = lay.shard(world);
            st.shard_of(&st.master, u)?
                .f_copy_(&values.f_narrow(0, rank as i64 * c, c)?)?;
            let (p, g) = st.unit_buffers(u)?;
            install(vars, lay, &p, &g, false)?;
        }
        cast_buffers(model, kind)?;
        Ok(st)
    }

    fn shard_of(&self, t: &Tensor, u: usize) -> Result<Tensor> {
        let c = self.layout.units[u].shard(self.world);
        Ok(t.f_narrow(0, self.layout.shard_offsets[u], c)?)
    }

    /// Unit `u`'s whole parameters and gradients (the root's buffers, or its slot).
    fn unit_buffers(&self, u: usize) -> Result<(Tensor, Tensor)> {
        if u == 0 {
            return Ok((
                self.root_params.shallow_clone(),
                self.root_grads.shallow_clone(),
            ));
        }
        let (s, n) = ((u - 1) % 2, self.layout.units[u].padded);
        Ok((
            self.slot_params[s].f_narrow(0, 0, n)?,
            self.slot_grads[s].f_narrow(0, 0, n)?,
        ))
    }

    /// Unit `u`'s whole gradients and this rank's part of them (where the
    /// in-place reduce_scatter leaves the sum).
    fn unit_grads(&self, u: usize) -> Result<(Tensor, Tensor)> {
        let (_, grads) = self.unit_buffers(u)?;
        let c = self.layout.units[u].shard(self.world);
        let mine = grads.f_narrow(0, self.rank as i64 * c, c)?;
        Ok((grads, mine))
    }

    /// One step. Returns the loss.
    pub fn step(
        &mut self,
        model: &Model,
        batch: &Batch,
        sgd: Sgd,
        mut comm: Option<&mut (dyn Collectives + '_)>,
        clock: &mut CommClock,
    ) -> Result<Tensor> {
        let scale = self.scaler.as_ref().map(|s| s.scale).unwrap_or(1.0);
        let blocks = model.blocks();
        let mut hooks = ShardHooks {
            st: self,
            comm: comm.as_deref_mut(),
            clock,
            sgd,
            scale,
            blocks,
            gathers: vec![None; blocks + 1],
            pending: Vec::new(),
        };
        let loss = forward_backward(model, batch, scale, &mut hooks)?;
        hooks.settle_all()?;
        drop(hooks);
        if let Some(gs) = self.grad_shard.as_ref() {
            let g32 = Sgd::grad32(gs)?;
            let scaler = self.scaler.as_mut().expect("fp16 has a scaler");
            let take = scaler.update(found_inf(&g32, comm)?);
            if take {
                let world = self.world;
                tch::no_grad(|| {
                    sgd.apply(&mut self.master, &mut self.momentum, &g32, world, scale)
                })?;
            } else {
                self.skipped += 1;
                tracing::debug!(scale, "inf/NaN gradients: step skipped, loss scale halved");
            }
        }
        Ok(loss)
    }

    /// Unit `u`'s fp32 parameters whole, on the host (gathered from every
    /// rank's shard).
    fn unit_on_host(&self, u: usize, comm: Option<&mut (dyn Collectives + '_)>) -> Result<Tensor> {
        Ok(self.unit_whole(u, comm)?.f_to_device(Device::Cpu)?)
    }

    /// Unit `u`'s fp32 parameters, every rank's shard, where they live.
    fn unit_whole(&self, u: usize, comm: Option<&mut (dyn Collectives + '_)>) -> Result<Tensor> {
        let mine = self.shard_of(&self.master, u)?;
        let whole = match comm {
            Some(cm) => {
                let whole = Tensor::f_zeros(
                    [self.layout.units[u].padded],
                    (Kind::Float, self.master.device()),
                )?;
                cm.all_gather(&mine, &whole)
                    .context("all_gather of the fp32 parameters")?;
                whole
            }
            None => mine,
        };
        Ok(whole)
    }

    /// Digests of the full fp32 parameters (gathered unit by unit, so the
    /// whole model never sits on one rank), of this rank's own shard, and of
    /// every rank's shard as gathered here.
    pub fn digests(&self, mut comm: Option<&mut (dyn Collectives + '_)>) -> Result<ShardDigests> {
        let (mut full, mut own) = (Digest::default(), Digest::default());
        let mut gathered = vec![Digest::default(); self.world];
        for u in 0..self.layout.units.len() {
            own.tensor(&self.shard_of(&self.master, u)?)?;
            let c = self.layout.units[u].shard(self.world);
            let whole = self.unit_whole(u, comm.as_deref_mut())?;
            full.tensor(&whole)?;
            for (r, h) in gathered.iter_mut().enumerate() {
                h.tensor(&whole.f_narrow(0, r as i64 * c, c)?)?;
            }
        }
        Ok(ShardDigests {
            full: full.hex(),
            own: own.hex(),
            gathered: gathered.iter().map(Digest::hex).collect(),
        })
    }

    /// The full fp32 parameters on the host, units end to end (tests).
    pub fn full_params(&self, mut comm: Option<&mut (dyn Collectives + '_)>) -> Result<Tensor> {
        let parts = (0..self.layout.units.len())
            .map(|u| self.unit_on_host(u, comm.as_deref_mut()))
            .collect::<Result<Vec<_>>>()?;
        Ok(Tensor::f_cat(&parts, 0)?)
    }
}

/// The gathers, reduce-scatters and updates of one fsdp step.
struct ShardHooks<'s, 'c> {
    st: &'s mut Sharded,
    comm: Option<&'s mut (dyn Collectives + 'c)>,
    clock: &'s mut CommClock,
    sgd: Sgd,
    scale: f64,
    blocks: usize,
    /// Gather ticket per unit not yet waited for.
    gathers: Vec<Option<Ticket>>,
    /// Units whose gradients are being reduce-scattered, and their tickets.
    pending: Vec<(usize, Ticket)>,
}

impl ShardHooks<'_, '_> {
    /// Starts gathering unit `u` into its buffer.
    fn gather(&mut self, u: usize) -> Result<()> {
        let st = &*self.st;
        let master = st.shard_of(&st.master, u)?;
        let (dst, _) = st.unit_buffers(u)?;
        let send = if st.kind == Kind::Float {
            master
        } else {
            // In place, as FSDP2 gathers: this rank's part of the unit's
            // buffer is its shard cast to the compute kind, and the gather
            // fills the rest around it. The cast is queued on the compute
            // stream after the last reader of this buffer, and the gather
            // waits for the cast (side_begin).
            let c = master.numel() as i64;
            let mine = dst.f_narrow(0, st.rank as i64 * c, c)?;
            tch::no_grad(|| mine.shallow_clone().f_copy_(&master))?;
            mine
        };
        let ticket = match self.comm.as_deref_mut() {
            Some(c) => {
                c.side_begin()?;
                self.clock
                    .time(|| c.all_gather(&send, &dst))
                    .with_context(|| format!("all_gather of unit {u}'s parameters"))?;
                c.side_end()?
            }
            None => {
                // One rank: the cast above filled the buffer already.
                if st.kind == Kind::Float {
                    tch::no_grad(|| dst.shallow_clone().f_copy_(&send))?;
                }
                Ticket::default()
            }
        };
        self.gathers[u] = Some(ticket);
        Ok(())
    }

    /// Compute waits for unit `u`'s gather, if one is on its way.
    fn wait_gather(&mut self, u: usize) -> Result<()> {
        if let (Some(t), Some(c)) = (self.gathers[u].take(), self.comm.as_deref_mut()) {
            c.side_wait(t)?;
        }
        Ok(())
    }

    /// Starts reducing unit `u`'s gradients into this rank's part of them.
    fn reduce(&mut self, u: usize) -> Result<()> {
        let (grads, mine) = self.st.unit_grads(u)?;
        let ticket = match self.comm.as_deref_mut() {
            Some(cm) => {
                cm.side_begin()?;
                self.clock
                    .time(|| cm.reduce_scatter(&grads, &mine))
                    .with_context(|| format!("reduce_scatter of unit {u}'s gradients"))?;
                cm.side_end()?
            }
            None => Ticket::default(),
        };
        self.pending.push((u, ticket));
        Ok(())
    }

    /// Waits for unit `u`'s reduced gradients (if pending) and updates its shard.
    fn settle(&mut self, u: usize) -> Result<()> {
        let Some(i) = self.pending.iter().position(|p| p.0 == u) else {
            return Ok(());
        };
        let (_, t) = self.pending.remove(i);
        if let Some(c) = self.comm.as_deref_mut() {
            c.side_wait(t)?;
        }
        let st = &mut *self.st;
        let (_, reduced) = st.unit_grads(u)?;
        tch::no_grad(|| -> Result<()> {
            if let Some(gs) = st.grad_shard.as_ref() {
                st.shard_of(gs, u)?.f_copy_(&reduced)?;
                return Ok(());
            }
            let mut m = st.shard_of(&st.master, u)?;
            let mut mo = st.shard_of(&st.momentum, u)?;
            if let Some(k) = st.one_pass {
                let rates = Rates {
                    lr: self.sgd.lr,
                    momentum: self.sgd.momentum,
                    divisor: st.world as f64 * self.scale,
                };
                return k.step(&m, &mo, &reduced, None, rates);
            }
            let g32 = Sgd::grad32(&reduced)?;
            self.sgd.apply(&mut m, &mut mo, &g32, st.world, self.scale)
        })
    }

    fn settle_all(&mut self) -> Result<()> {
        while let Some(&(u, _)) = self.pending.first() {
            self.settle(u)?;
        }
        Ok(())
    }
}

impl Hooks for ShardHooks<'_, '_> {
    fn before_forward(&mut self, s: Stage) -> Result<()> {
        match s {
            Stage::Stem => {
                self.gather(0)?;
                if self.blocks > 0 {
                    self.gather(1)?;
                }
                self.wait_gather(0)?;
                let _ = self.st.root_grads.shallow_clone().f_zero_()?;
                Ok(())
            }
            Stage::Block(k) => {
                if k + 1 < self.blocks {
                    self.gather(k + 2)?;
                }
                self.wait_gather(k + 1)
            }
            Stage::Head => Ok(()),
        }
    }

    fn before_backward(&mut self, s: Stage) -> Result<()> {
        let Stage::Block(k) = s else {
            return Ok(());
        };
        // The last two blocks are still in their slots; the others are
        // gathered again, one ahead.
        if k >= 1 && k + 2 <= self.blocks {
            self.gather(k)?;
        }
        self.wait_gather(k + 1)?;
        // Block k+2's gradients share this slot: take them out first.
        self.settle(k + 3)?;
        let (_, grads) = self.st.unit_buffers(k + 1)?;
        let _ = grads.shallow_clone().f_zero_()?;
        Ok(())
    }

    fn after_backward(&mut self, s: Stage) -> Result<()> {
        match s {
            Stage::Block(k) => self.reduce(k + 1),
            Stage::Stem => self.reduce(0),
            Stage::Head => Ok(()),
        }
    }
}

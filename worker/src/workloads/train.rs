//! The training loop shared by `ddp` and `fsdp`.
//!
//! Parameters live in flat buffers ([`super::flat`]). The model's trainable variables become
//! views (same shape and strides, so channels_last stays channels_last) into
//! one flat buffer of the compute precision, and their gradients views into a
//! second one: autograd accumulates straight into the flat gradient (its
//! in-place `grad += new` path, gradients are zeroed with one fill per step),
//! so no copy is needed before communication. Each variable starts at a
//! multiple of 64 elements; the buffers are padded to a multiple of the world
//! size so that they shard evenly.
//!
//! * **ddp** keeps the fp32 master parameters and the SGD momentum whole; after
//!   backward the flat gradient is all-reduced in buckets of `bucket_bytes`
//!   (one collective per bucket), averaged, and every rank applies the same
//!   update to its master copy, then refreshes its compute copy.
//! * **fsdp** keeps only its shard (1/world) of the fp32 master parameters and
//!   of the momentum; after backward the flat gradient is reduce-scattered
//!   into the shard, the shard is updated, and the compute parameters are
//!   all-gathered from every rank's shard before the next forward.
//!
//! The update is SGD with momentum (PyTorch's: `buf = m·buf + g; p -= lr·buf`,
//! no dampening, no weight decay) written with one rounding per operation, so
//! ddp and fsdp compute bit-identical parameters when their gradient sums agree.
//! In bf16 and fp16 the model computes in that type and the update is applied
//! to fp32 master weights (then cast back); fp16 adds dynamic loss scaling
//! ([`LossScaler`]). Gradients are communicated in the compute type.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use gpuctl_proto::pb::TrainResult;
use tch::{Device, Kind, Tensor};

use super::flat::{digest, FlatModel};
use super::memory::Memory;
use super::models::{Batch, Model, ModelConfig, Precision};
use crate::comm::Collectives;
use crate::timeline::{thin_evenly, MAX_STEP_TIMES};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Ddp,
    Fsdp,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Ddp => "ddp",
            Mode::Fsdp => "fsdp",
        }
    }
}

#[derive(Clone, Debug)]
pub struct TrainConfig {
    pub mode: Mode,
    pub model: ModelConfig,
    pub batch_size: i64,
    pub steps: u64,
    pub warmup_steps: u64,
    /// Timed steps of the no-communication baseline (0: none).
    pub baseline_steps: u64,
    pub bucket_bytes: u64,
    pub lr: f64,
    pub momentum: f64,
    pub seed: u64,
}

impl TrainConfig {
    /// Learning rate per model, chosen so that synthetic batches train stably.
    pub fn default_lr(model: &str) -> f64 {
        match model {
            "gpt" => 0.05,
            "cnn" => 0.05,
            _ => 0.1,
        }
    }
}

/// What one run of [`train`] measured and ended with.
pub struct TrainOutput {
    pub result: TrainResult,
    /// Loss of every data-parallel step (warmup steps first).
    pub losses: Vec<f64>,
    /// Units per second of this rank with no communication (world > 1).
    pub baseline_per_s: Option<f64>,
    /// `samples_per_s / baseline_per_s`.
    pub scaling_efficiency: Option<f64>,
    /// The fp32 parameters after training, flat, on the CPU.
    pub params: Tensor,
    pub parameter_count: i64,
    pub steps_skipped: u64,
    pub final_loss_scale: Option<f64>,
}

/// Progress: phase, fraction of the whole run, metrics.
pub type ProgressFn<'a> = &'a dyn Fn(&str, f64, &[(&str, f64)]);

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

fn sync(dev: Device) {
    if let Device::Cuda(o) = dev {
        tch::Cuda::synchronize(o as i64);
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p / 100.0 * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// The optimizer state of one rank: whole (ddp) or its shard (fsdp).
struct State {
    /// fp32 master parameters: the whole flat buffer (ddp) or this rank's shard
    /// (fsdp). In ddp fp32 it is the compute buffer itself.
    master: Tensor,
    momentum: Tensor,
    /// fsdp: this rank's shard of the summed gradient (compute kind).
    grad_shard: Option<Tensor>,
    scaler: Option<LossScaler>,
}

pub(crate) struct Trainer<'a> {
    cfg: &'a TrainConfig,
    model: &'a Model,
    flat: FlatModel,
    st: State,
    kind: Kind,
    rank: usize,
    world: usize,
    buckets: Vec<Tensor>,
    skipped: u64,
}

pub(crate) struct StepStats {
    pub loss: f64,
    pub seconds: f64,
    pub comm_seconds: f64,
}

impl Trainer<'_> {
    fn shard_range(&self) -> (i64, i64) {
        let c = self.flat.layout.shard(self.world);
        (self.rank as i64 * c, c)
    }

    /// One training step. `comm: None` is the no-communication baseline (ranks
    /// then update from their own gradients only).
    pub(crate) fn step<'c>(
        &mut self,
        batch: &Batch,
        mut comm: Option<&mut (dyn Collectives + 'c)>,
    ) -> Result<StepStats> {
        let dev = self.model.device;
        let t0 = Instant::now();
        let _ = self.flat.grad.shallow_clone().f_zero_()?;
        let loss = self.model.loss(batch)?;
        let scale = self.st.scaler.as_ref().map(|s| s.scale).unwrap_or(1.0);
        if scale != 1.0 {
            loss.f_mul_scalar(scale)?.f_backward()?;
        } else {
            loss.f_backward()?;
        }
        let mut comm_seconds = 0.0;
        let reduce_world = if comm.is_some() { self.world } else { 1 };
        tch::no_grad(|| -> Result<()> {
            // 1. Gradients: summed over ranks (or this rank's own).
            if let Some(c) = comm.as_deref_mut() {
                sync(dev);
                let tc = Instant::now();
                match self.cfg.mode {
                    Mode::Ddp => {
                        for b in &self.buckets {
                            c.all_reduce(b, b)
                                .context("all_reduce of a gradient bucket")?;
                        }
                    }
                    Mode::Fsdp => {
                        let gs = self.st.grad_shard.as_ref().unwrap();
                        c.reduce_scatter(&self.flat.grad, gs)
                            .context("reduce_scatter of the gradients")?;
                    }
                }
                sync(dev);
                comm_seconds += tc.elapsed().as_secs_f64();
            } else if self.cfg.mode == Mode::Fsdp {
                let (s, c) = self.shard_range();
                let gs = self.st.grad_shard.as_ref().unwrap();
                gs.shallow_clone()
                    .f_copy_(&self.flat.grad.f_narrow(0, s, c)?)?;
            }
            let g = match self.cfg.mode {
                Mode::Ddp => &self.flat.grad,
                Mode::Fsdp => self.st.grad_shard.as_ref().unwrap(),
            };
            let g32 = g
                .f_to_kind(Kind::Float)?
                .f_mul_scalar(1.0 / (reduce_world as f64 * scale))?;
            // 2. Loss scaling: every rank must agree on skipping.
            let mut take = true;
            if let Some(scaler) = self.st.scaler.as_mut() {
                let bad = g32
                    .f_isfinite()?
                    .f_all()?
                    .f_logical_not()?
                    .f_to_kind(Kind::Float)?
                    .f_reshape([1])?;
                if let (Some(c), Mode::Fsdp) = (comm.as_deref_mut(), self.cfg.mode) {
                    c.all_reduce(&bad, &bad)
                        .context("all_reduce of the inf flag")?;
                }
                let found_inf = bad.f_double_value(&[0])? > 0.0;
                take = scaler.update(found_inf);
                if !take {
                    self.skipped += 1;
                    tracing::debug!(scale, "inf/NaN gradients: step skipped, loss scale halved");
                }
            }
            // 3. SGD with momentum on the fp32 master (one rounding per op).
            if take {
                let m = &mut self.st.momentum;
                let _ = m.f_mul_scalar_(self.cfg.momentum)?;
                let _ = m.f_add_(&g32)?;
                let d = m.f_mul_scalar(self.cfg.lr)?;
                let _ = self.st.master.f_sub_(&d)?;
            }
            // 4. Compute parameters from the master.
            match self.cfg.mode {
                Mode::Ddp => {
                    if take && self.kind != Kind::Float {
                        self.flat.compute.shallow_clone().f_copy_(&self.st.master)?;
                    }
                }
                Mode::Fsdp => {
                    let send = self.st.master.f_to_kind(self.kind)?;
                    if let Some(c) = comm {
                        let tc = Instant::now();
                        c.all_gather(&send, &self.flat.compute)
                            .context("all_gather of the parameters")?;
                        sync(dev);
                        comm_seconds += tc.elapsed().as_secs_f64();
                    } else {
                        let (s, c) = self.shard_range();
                        self.flat.compute.f_narrow(0, s, c)?.f_copy_(&send)?;
                    }
                }
            }
            Ok(())
        })?;
        let loss = loss.f_double_value(&[])?;
        sync(dev);
        Ok(StepStats {
            loss,
            seconds: t0.elapsed().as_secs_f64(),
            comm_seconds,
        })
    }

    /// The full fp32 parameters (fsdp: gathered from the shards).
    fn full_master<'c>(&self, comm: Option<&mut (dyn Collectives + 'c)>) -> Result<Tensor> {
        match (self.cfg.mode, comm) {
            (Mode::Ddp, _) => Ok(self.st.master.shallow_clone()),
            (Mode::Fsdp, Some(c)) => {
                let full =
                    Tensor::f_zeros([self.flat.layout.padded], (Kind::Float, self.model.device))?;
                c.all_gather(&self.st.master, &full)
                    .context("all_gather of the fp32 parameters")?;
                Ok(full)
            }
            (Mode::Fsdp, None) => Ok(self.st.master.shallow_clone()),
        }
    }
}

impl<'a> Trainer<'a> {
    /// Moves `model` into flat buffers and sets up this rank's optimizer
    /// state, starting from rank 0's parameters when there is a communicator.
    pub(crate) fn new<'c>(
        cfg: &'a TrainConfig,
        model: &'a Model,
        comm: Option<&mut (dyn Collectives + 'c)>,
    ) -> Result<Trainer<'a>> {
        let (rank, world) = comm
            .as_ref()
            .map(|c| (c.rank(), c.world_size()))
            .unwrap_or((0, 1));
        let kind = cfg.model.precision.kind();
        let device = model.device;
        let (flat, mut master) = FlatModel::install(model, kind, world)?;
        let layout = flat.layout.clone();
        // Identical start on every rank: rank 0's parameters.
        if let Some(c) = comm {
            c.broadcast(&master, &master, 0)
                .context("broadcast of rank 0's initial parameters")?;
        }
        tch::no_grad(|| flat.compute.shallow_clone().f_copy_(&master))?;
        let st = match cfg.mode {
            Mode::Ddp => {
                if kind == Kind::Float {
                    master = flat.compute.shallow_clone();
                }
                State {
                    momentum: master.f_zeros_like()?,
                    master,
                    grad_shard: None,
                    scaler: None,
                }
            }
            Mode::Fsdp => {
                let c = layout.shard(world);
                let mut shard = Tensor::f_zeros([c], (Kind::Float, device))?;
                shard.f_copy_(&master.f_narrow(0, rank as i64 * c, c)?)?;
                drop(master);
                State {
                    momentum: shard.f_zeros_like()?,
                    master: shard,
                    grad_shard: Some(Tensor::f_zeros([c], (kind, device))?),
                    scaler: None,
                }
            }
        };
        let bucket_elems = (cfg.bucket_bytes / kind.elt_size_in_bytes() as u64).max(1) as i64;
        let mut buckets = Vec::new();
        let mut start = 0;
        while start < layout.padded {
            let n = bucket_elems.min(layout.padded - start);
            buckets.push(flat.grad.f_narrow(0, start, n)?);
            start += n;
        }
        Ok(Trainer {
            cfg,
            model,
            flat,
            st: State {
                scaler: (cfg.model.precision == Precision::Fp16).then(LossScaler::default),
                ..st
            },
            kind,
            rank,
            world,
            buckets,
            skipped: 0,
        })
    }
}

/// Trains `cfg` on `device` as rank `comm.rank()` of `comm.world_size()` (one
/// rank without `comm`). `mem` gives the peak memory; `progress` is called every step.
pub fn train(
    cfg: &TrainConfig,
    device: Device,
    mut comm: Option<&mut dyn Collectives>,
    mem: &Memory,
    progress: ProgressFn,
) -> Result<TrainOutput> {
    let (rank, world) = comm
        .as_ref()
        .map(|c| (c.rank(), c.world_size()))
        .unwrap_or((0, 1));
    if let Some(c) = comm.as_deref() {
        c.bind_thread()?;
    }
    progress("building the model", 0.0, &[]);
    let model = Model::build(&cfg.model, device, cfg.seed)?;
    let nparams = model.parameter_count();
    let mut tr = Trainer::new(cfg, &model, comm.as_deref_mut())?;
    let layout = tr.flat.layout.clone();
    tracing::info!(
        model = %cfg.model.name,
        parameters = nparams,
        precision = cfg.model.precision.name(),
        channels_last = model.uses_channels_last(),
        mode = cfg.mode.name(),
        batch = cfg.batch_size,
        world,
        "model ready"
    );
    // Each rank its own data: seed, rank.
    let batch = model.batch(
        cfg.batch_size,
        cfg.seed
            .wrapping_mul(1_000_003)
            .wrapping_add(rank as u64 + 1),
    )?;
    mem.sample();
    let units = (cfg.batch_size * model.units_per_sample()) as f64;
    let baseline_steps = if world > 1 { cfg.baseline_steps } else { 0 };
    let total = (if baseline_steps > 0 {
        cfg.warmup_steps + baseline_steps
    } else {
        0
    } + cfg.warmup_steps
        + cfg.steps)
        .max(1) as f64;
    let mut done = 0u64;

    // The one-GPU baseline: the same steps with no communication.
    let mut baseline_per_s = None;
    if baseline_steps > 0 {
        // Host copies (`to_device(Cpu)` of a CPU tensor would be the same tensor).
        let host_copy = |t: &Tensor| -> Result<Tensor> {
            let mut h = Tensor::f_empty(t.size(), (t.kind(), Device::Cpu))?;
            h.f_copy_(t)?;
            Ok(h)
        };
        let saved_master = host_copy(&tr.st.master)?;
        let saved_compute = host_copy(&tr.flat.compute)?;
        for i in 0..cfg.warmup_steps {
            progress(
                &format!("baseline warmup {}/{}", i + 1, cfg.warmup_steps),
                done as f64 / total,
                &[],
            );
            tr.step(&batch, None)?;
            done += 1;
        }
        let mut secs = 0.0;
        for i in 0..baseline_steps {
            let s = tr.step(&batch, None)?;
            secs += s.seconds;
            done += 1;
            progress(
                &format!("baseline step {}/{}", i + 1, baseline_steps),
                done as f64 / total,
                &[("samples_per_s", units / s.seconds)],
            );
        }
        let per_s = units * baseline_steps as f64 / secs.max(1e-12);
        baseline_per_s = Some(per_s);
        tracing::info!(per_s, unit = model.unit(), "baseline without communication");
        tch::no_grad(|| -> Result<()> {
            tr.st.master.shallow_clone().f_copy_(&saved_master)?;
            tr.flat.compute.shallow_clone().f_copy_(&saved_compute)?;
            let _ = tr.st.momentum.f_zero_()?;
            Ok(())
        })?;
        tr.st.scaler = (cfg.model.precision == Precision::Fp16).then(LossScaler::default);
        tr.skipped = 0;
    }

    let mut losses = Vec::new();
    for i in 0..cfg.warmup_steps {
        progress(
            &format!("warmup {}/{}", i + 1, cfg.warmup_steps),
            done as f64 / total,
            &[],
        );
        let s = tr.step(&batch, comm.as_deref_mut())?;
        losses.push(s.loss);
        done += 1;
    }
    mem.sample();
    let mut times = Vec::with_capacity(cfg.steps as usize);
    let mut comm_s = 0.0;
    for i in 0..cfg.steps {
        let s = tr.step(&batch, comm.as_deref_mut())?;
        if !s.loss.is_finite() && cfg.model.precision != Precision::Fp16 {
            bail!("the loss became {} at step {}", s.loss, i + 1);
        }
        losses.push(s.loss);
        times.push(s.seconds);
        comm_s += s.comm_seconds;
        done += 1;
        if i % 8 == 0 || i + 1 == cfg.steps {
            mem.sample();
        }
        progress(
            &format!("train step {}/{}", i + 1, cfg.steps),
            done as f64 / total,
            &[("samples_per_s", units / s.seconds), ("loss", s.loss)],
        );
    }
    let total_s: f64 = times.iter().sum();
    let per_s = units * cfg.steps as f64 / total_s.max(1e-12);
    let mut sorted = times.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let full = tr.full_master(comm)?;
    let full = full.f_narrow(0, 0, layout.len)?;
    let param_digest = digest(&full)?;
    let params = full.f_to_device(Device::Cpu)?;
    let scaling_efficiency = baseline_per_s.map(|b| per_s / b);
    let result = TrainResult {
        model: cfg.model.name.clone(),
        precision: cfg.model.precision.name().into(),
        batch_size: cfg.batch_size as u32,
        steps: cfg.steps,
        samples_per_s: per_s,
        step_ms_p50: percentile(&sorted, 50.0) * 1e3,
        step_ms_p99: percentile(&sorted, 99.0) * 1e3,
        param_digest,
        final_loss: losses.last().copied().unwrap_or(f64::NAN),
        unit: model.unit().into(),
        mode: cfg.mode.name().into(),
        peak_memory_bytes: mem.peak(),
        comm_ms_per_step: comm_s / cfg.steps.max(1) as f64 * 1e3,
        parameters: nparams.max(0) as u64,
        driver_peak_memory_bytes: mem.driver_peak(),
        step_ms: thin_evenly(&times, MAX_STEP_TIMES)
            .into_iter()
            .map(|t| t * 1e3)
            .collect(),
        ..Default::default()
    };
    tracing::info!(
        per_s,
        unit = model.unit(),
        p50_ms = result.step_ms_p50,
        p99_ms = result.step_ms_p99,
        comm_ms = result.comm_ms_per_step,
        baseline_per_s = baseline_per_s.unwrap_or(0.0),
        scaling_efficiency = scaling_efficiency.unwrap_or(1.0),
        final_loss = result.final_loss,
        peak_memory_bytes = result.peak_memory_bytes,
        digest = %result.param_digest,
        skipped = tr.skipped,
        "training done"
    );
    Ok(TrainOutput {
        result,
        losses,
        baseline_per_s,
        scaling_efficiency,
        params,
        parameter_count: nparams,
        steps_skipped: tr.skipped,
        final_loss_scale: tr.st.scaler.as_ref().map(|s| s.scale),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::flat::{view_like, Layout};
    use crate::workloads::models::gpt::GptConfig;

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
    fn layout_aligns_and_pads() {
        let l = Layout::new(&[3, 64, 65, 1], 3);
        assert_eq!(l.entries, vec![(0, 3), (64, 64), (128, 65), (256, 1)]);
        assert_eq!(l.len, 257);
        assert_eq!(l.padded, 258);
        assert_eq!(l.shard(3), 86);
    }

    #[test]
    fn views_keep_strides_and_grads_land_in_the_flat_buffer() {
        let cfg = ModelConfig {
            name: "cnn".into(),
            precision: Precision::Fp32,
            channels_last: true,
            gpt: GptConfig::cpu(16),
        };
        let model = Model::build(&cfg, Device::Cpu, 3).unwrap();
        let before: Vec<(Vec<i64>, Tensor)> = model
            .vs
            .trainable_variables()
            .iter()
            .map(|v| (v.stride(), v.detach().copy()))
            .collect();
        let (flat, master) = FlatModel::install(&model, Kind::Float, 2).unwrap();
        let vars = model.vs.trainable_variables();
        for ((v, (stride, val)), &(off, n)) in vars.iter().zip(&before).zip(&flat.layout.entries) {
            assert_eq!(&v.stride(), stride);
            assert!(v.equal(val));
            assert_eq!(
                v.data_ptr() as usize,
                flat.compute.data_ptr() as usize + off as usize * 4
            );
            assert!(master.narrow(0, off, n).equal(&val.reshape([-1])));
        }
        let b = model.batch(4, 1).unwrap();
        model.loss(&b).unwrap().backward();
        let mut nonzero = 0;
        for (v, &(off, _)) in vars.iter().zip(&flat.layout.entries) {
            let g = v.grad();
            assert_eq!(
                g.data_ptr() as usize,
                flat.grad.data_ptr() as usize + off as usize * 4
            );
            assert!(view_like(&flat.grad, off, v).unwrap().equal(&g));
            if g.abs().sum(Kind::Float).double_value(&[]) > 0.0 {
                nonzero += 1;
            }
        }
        assert!(nonzero > vars.len() / 2, "{nonzero} of {}", vars.len());
    }

    #[test]
    fn percentiles() {
        let v: Vec<f64> = (1..=100).map(|x| x as f64).collect();
        assert_eq!(percentile(&v, 50.0), 51.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }
}

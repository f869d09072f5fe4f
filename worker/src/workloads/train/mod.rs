//! The training loop shared by `ddp` and `fsdp`.
//!
//! A model comes in stages (stem, blocks, head) and its trainable variables
//! in units (the root, one per block). Forward and backward run stage by
//! stage ([`staged`]), so each unit's gradients are complete at a known
//! moment, and collectives start right then on a side stream (NCCL on a
//! second CUDA stream; the TCP backend runs them when called):
//!
//! * **ddp** ([`replicated`]) keeps the whole model; gradient buckets of whole
//!   units are all-reduced under the rest of backward, and every rank applies
//!   the same update to its fp32 master copy.
//! * **fsdp** ([`sharded`]) keeps 1/world of every unit's fp32 master and
//!   momentum; a block's parameters are all-gathered before its forward and
//!   again before its backward, its gradients reduce-scattered right after.
//!
//! Parameters and gradients live in flat buffers ([`flat`]) that the
//! variables are views of. In bf16 and fp16 the model computes in that type
//! and the update goes to fp32 master weights ([`optim`]); fp16 adds dynamic
//! loss scaling. Gradients are communicated in the compute type.
//!
//! Communication time is what the side stream spent in collectives; the
//! exposed part is what compute stood waiting for them; the overlap share is
//! the rest over the whole.

pub mod flat;
pub mod loader;
pub mod optim;
mod profile;
mod replicated;
mod sharded;
pub mod staged;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use gpuctl_proto::pb::{PhaseKind, TrainResult};
use tch::{Device, Kind, Tensor};

pub use optim::LossScaler;

use self::optim::{CommClock, Sgd};
use self::replicated::Replicated;
use self::sharded::Sharded;
use super::memory::Memory;
use super::models::{Batch, Model, ModelConfig, Precision};
use crate::comm::Collectives;
use crate::digest::digest;
use gpuctl_core::stats::{median, quantile_sorted, thin_evenly};

use crate::timeline::MAX_STEP_TIMES;

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
    /// Timed steps of the no-communication baseline (0: none; ddp only).
    pub baseline_steps: u64,
    pub bucket_bytes: u64,
    pub lr: f64,
    pub momentum: f64,
    pub seed: u64,
    /// A single rank that trains on the batches `data_ranks` ranks would
    /// have had, end to end (0 or 1: its own): the reference a data-parallel
    /// run must match.
    pub data_ranks: usize,
    /// Hand the trained fp32 parameters back in [`TrainOutput::params`].
    pub keep_params: bool,
    /// The model's size where it has one (gpt: `1.3b`), for the result.
    pub variant: String,
    /// The loader sweep after training (ddp).
    pub loader: Option<LoaderSweep>,
    /// The operator profile after training.
    pub profile: Option<ProfileRun>,
}

/// `--loader-workers`: the worker counts to sweep, the augment passes per
/// sample and the timed steps of each setting.
#[derive(Clone, Debug)]
pub struct LoaderSweep {
    pub workers: Vec<u32>,
    pub work: u32,
    /// CPU µs each sample costs at least (0: the passes alone).
    pub cpu_us: u64,
    pub steps: u64,
}

/// `--profile`: steps to profile, and the folder the Chrome trace goes to.
#[derive(Clone, Debug)]
pub struct ProfileRun {
    pub steps: u64,
    pub dir: PathBuf,
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
    /// The fp32 parameters after training, every unit padded, end to end, on
    /// the CPU (with `keep_params`; otherwise empty).
    pub params: Tensor,
    pub parameter_count: i64,
    pub steps_skipped: u64,
    pub final_loss_scale: Option<f64>,
}

/// Progress: phase, fraction of the whole run, metrics.
pub type ProgressFn<'a> = &'a dyn Fn(&str, f64, &[(&str, f64)]);

/// Where training reports: a line a step, and the phases it enters, so
/// that the rules judge its timed steps and not what it checks after them.
pub trait Reporter {
    fn update(&self, phase: &str, fraction: f64, metrics: &[(&str, f64)]);
    fn enter(&self, kind: PhaseKind);
}

/// Reports nowhere (tests, tools).
pub struct Quiet;

impl Reporter for Quiet {
    fn update(&self, _: &str, _: f64, _: &[(&str, f64)]) {}
    fn enter(&self, _: PhaseKind) {}
}

pub(super) fn sync(dev: Device) {
    if let Device::Cuda(o) = dev {
        tch::Cuda::synchronize(o as i64);
    }
}

enum State {
    Replicated(Replicated),
    Sharded(Sharded),
}

/// One rank's training state: the model, its flat buffers and optimizer state.
pub(crate) struct Trainer<'a> {
    model: &'a Model,
    state: State,
    sgd: Sgd,
}

pub(crate) struct StepStats {
    pub loss: f64,
    pub seconds: f64,
    /// Communication of the step, and the part compute stood waiting for.
    pub comm_seconds: f64,
    pub exposed_seconds: f64,
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
        let scaler = (cfg.model.precision == Precision::Fp16).then(LossScaler::default);
        let state = match cfg.mode {
            Mode::Ddp => State::Replicated(Replicated::new(
                model,
                kind,
                world,
                cfg.bucket_bytes,
                scaler,
                comm,
            )?),
            Mode::Fsdp => State::Sharded(Sharded::new(model, kind, rank, world, scaler, comm)?),
        };
        Ok(Trainer {
            model,
            state,
            sgd: Sgd {
                lr: cfg.lr,
                momentum: cfg.momentum,
            },
        })
    }

    /// One training step. `comm: None` is the no-communication baseline (ranks
    /// then update from their own gradients only; ddp).
    pub(crate) fn step<'c>(
        &mut self,
        batch: &Batch,
        mut comm: Option<&mut (dyn Collectives + 'c)>,
    ) -> Result<StepStats> {
        let dev = self.model.device;
        let t0 = Instant::now();
        let mut clock = CommClock::default();
        let loss = match &mut self.state {
            State::Replicated(r) => {
                r.step(self.model, batch, self.sgd, comm.as_deref_mut(), &mut clock)?
            }
            State::Sharded(s) => {
                s.step(self.model, batch, self.sgd, comm.as_deref_mut(), &mut clock)?
            }
        };
        let loss = loss.f_double_value(&[])?;
        sync(dev);
        let seconds = t0.elapsed().as_secs_f64();
        let t = clock.finish(comm)?;
        Ok(StepStats {
            loss,
            seconds,
            comm_seconds: t.busy_s,
            exposed_seconds: t.stalled_s.min(t.busy_s),
        })
    }

    fn skipped(&self) -> u64 {
        match &self.state {
            State::Replicated(r) => r.skipped,
            State::Sharded(s) => s.skipped,
        }
    }

    fn loss_scale(&self) -> Option<f64> {
        match &self.state {
            State::Replicated(r) => r.scaler.as_ref().map(|s| s.scale),
            State::Sharded(s) => s.scaler.as_ref().map(|s| s.scale),
        }
    }
}

/// A single rank's batch of `size` per rank for `ranks` ranks, end to end.
fn reference_batch(model: &Model, size: i64, seed: u64, ranks: usize) -> Result<Batch> {
    let parts: Vec<Batch> = (0..ranks)
        .map(|r| model.batch(size, rank_seed(seed, r)))
        .collect::<Result<_>>()?;
    let xs: Vec<&Tensor> = parts.iter().map(|b| &b.x).collect();
    let ys: Vec<&Tensor> = parts.iter().map(|b| &b.y).collect();
    Ok(Batch {
        x: Tensor::f_cat(&xs, 0)?,
        y: Tensor::f_cat(&ys, 0)?,
        size: size * ranks as i64,
    })
}

/// Each rank its own data: seed, rank.
pub(super) fn rank_seed(seed: u64, rank: usize) -> u64 {
    seed.wrapping_mul(1_000_003).wrapping_add(rank as u64 + 1)
}

/// Trains `cfg` on `device` as rank `comm.rank()` of `comm.world_size()` (one
/// rank without `comm`). `mem` gives the peak memory; `progress` is called every step.
pub fn train(
    cfg: &TrainConfig,
    device: Device,
    mut comm: Option<&mut dyn Collectives>,
    mem: &Memory,
    progress: &dyn Reporter,
) -> Result<TrainOutput> {
    let (rank, world) = comm
        .as_ref()
        .map(|c| (c.rank(), c.world_size()))
        .unwrap_or((0, 1));
    if let Some(c) = comm.as_deref() {
        c.bind_thread()?;
    }
    progress.update("building the model", 0.0, &[]);
    let model = Model::build(&cfg.model, device, cfg.seed)?;
    let nparams = model.parameter_count();
    let mut tr = Trainer::new(cfg, &model, comm.as_deref_mut())?;
    tracing::info!(
        model = %cfg.model.name,
        parameters = nparams,
        precision = cfg.model.precision.name(),
        channels_last = model.uses_channels_last(),
        mode = cfg.mode.name(),
        batch = cfg.batch_size,
        blocks = model.blocks(),
        world,
        overlapped = comm.as_deref().is_some_and(|c| c.overlaps()),
        "model ready"
    );
    let batch = if world == 1 && cfg.data_ranks > 1 {
        reference_batch(&model, cfg.batch_size, cfg.seed, cfg.data_ranks)?
    } else {
        model.batch(cfg.batch_size, rank_seed(cfg.seed, rank))?
    };
    // The full fp32 model that was built is gone: training's peak is its own.
    sync(device);
    mem.empty_cache();
    let installed = mem.stats().map(|s| s.allocated);
    mem.reset_all_peaks();
    mem.sample();
    let units = (batch.size * model.units_per_sample()) as f64;
    // fsdp's parameters need the other ranks: it has no one-rank baseline.
    let baseline_steps = if world > 1 && cfg.mode == Mode::Ddp {
        cfg.baseline_steps
    } else {
        0
    };
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
        let State::Replicated(r) = &tr.state else {
            bail!("internal: a baseline needs the replicated state");
        };
        let saved = r.save()?;
        progress.enter(PhaseKind::Warmup);
        for i in 0..cfg.warmup_steps {
            progress.update(
                &format!("baseline warmup {}/{}", i + 1, cfg.warmup_steps),
                done as f64 / total,
                &[],
            );
            tr.step(&batch, None)?;
            done += 1;
        }
        let mut secs = Vec::with_capacity(baseline_steps as usize);
        progress.enter(PhaseKind::Measured);
        for i in 0..baseline_steps {
            let s = tr.step(&batch, None)?;
            secs.push(s.seconds);
            done += 1;
            progress.update(
                &format!("baseline step {}/{}", i + 1, baseline_steps),
                done as f64 / total,
                &[("samples_per_s", units / s.seconds)],
            );
        }
        // The median step, not the mean: ten steps of a small model are a
        // fifth of a second, and one step held up by the host (the ranks of
        // a node take their baselines at once) moved a healthy H100's
        // figure to 0.94x of its peers' (docs/benchmarks.md, loader).
        let step = gpuctl_core::stats::median(secs).unwrap_or(0.0);
        let per_s = units / step.max(1e-12);
        baseline_per_s = Some(per_s);
        tracing::info!(per_s, unit = model.unit(), "baseline without communication");
        if let State::Replicated(r) = &mut tr.state {
            r.restore(&saved)?;
            r.scaler = (cfg.model.precision == Precision::Fp16).then(LossScaler::default);
            r.skipped = 0;
        }
    }

    let mut losses = Vec::new();
    progress.enter(PhaseKind::Warmup);
    for i in 0..cfg.warmup_steps {
        progress.update(
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
    let (mut comm_s, mut exposed_s) = (0.0, 0.0);
    progress.enter(PhaseKind::Measured);
    for i in 0..cfg.steps {
        let s = tr.step(&batch, comm.as_deref_mut())?;
        if !s.loss.is_finite() && cfg.model.precision != Precision::Fp16 {
            bail!("the loss became {} at step {}", s.loss, i + 1);
        }
        losses.push(s.loss);
        times.push(s.seconds);
        comm_s += s.comm_seconds;
        exposed_s += s.exposed_seconds;
        done += 1;
        if i % 8 == 0 || i + 1 == cfg.steps {
            mem.sample();
        }
        progress.update(
            &format!("train step {}/{}", i + 1, cfg.steps),
            done as f64 / total,
            &[("samples_per_s", units / s.seconds), ("loss", s.loss)],
        );
    }
    // Read before the digests gather anything.
    let (peak, driver_peak) = (mem.peak(), mem.driver_peak());
    progress.enter(PhaseKind::Verify);
    progress.update("comparing parameters", 1.0, &[]);
    if let Some(s) = mem.stats() {
        tracing::info!(
            installed = installed.unwrap_or(0),
            allocated = s.allocated,
            peak,
            reserved_peak = s.reserved_peak,
            "device memory: after install, after training, peak"
        );
    }
    let total_s: f64 = times.iter().sum();
    let per_s = units * cfg.steps as f64 / total_s.max(1e-12);
    let mut sorted = times.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let mut result = TrainResult {
        model: cfg.model.name.clone(),
        precision: cfg.model.precision.name().into(),
        batch_size: cfg.batch_size as u32,
        steps: cfg.steps,
        samples_per_s: per_s,
        step_ms_p50: median(times.clone()).unwrap_or(0.0) * 1e3,
        step_ms_p99: quantile_sorted(&sorted, 0.99).unwrap_or(0.0) * 1e3,
        final_loss: losses.last().copied().unwrap_or(f64::NAN),
        unit: model.unit().into(),
        mode: cfg.mode.name().into(),
        peak_memory_bytes: peak,
        comm_ms_per_step: comm_s / cfg.steps.max(1) as f64 * 1e3,
        comm_exposed_ms_per_step: exposed_s / cfg.steps.max(1) as f64 * 1e3,
        overlap_share: if comm_s > 0.0 {
            (1.0 - exposed_s / comm_s).clamp(0.0, 1.0)
        } else {
            0.0
        },
        parameters: nparams.max(0) as u64,
        driver_peak_memory_bytes: driver_peak,
        step_ms: thin_evenly(&times, MAX_STEP_TIMES)
            .into_iter()
            .map(|t| t * 1e3)
            .collect(),
        variant: if model.is_gpt() {
            cfg.variant.clone()
        } else {
            String::new()
        },
        ..Default::default()
    };
    let params = match &tr.state {
        State::Replicated(r) => {
            result.param_digest = digest(&r.master)?;
            if cfg.keep_params {
                r.master.f_to_kind(Kind::Float)?.f_to_device(Device::Cpu)?
            } else {
                Tensor::f_zeros([0], (Kind::Float, Device::Cpu))?
            }
        }
        State::Sharded(s) => {
            let d = s.digests(comm.as_deref_mut())?;
            result.param_digest = d.full;
            result.shard_digest = d.own;
            result.gathered_shard_digests = d.gathered;
            if cfg.keep_params {
                s.full_params(comm.as_deref_mut())?
            } else {
                Tensor::f_zeros([0], (Kind::Float, Device::Cpu))?
            }
        }
    };
    // After the digests: these steps change the parameters, and every rank
    // takes the same number of them, so the collectives still pair up.
    if let Some(p) = &cfg.profile {
        progress.enter(PhaseKind::Sweep);
        result.profile = Some(Box::new(profile::profile_steps(
            cfg, p, &mut tr, &batch, rank, comm, progress,
        )?));
    }
    // The loader makes images: a GPT of a `--model cnn,gpt` list has no sweep.
    if let Some(l) = cfg.loader.as_ref().filter(|_| !model.is_gpt()) {
        progress.enter(PhaseKind::Sweep);
        result.loader = loader::sweep(cfg, l, &mut tr, &model, rank, progress)?;
    }
    let scaling_efficiency = baseline_per_s.map(|b| per_s / b);
    tracing::info!(
        per_s,
        unit = model.unit(),
        p50_ms = result.step_ms_p50,
        p99_ms = result.step_ms_p99,
        comm_ms = result.comm_ms_per_step,
        exposed_ms = result.comm_exposed_ms_per_step,
        overlap = result.overlap_share,
        baseline_per_s = baseline_per_s.unwrap_or(0.0),
        scaling_efficiency = scaling_efficiency.unwrap_or(1.0),
        final_loss = result.final_loss,
        peak_memory_bytes = result.peak_memory_bytes,
        digest = %result.param_digest,
        skipped = tr.skipped(),
        "training done"
    );
    Ok(TrainOutput {
        result,
        losses,
        baseline_per_s,
        scaling_efficiency,
        params,
        parameter_count: nparams,
        steps_skipped: tr.skipped(),
        final_loss_scale: tr.loss_scale(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::models::gpt::GptConfig;
    use flat::{view_like, Layout};

    #[test]
    fn views_keep_strides_and_grads_land_in_the_flat_buffer() {
        let cfg = ModelConfig {
            name: "cnn".into(),
            precision: Precision::Fp32,
            channels_last: true,
            gpt: GptConfig::cpu(16),
        };
        let model = Model::build(&cfg, Device::Cpu, 3).unwrap();
        let units = model.units();
        let before: Vec<Vec<(Vec<i64>, Tensor)>> = units
            .iter()
            .map(|u| u.iter().map(|v| (v.stride(), v.detach().copy())).collect())
            .collect();
        let r = Replicated::new(&model, Kind::Float, 2, 1 << 20, None, None).unwrap();
        let lay: &Layout = &r.layout;
        let units = model.units();
        for (u, vars) in units.iter().enumerate() {
            for ((v, (stride, val)), &(off, n)) in
                vars.iter().zip(&before[u]).zip(&lay.units[u].entries)
            {
                let off = lay.offsets[u] + off;
                assert_eq!(&v.stride(), stride);
                assert!(v.equal(val));
                assert_eq!(
                    v.data_ptr() as usize,
                    r.compute.data_ptr() as usize + off as usize * 4
                );
                assert_eq!(v.numel() as i64, n);
                assert!(view_like(&r.master, off, v).unwrap().equal(val));
            }
        }
        let b = model.batch(4, 1).unwrap();
        model.loss(&b).unwrap().backward();
        let mut nonzero = 0;
        let mut count = 0;
        for (u, vars) in units.iter().enumerate() {
            for (v, &(off, _)) in vars.iter().zip(&lay.units[u].entries) {
                let off = lay.offsets[u] + off;
                let g = v.grad();
                assert_eq!(
                    g.data_ptr() as usize,
                    r.grad.data_ptr() as usize + off as usize * 4
                );
                assert!(view_like(&r.grad, off, v).unwrap().equal(&g));
                count += 1;
                if g.abs().sum(Kind::Float).double_value(&[]) > 0.0 {
                    nonzero += 1;
                }
            }
        }
        assert!(nonzero > count / 2, "{nonzero} of {count}");
    }
}

//! `ddp`: data-parallel training, gradients all-reduced in buckets
//! (`train.rs` holds the loop; this file reads the job's parameters).
//!
//! Before the data-parallel phase every rank (of a job with 2 ranks or more)
//! times `min(steps, 10)` steps with no communication: the one-GPU baseline of
//! the same job, measured in the same run. `TrainResult` has no field for it,
//! so it goes to the log and to the last progress report (metrics
//! `baseline_samples_per_s`, `scaling_efficiency`).

use anyhow::{Context, Result};
use gpuctl_core::catalogue::{TrainModel, TrainParams};
use gpuctl_proto::pb::{rank_result::Detail, PhaseKind, TrainResult};

use super::memory::Memory;
use super::models::{gpt::GptConfig, ModelConfig, Precision};
use super::train::{train, LoaderSweep, Mode, ProfileRun, Reporter, TrainConfig};
use super::Outcome;
use crate::comm::watched::Units;
use crate::context::Ctx;

/// Timed steps of the no-communication baseline at most.
pub const BASELINE_STEPS: u64 = 10;

/// The cores this rank may use for its loader: what the process may run on
/// (its affinity and CPU quota, as the standard library reads them) shared
/// evenly with the job's other ranks on this host.
fn rank_cores(local_ranks: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / local_ranks.max(1)).max(1)
}

/// `--loader-workers auto`: 0, then the powers of two up to `cores`, and
/// `cores` itself; at most the sweep's bound of settings (the largest
/// kept), so that the knee of the host's curve is inside the sweep.
pub fn auto_loader_workers(cores: usize) -> Vec<u32> {
    let max = gpuctl_core::catalogue::MAX_LOADER_SETTINGS;
    let cores = cores.min(64) as u32;
    let mut w: Vec<u32> = std::iter::once(0)
        .chain((0..7).map(|k| 1u32 << k).take_while(|&n| n <= cores))
        .collect();
    if !w.contains(&cores) {
        w.push(cores);
    }
    while w.len() > max {
        w.remove(1);
    }
    w
}

/// The GPT shape of a job: its `gpt_size` (`toy` on a CPU by default).
pub fn gpt_config(size: &str, seq_len: u64) -> Result<GptConfig> {
    GptConfig::sized(size, seq_len as i64)
}

/// The training configuration of one model of a job.
pub fn config(ctx: &Ctx, p: &TrainParams, tm: &TrainModel, mode: Mode) -> Result<TrainConfig> {
    let m = &tm.model;
    let loader_workers = if p.loader_auto {
        auto_loader_workers(rank_cores(ctx.env.local_world_size))
    } else {
        p.loader_workers.clone()
    };
    Ok(TrainConfig {
        mode,
        model: ModelConfig {
            gpt: gpt_config(&m.gpt_size, m.seq_len)?,
            name: m.model.clone(),
            precision: Precision::parse(&m.precision)?,
            channels_last: p.channels_last,
        },
        batch_size: tm.batch_size as i64,
        steps: p.steps,
        warmup_steps: p.warmup_steps,
        baseline_steps: p.steps.min(BASELINE_STEPS),
        // A floor of the bucketing, not a rule of the parameter.
        bucket_bytes: p.bucket_bytes.max(1024),
        lr: TrainConfig::default_lr(&m.model),
        momentum: 0.9,
        seed: 1234,
        data_ranks: 0,
        keep_params: false,
        variant: m.gpt_size.clone(),
        loader: (!loader_workers.is_empty()).then(|| LoaderSweep {
            workers: loader_workers,
            work: p.loader_work.min(u32::MAX as u64) as u32,
            cpu_us: p.loader_cpu_us,
            steps: p.loader_steps,
        }),
        // The agent's folder of the job: where it keeps what a rank leaves.
        profile: (p.profile_steps > 0).then(|| ProfileRun {
            steps: p.profile_steps,
            dir: std::env::current_dir().unwrap_or_else(|_| std::env::temp_dir()),
        }),
    })
}

/// Runs `ddp` or `fsdp` as this rank of the job: each model of the list in
/// turn, over the one communicator. A model that fails after others trained
/// keeps their results; the error names it.
pub fn run_mode(ctx: &Ctx, params: &TrainParams, mode: Mode) -> Result<Outcome> {
    super::models::use_cudnn_heuristics(ctx.dev.device);
    let mem = Memory::new(&ctx.dev);
    let mut comm = if ctx.env.world_size > 1 {
        ctx.progress.update("connecting", 0.0, &[]);
        Some(ctx.make_comm(Units::Own)?)
    } else {
        None
    };
    let nccl_version = comm.as_ref().map(|c| c.version());
    let n = params.models.len();
    let mut results: Vec<TrainResult> = Vec::with_capacity(n);
    let mut error = None;
    let mut metrics = Vec::new();
    for (i, tm) in params.models.iter().enumerate() {
        let cfg = config(ctx, params, tm, mode)?;
        let name = tm.model.model.as_str();
        if i > 0 {
            // Each model's peaks are its own: the last model's tensors are
            // gone, its cached blocks go back to the driver, peaks restart.
            mem.empty_cache();
            mem.reset_all_peaks();
        }
        let progress = ModelProgress {
            ctx,
            model: (n > 1).then_some(name),
            done: i as f64 / n as f64,
            share: 1.0 / n as f64,
        };
        let out = train(
            &cfg,
            ctx.dev.device,
            comm.as_deref_mut()
                .map(|c| c as &mut dyn crate::comm::Collectives),
            &mem,
            &progress,
        );
        let mut out = match out {
            Ok(o) => o,
            Err(e) if n == 1 => return Err(e),
            Err(e) if results.is_empty() => return Err(e.context(format!("model {name}"))),
            Err(e) => {
                error = Some(format!("model {name}: {e:#}"));
                break;
            }
        };
        ctx.sample_memory();
        metrics = vec![("samples_per_s", out.result.samples_per_s)];
        if let (Some(b), Some(e)) = (out.baseline_per_s, out.scaling_efficiency) {
            out.result.baseline_samples_per_s = b;
            out.result.scaling_efficiency = e;
            metrics.push(("baseline_samples_per_s", b));
            metrics.push(("scaling_efficiency", e));
        }
        results.push(out.result);
    }
    ctx.progress.update("trained", 1.0, &metrics);
    let mut results = results.into_iter();
    let first = results.next().context("no model to train")?;
    Ok(Outcome {
        detail: Detail::Train(first),
        nccl_version,
        error,
        more_train: results.collect(),
    })
}

pub fn run(ctx: &Ctx, params: &TrainParams) -> Result<Outcome> {
    run_mode(ctx, params, Mode::Ddp)
}

/// One model's progress within a list: its phases prefixed with its name
/// when there are several, its fraction a share of the whole.
struct ModelProgress<'a> {
    ctx: &'a Ctx,
    model: Option<&'a str>,
    done: f64,
    share: f64,
}

impl Reporter for ModelProgress<'_> {
    /// train() calls this once a step: each call is a unit of progress.
    fn update(&self, phase: &str, frac: f64, metrics: &[(&str, f64)]) {
        let p = &self.ctx.progress;
        p.tick(1);
        let frac = self.done + frac * self.share;
        match self.model {
            Some(name) => p.update(&format!("{name}: {phase}"), frac, metrics),
            None => p.update(phase, frac, metrics),
        }
    }

    fn enter(&self, kind: PhaseKind) {
        self.ctx.progress.enter(kind);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_loader_workers_reach_the_ranks_cores_within_the_sweeps_bound() {
        assert_eq!(auto_loader_workers(1), vec![0, 1]);
        assert_eq!(auto_loader_workers(2), vec![0, 1, 2]);
        assert_eq!(auto_loader_workers(6), vec![0, 1, 2, 4, 6]);
        assert_eq!(auto_loader_workers(16), vec![0, 1, 2, 4, 8, 16]);
        // 8 settings at most: the smallest counts after 0 give way.
        assert_eq!(auto_loader_workers(100), vec![0, 1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(auto_loader_workers(96), vec![0, 1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(auto_loader_workers(48), vec![0, 1, 2, 4, 8, 16, 32, 48]);
    }
}

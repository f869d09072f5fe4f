//! `ddp`: data-parallel training, gradients all-reduced in buckets
//! (`train.rs` holds the loop; this file reads the job's parameters).
//!
//! Before the data-parallel phase every rank (of a job with 2 ranks or more)
//! times `min(steps, 10)` steps with no communication: the one-GPU baseline of
//! the same job, measured in the same run. `TrainResult` has no field for it,
//! so it goes to the log and to the last progress report (metrics
//! `baseline_samples_per_s`, `scaling_efficiency`).

use anyhow::Result;
use gpuctl_proto::catalogue::TrainParams;
use gpuctl_proto::pb::rank_result::Detail;

use super::memory::Memory;
use super::models::{gpt::GptConfig, ModelConfig, Precision};
use super::train::{train, Mode, TrainConfig};
use super::Outcome;
use crate::context::Ctx;

/// Timed steps of the no-communication baseline at most.
pub const BASELINE_STEPS: u64 = 10;

/// The GPT shape for a device (the CPU one is a toy).
pub fn gpt_config(gpu: bool, seq_len: u64) -> GptConfig {
    if gpu {
        GptConfig::gpu(seq_len as i64)
    } else {
        GptConfig::cpu(seq_len as i64)
    }
}

/// The training configuration of a job.
pub fn config(ctx: &Ctx, p: &TrainParams, mode: Mode) -> Result<TrainConfig> {
    let m = &p.model;
    Ok(TrainConfig {
        mode,
        model: ModelConfig {
            gpt: gpt_config(ctx.dev.is_cuda(), m.seq_len),
            name: m.model.clone(),
            precision: Precision::parse(&m.precision)?,
            channels_last: p.channels_last,
        },
        batch_size: p.batch_size as i64,
        steps: p.steps,
        warmup_steps: p.warmup_steps,
        baseline_steps: p.steps.min(BASELINE_STEPS),
        // A floor of the bucketing, not a rule of the parameter.
        bucket_bytes: p.bucket_bytes.max(1024),
        lr: TrainConfig::default_lr(&m.model),
        momentum: 0.9,
        seed: 1234,
    })
}

/// Runs `ddp` or `fsdp` as this rank of the job.
pub fn run_mode(ctx: &Ctx, params: &TrainParams, mode: Mode) -> Result<Outcome> {
    let cfg = config(ctx, params, mode)?;
    if ctx.dev.is_cuda() {
        tch::Cuda::cudnn_set_benchmark(true);
    }
    let mem = Memory::new(&ctx.dev);
    let mut comm = if ctx.env.world_size > 1 {
        ctx.progress.update("connecting", 0.0, &[]);
        Some(ctx.make_comm()?)
    } else {
        None
    };
    let nccl_version = comm.as_ref().map(|c| c.version());
    // train() calls this once a step: each call is a unit of progress.
    let progress = |phase: &str, frac: f64, metrics: &[(&str, f64)]| {
        ctx.progress.tick(1);
        ctx.progress.update(phase, frac, metrics);
    };
    let mut out = train(
        &cfg,
        ctx.dev.device,
        comm.as_deref_mut()
            .map(|c| c as &mut dyn crate::comm::Collectives),
        &mem,
        &progress,
    )?;
    ctx.sample_memory();
    let mut metrics = vec![("samples_per_s", out.result.samples_per_s)];
    if let (Some(b), Some(e)) = (out.baseline_per_s, out.scaling_efficiency) {
        out.result.baseline_samples_per_s = b;
        out.result.scaling_efficiency = e;
        metrics.push(("baseline_samples_per_s", b));
        metrics.push(("scaling_efficiency", e));
    }
    ctx.progress.update("trained", 1.0, &metrics);
    Ok(Outcome {
        detail: Detail::Train(out.result),
        nccl_version,
        error: None,
    })
}

pub fn run(ctx: &Ctx, params: &TrainParams) -> Result<Outcome> {
    run_mode(ctx, params, Mode::Ddp)
}

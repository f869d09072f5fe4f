//! `ddp`: data-parallel training, gradients all-reduced in buckets
//! (`train.rs` holds the loop; this file reads the job's parameters).
//!
//! Before the data-parallel phase every rank (of a job with 2 ranks or more)
//! times `min(steps, 10)` steps with no communication: the one-GPU baseline of
//! the same job, measured in the same run. `TrainResult` has no field for it,
//! so it goes to the log and to the last progress report (metrics
//! `baseline_samples_per_s`, `scaling_efficiency`).

use anyhow::{bail, Result};
use gpuctl_proto::pb::rank_result::Detail;

use super::memory::Memory;
use super::models::{gpt::GptConfig, ModelConfig, Precision};
use super::train::{train, Mode, TrainConfig};
use super::Outcome;
use crate::context::Ctx;

/// Timed steps of the no-communication baseline at most.
pub const BASELINE_STEPS: u64 = 10;

/// Model name, precision and GPT sequence length of a job, with per-device
/// defaults: what every training workload (ddp, fsdp, maxbatch) reads alike.
pub fn model_params(ctx: &Ctx) -> Result<(String, Precision, i64)> {
    let gpu = ctx.dev.is_cuda();
    let p = &ctx.params;
    let name = p
        .choice_or(
            "model",
            gpuctl_proto::spec::MODELS,
            ModelConfig::default_name(gpu),
        )?
        .to_string();
    let precision = Precision::parse(p.choice_or(
        "precision",
        &["fp32", "fp16", "bf16"],
        if gpu { "bf16" } else { "fp32" },
    )?)?;
    let seq_len = p.u64_or("seq_len", if gpu { 1024 } else { 32 })? as i64;
    if seq_len < 8 {
        bail!("param seq_len={seq_len} is too short; give 8 or more");
    }
    Ok((name, precision, seq_len))
}

/// The training configuration of a job, with per-device defaults.
pub fn config(ctx: &Ctx, mode: Mode) -> Result<TrainConfig> {
    let gpu = ctx.dev.is_cuda();
    let p = &ctx.params;
    let (name, precision, seq_len) = model_params(ctx)?;
    let batch_size = p.u64_or("batch_size", ModelConfig::default_batch(&name, gpu) as u64)? as i64;
    if batch_size < 1 {
        bail!("param batch_size must be 1 or more");
    }
    let steps = p.u64_or("steps", if gpu { 30 } else { 5 })?.max(1);
    let warmup_steps = p.u64_or("warmup_steps", if gpu { 5 } else { 2 })?;
    let channels_last = p.bool_or("channels_last", gpu)?;
    let bucket_bytes = p.bytes_or("bucket_bytes", 25 << 20)?.max(1024);
    let lr = TrainConfig::default_lr(&name);
    Ok(TrainConfig {
        mode,
        model: ModelConfig {
            gpt: if gpu {
                GptConfig::gpu(seq_len)
            } else {
                GptConfig::cpu(seq_len)
            },
            name,
            precision,
            channels_last,
        },
        batch_size,
        steps,
        warmup_steps,
        baseline_steps: steps.min(BASELINE_STEPS),
        bucket_bytes,
        lr,
        momentum: 0.9,
        seed: 1234,
    })
}

/// Runs `ddp` or `fsdp` as this rank of the job.
pub fn run_mode(ctx: &Ctx, mode: Mode) -> Result<Outcome> {
    let cfg = config(ctx, mode)?;
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
    let progress = |phase: &str, frac: f64, metrics: &[(&str, f64)]| {
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

pub fn run(ctx: &Ctx) -> Result<Outcome> {
    run_mode(ctx, Mode::Ddp)
}

//! `maxbatch`: the largest batch per GPU that trains for a model and precision.
//!
//! Batches are tried from `start` (default 8), doubling until one does not fit
//! (or `limit` is reached), then bisected between the last fit and the first
//! failure (to 1% of the batch, at least 1), and `recommended = ⌊max × (1 −
//! margin)⌋`. Each trial is two real training steps (forward, backward, SGD
//! update on fp32 masters; cudnn benchmark on, as in training) of one rank
//! without communication. Out-of-memory comes back from `f_` calls as an
//! error and from tch's module forwards as a panic: both are caught
//! (`catch_unwind`), the trial's tensors are dropped, the caching allocator is
//! emptied, and the search goes on. Every trial is a `MaxBatchPoint` with its
//! peak memory (libtorch's peak allocated bytes on a GPU).
//!
//! A CPU has no out-of-memory of its own to find: the kernel's OOM killer
//! would end the worker, or any other process of the host. There the search
//! runs inside a host-memory budget ([`super::budget`]: the host's available
//! memory and each cgroup limit, shared by the job's CPU ranks on them), which
//! fails an allocation past it as out of memory, and stops at `limit`
//! (default 64) when every batch fits; the note says which ended it and why.

use std::panic::{catch_unwind, AssertUnwindSafe};

use anyhow::{bail, Result};
use gpuctl_core::catalogue::MaxBatchParams;
use gpuctl_proto::pb::{rank_result::Detail, MaxBatchPoint, MaxBatchResult};
use tch::Device;

use super::budget;
use super::memory::Memory;
use super::models::{Model, ModelConfig, Precision};
use super::train::{Mode, ProgressFn, TrainConfig, Trainer};
use super::Outcome;
use crate::context::Ctx;

const GIB: f64 = (1u64 << 30) as f64;

/// What one trial found.
#[derive(Clone, Debug, PartialEq)]
pub struct TrialResult {
    pub fits: bool,
    pub peak_memory_bytes: u64,
    /// Why it did not fit (out-of-memory message, first line).
    pub error: String,
}

/// The search's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct Search {
    pub points: Vec<MaxBatchPoint>,
    /// Largest batch that fit (0: none).
    pub max_batch: u32,
    /// The search stopped at `limit` with every batch fitting.
    pub capped: bool,
}

/// Whether an error message means "out of memory" (rather than a fault).
pub fn is_oom(msg: &str) -> bool {
    let m = msg.to_ascii_lowercase();
    m.contains("out of memory")
        || m.contains("alloc_failed")
        || m.contains("unable to find a valid cudnn algorithm")
        || m.contains("cudnn_status_not_supported")
        || m.contains("not enough memory")
        || m.contains("failed to allocate")
}

/// ⌊max × (1 − margin)⌋, at least 1 when something fit.
pub fn recommended(max_batch: u32, margin: f64) -> u32 {
    if max_batch == 0 {
        return 0;
    }
    ((max_batch as f64 * (1.0 - margin)).floor() as u32).max(1)
}

/// Doubling from `start`, then bisection, with `trial(batch)` deciding.
pub fn search(
    start: u32,
    limit: u32,
    mut trial: impl FnMut(u32) -> Result<TrialResult>,
) -> Result<Search> {
    let limit = limit.max(1);
    let mut points = Vec::new();
    let mut run = |b: u32, points: &mut Vec<MaxBatchPoint>| -> Result<bool> {
        let r = trial(b)?;
        points.push(MaxBatchPoint {
            batch_size: b,
            fits: r.fits,
            peak_memory_bytes: r.peak_memory_bytes,
            error: r.error,
        });
        Ok(r.fits)
    };
    let mut lo = 0u32; // largest fit
    let mut hi = 0u32; // smallest failure (0: none yet)
    let mut capped = false;
    let mut b = start.clamp(1, limit);
    // Doubling up (or halving down when `start` itself does not fit).
    if run(b, &mut points)? {
        lo = b;
        loop {
            if b >= limit {
                capped = true;
                break;
            }
            b = b.saturating_mul(2).min(limit);
            if run(b, &mut points)? {
                lo = b;
            } else {
                hi = b;
                break;
            }
        }
    } else {
        hi = b;
        while b > 1 {
            b /= 2;
            if run(b, &mut points)? {
                lo = b;
                break;
            }
            hi = b;
        }
    }
    // Bisection between the last fit and the first failure.
    if lo > 0 && hi > lo {
        while hi - lo > (lo / 100).max(1) {
            let mid = lo + (hi - lo) / 2;
            if run(mid, &mut points)? {
                lo = mid;
            } else {
                hi = mid;
            }
        }
    }
    Ok(Search {
        points,
        max_batch: lo,
        capped,
    })
}

fn first_line(s: &str) -> String {
    s.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .chars()
        .take(300)
        .collect()
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic".into()
    }
}

/// Runs the search for `cfg` (mode and batch size ignored) on `device`.
pub fn run_search(
    cfg: &TrainConfig,
    device: Device,
    start: u32,
    limit: u32,
    mem: &Memory,
    progress: ProgressFn,
) -> Result<Search> {
    progress("building the model", 0.0, &[]);
    let model = Model::build(&cfg.model, device, cfg.seed)?;
    let mut tr = Trainer::new(cfg, &model, None)?;
    let mut trials = 0u32;
    search(start, limit, |b| {
        trials += 1;
        progress(
            &format!("trial batch {b}"),
            (trials as f64 / 20.0).min(0.95),
            &[],
        );
        mem.empty_cache();
        // A CPU trial's peak is its own (resident peak reset), and its
        // budget what the host has now.
        mem.reset_all_peaks();
        if device == Device::Cpu {
            budget::before_trial();
        }
        let outcome = catch_unwind(AssertUnwindSafe(|| -> Result<f64> {
            let batch = model.batch(b as i64, cfg.seed ^ b as u64)?;
            let mut secs = 0.0;
            for _ in 0..2 {
                secs = tr.step(&batch, None)?.seconds;
            }
            Ok(secs)
        }));
        let peak = mem.peak();
        let err = match outcome {
            Ok(Ok(secs)) => {
                let per_s = (b as i64 * model.units_per_sample()) as f64 / secs.max(1e-12);
                progress(
                    &format!("trial batch {b}"),
                    (trials as f64 / 20.0).min(0.95),
                    &[("samples_per_s", per_s)],
                );
                tracing::info!(batch = b, peak_memory_bytes = peak, per_s, "fits");
                None
            }
            Ok(Err(e)) => Some(format!("{e:#}")),
            Err(p) => Some(panic_text(p)),
        };
        mem.empty_cache();
        match err {
            None => Ok(TrialResult {
                fits: true,
                peak_memory_bytes: peak,
                error: String::new(),
            }),
            Some(e) => {
                let line = first_line(&e);
                if is_oom(&e) {
                    tracing::info!(batch = b, peak_memory_bytes = peak, "does not fit: {line}");
                } else if trials == 1 {
                    bail!("batch {b} failed, and not for lack of memory: {line}");
                } else {
                    tracing::warn!(
                        batch = b,
                        "failed, not for lack of memory (counted as not fitting): {line}"
                    );
                }
                Ok(TrialResult {
                    fits: false,
                    peak_memory_bytes: peak,
                    error: line,
                })
            }
        }
    })
}

pub fn run(ctx: &Ctx, p: &MaxBatchParams) -> Result<Outcome> {
    let gpu = ctx.dev.is_cuda();
    let name = p.model.model.clone();
    let precision = Precision::parse(&p.model.precision)?;
    let margin = p.margin;
    let start = p.start.min(u32::MAX as u64) as u32;
    let limit = p.limit.min(u32::MAX as u64) as u32;
    super::models::use_cudnn_heuristics(ctx.dev.device);
    let cfg = TrainConfig {
        mode: Mode::Ddp,
        model: ModelConfig {
            gpt: super::ddp::gpt_config(&p.model.gpt_size, p.model.seq_len)?,
            name: name.clone(),
            precision,
            channels_last: gpu,
        },
        batch_size: start as i64,
        steps: 2,
        warmup_steps: 0,
        baseline_steps: 0,
        bucket_bytes: 25 << 20,
        lr: TrainConfig::default_lr(&name),
        momentum: 0.9,
        seed: 1234,
        data_ranks: 0,
        keep_params: false,
        variant: p.model.gpt_size.clone(),
        loader: None,
        profile: None,
    };
    let mem = Memory::new(&ctx.dev);
    // The search calls this as each trial starts and ends: units of progress.
    let progress = |phase: &str, frac: f64, metrics: &[(&str, f64)]| {
        ctx.progress.tick(1);
        ctx.progress.update(phase, frac, metrics);
        ctx.sample_memory();
    };
    let env = &ctx.env;
    let budget = budget::install(
        ctx.rdzv.as_ref(),
        env.rank,
        env.world_size,
        !gpu,
        ctx.rendezvous_timeout,
    )?;
    let within = |e: anyhow::Error| match &budget {
        Some(b) if budget::is_budget(&format!("{e:#}")) => e.context(b.why.clone()),
        _ => e,
    };
    // What the GPU held before the search: with it almost empty, a model
    // that does not fit at batch 1 is too large for this GPU model, which
    // is the request's (a smaller size fits); with much held by others, the
    // node's.
    let held_at_start = ctx.dev.gpu_memory();
    let s = run_search(&cfg, ctx.dev.device, start, limit, &mem, &progress).map_err(within)?;
    if s.max_batch == 0 {
        let what = format!(
            "model {name} in {} does not fit even at batch 1",
            precision.name()
        );
        if let Some((used, total)) = held_at_start.filter(|(u, t)| *u < t / 10) {
            return Err(gpuctl_core::request::RequestError(format!(
                "{what} on this GPU's {:.0} GiB ({:.1} GiB in use before the search); choose a smaller model, --gpt-size or --seq-len",
                total as f64 / GIB,
                used as f64 / GIB
            ))
            .into());
        }
        let why = match (&budget, held_at_start) {
            (Some(b), _) => format!(" ({})", b.why),
            (None, Some((used, total))) => format!(
                " ({:.1} of {:.0} GiB were in use before the search)",
                used as f64 / GIB,
                total as f64 / GIB
            ),
            (None, None) => String::new(),
        };
        bail!("{what}{why}");
    }
    let rec = recommended(s.max_batch, margin);
    let note = stop_note(&s, budget.as_ref());
    if !note.is_empty() {
        tracing::info!("{note}");
        ctx.progress.message(&note);
    }
    tracing::info!(
        max_batch = s.max_batch,
        recommended = rec,
        margin,
        trials = s.points.len(),
        "maxbatch done"
    );
    Ok(Outcome {
        detail: Detail::Maxbatch(MaxBatchResult {
            model: name,
            precision: precision.name().into(),
            max_batch: s.max_batch,
            recommended: rec,
            margin,
            capped: s.capped,
            note,
            points: s.points,
        }),
        nccl_version: None,
        error: None,
        more_train: Vec::new(),
    })
}

/// Why the search stopped where it did, when that needs saying: the limit
/// reached with every batch fitting, or, on a CPU, the host-memory budget.
fn stop_note(s: &Search, budget: Option<&budget::Budget>) -> String {
    if s.capped {
        return match budget {
            None => format!(
                "batch {} (the limit) still fit: raise --limit to search further",
                s.max_batch
            ),
            Some(b) => format!(
                "stopped at limit {} on a CPU, inside the host-memory budget ({}): raise --limit to search further",
                s.max_batch, b.why
            ),
        };
    }
    let Some(b) = budget else {
        return String::new();
    };
    let over = s
        .points
        .iter()
        .filter(|p| !p.fits && budget::is_budget(&p.error))
        .map(|p| p.batch_size)
        .min();
    match over {
        Some(first) => format!(
            "stopped by the host-memory budget: batch {first} did not fit, batch {} did ({})",
            s.max_batch, b.why
        ),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(cap: u32, tried: &mut Vec<u32>) -> impl FnMut(u32) -> Result<TrialResult> + '_ {
        move |b| {
            tried.push(b);
            Ok(TrialResult {
                fits: b <= cap,
                peak_memory_bytes: b as u64 * 1000,
                error: if b <= cap {
                    String::new()
                } else {
                    "CUDA out of memory".into()
                },
            })
        }
    }

    #[test]
    fn doubles_then_bisects_to_the_edge() {
        let mut tried = Vec::new();
        let s = search(8, 65536, fake(300, &mut tried)).unwrap();
        assert_eq!(&tried[..7], &[8, 16, 32, 64, 128, 256, 512]);
        // bisection stops within 1% of the largest fit (at least 1)
        assert!(
            s.max_batch <= 300 && s.max_batch + 3 >= 300,
            "{}",
            s.max_batch
        );
        assert!(!s.capped);
        assert_eq!(s.points.len(), tried.len());
        assert!(s.points.iter().all(|p| p.fits == (p.batch_size <= 300)));
        let mut tried = Vec::new();
        let s = search(8, 65536, fake(37, &mut tried)).unwrap();
        assert_eq!(s.max_batch, 37, "exact below 100: {tried:?}");
    }

    #[test]
    fn halves_when_start_does_not_fit_and_caps_at_limit() {
        let mut tried = Vec::new();
        let s = search(64, 1000, fake(5, &mut tried)).unwrap();
        assert_eq!(s.max_batch, 5, "{tried:?}");
        assert_eq!(&tried[..5], &[64, 32, 16, 8, 4]);
        let mut tried = Vec::new();
        let s = search(8, 48, fake(1000, &mut tried)).unwrap();
        assert_eq!((s.max_batch, s.capped), (48, true));
        assert_eq!(tried, vec![8, 16, 32, 48]);
        let mut tried = Vec::new();
        let s = search(8, 100, fake(0, &mut tried)).unwrap();
        assert_eq!(s.max_batch, 0);
        assert_eq!(tried, vec![8, 4, 2, 1]);
    }

    #[test]
    fn margin_and_oom_words() {
        assert_eq!(recommended(300, 0.1), 270);
        assert_eq!(recommended(7, 0.1), 6);
        assert_eq!(recommended(1, 0.5), 1);
        assert_eq!(recommended(0, 0.1), 0);
        assert!(is_oom("CUDA out of memory. Tried to allocate 2.00 GiB"));
        assert!(is_oom(
            "CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"
        ));
        assert!(!is_oom("an illegal memory access was encountered"));
    }
}

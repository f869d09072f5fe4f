//! GEMM stress: multiply the same seeded matrices for the whole run, measure
//! TFLOP/s per interval, and check the product bit for bit.
//!
//! Every rank makes its inputs on the CPU from one seed (1234) and copies them
//! to its device, so every rank of one device class computes the same product:
//! the coordinator compares digests across ranks; here each rank compares its
//! product against its own first one every `check_every` products (on the
//! device, as raw bits: no host copy in the timed loop).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use gpuctl_core::catalogue::{MemoryTarget, StressParams};
use gpuctl_proto::pb::{rank_result::Detail, PhaseKind, StressResult};
use tch::{Device, Kind, Tensor};

use super::Outcome;
use crate::comm::watched::Units;
use crate::context::Ctx;
use crate::digest::digest;

/// The GEMMs' type; a precision this rank cannot run is the request's error
/// (refused at submit and plan time; here for a coordinator that knew less).
fn kind_of(precision: &str, gpu: bool) -> Result<Kind> {
    let request = |why: String| Err(gpuctl_core::request::RequestError(why).into());
    Ok(match (precision, gpu) {
        ("bf16", _) => Kind::BFloat16,
        ("fp16", _) => Kind::Half,
        ("fp32", _) => Kind::Float,
        ("tf32", true) => Kind::Float,
        ("tf32", false) => {
            return request("precision tf32 needs a GPU; use fp32 or bf16 on CPU".into())
        }
        ("fp8", _) => {
            return request(
                "precision fp8 is not supported by this worker yet; use bf16, fp16, tf32 or fp32"
                    .into(),
            )
        }
        (p, _) => return request(format!("unknown precision `{p}`")),
    })
}

/// The integer kind of the same width, to compare floats as raw bits.
fn bits_kind(k: Kind) -> Kind {
    match k.elt_size_in_bytes() {
        2 => Kind::Int16,
        8 => Kind::Int64,
        _ => Kind::Int,
    }
}

/// Allocates GPU memory until the device's memory in use reaches the target.
fn fill_memory(ctx: &Ctx, target: MemoryTarget) -> Result<Vec<Tensor>> {
    let Some((used, total)) = ctx.dev.gpu_memory() else {
        tracing::info!("target_memory applies to GPUs only; ignored on CPU");
        return Ok(Vec::new());
    };
    let want = match target {
        MemoryTarget::Bytes(b) => b.min(total),
        MemoryTarget::Fraction(f) => (f * total as f64) as u64,
    };
    let mut held = Vec::new();
    let mut now = used;
    while now < want {
        let chunk = (want - now).min(1 << 30) as i64;
        if chunk < (1 << 20) {
            break;
        }
        match Tensor::f_ones([chunk], (Kind::Uint8, ctx.dev.device)) {
            Ok(t) => held.push(t),
            Err(e) => {
                tracing::warn!(
                    "target_memory: stopped filling at {} of {} bytes: {}",
                    now,
                    want,
                    e.to_string().lines().next().unwrap_or("")
                );
                break;
            }
        }
        ctx.dev.synchronize();
        now = ctx.dev.gpu_memory().map(|m| m.0).unwrap_or(want);
    }
    tracing::info!(
        "target_memory: GPU memory in use {} of {} (target {})",
        now,
        total,
        want
    );
    Ok(held)
}

/// How long `with_comm` runs its GEMMs alone first: a tenth of the run, 6 s
/// at least (judging needs 5 intervals of 1 s), half of it at most.
fn solo_phase(run: Duration) -> Duration {
    (run / 10).max(Duration::from_secs(6)).min(run / 2)
}

pub fn run(ctx: &Ctx, cfg: &StressParams) -> Result<Outcome> {
    let duration = ctx.duration();
    let gpu = ctx.dev.is_cuda();
    let kind = kind_of(&cfg.precision, gpu)?;
    if gpu {
        crate::device::set_allow_tf32(cfg.precision == "tf32").context("setting TF32 mode")?;
    }
    let n = cfg.size as i64;
    let dev = ctx.dev.device;
    let class = format!(
        "{}|torch {}|{}|n={}",
        ctx.dev.name,
        crate::device::torch_version(),
        cfg.precision,
        n
    );
    tracing::info!(
        size = n,
        precision = %cfg.precision,
        duration_s = duration.as_secs_f64(),
        with_comm = cfg.with_comm,
        "stress: {class}"
    );
    ctx.progress.update("preparing inputs", 0.0, &[]);

    // Inputs from one seed on the CPU, then copied: the same on every rank
    // (ranks that are threads of one process take turns at the generator).
    let (a_cpu, b_cpu) = {
        let _rng = super::models::BUILD_LOCK
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        tch::manual_seed(1234);
        (
            Tensor::f_randn([n, n], (Kind::Float, Device::Cpu))?,
            Tensor::f_randn([n, n], (Kind::Float, Device::Cpu))?,
        )
    };
    let a = a_cpu.f_to_device(dev)?.f_to_kind(kind)?;
    let b = b_cpu.f_to_device(dev)?.f_to_kind(kind)?;
    drop((a_cpu, b_cpu));
    let first = a
        .f_matmul(&b)
        .with_context(|| format!("first {n}x{n} product"))?;
    let first_digest = digest(&first)?;
    let first_bits = first.f_view_dtype(bits_kind(kind))?;
    tracing::info!(digest = %first_digest, "first product");

    let _filler = match cfg.target_memory {
        Some(t) => fill_memory(ctx, t)?,
        None => Vec::new(),
    };
    ctx.sample_memory();

    let mut comm = if cfg.with_comm {
        Some(ctx.make_comm(Units::Own)?)
    } else {
        None
    };
    let nccl_version = comm.as_ref().map(|c| c.version());
    let stop = AtomicBool::new(false);
    let comm_buf = if comm.is_some() {
        // 64 MiB of fp32 on a GPU (4 MiB on a CPU), zeros; the last element is
        // the stop flag.
        let elems: i64 = if gpu { 16 << 20 } else { 1 << 20 };
        let t = Tensor::f_zeros([elems], (Kind::Float, dev))?;
        ctx.dev.synchronize();
        Some(t)
    } else {
        None
    };

    let flops_per_product = 2.0 * (n as f64).powi(3);
    let mut tflops = Vec::new();
    let mut iterations: u64 = 0;
    let mut checks: u64 = 0;
    let mut self_mismatches: u64 = 0;

    // A phase of `run` from `from` (both shares of the whole run, for
    // progress): GEMMs until its time is up, TFLOP/s per interval.
    let gemm_loop = |tflops: &mut Vec<f64>,
                     iterations: &mut u64,
                     checks: &mut u64,
                     mism: &mut u64,
                     (run, from): (Duration, f64),
                     label: &str|
     -> Result<()> {
        ctx.dev.synchronize();
        ctx.progress.enter(PhaseKind::Measured);
        let start = Instant::now();
        let end = start + run;
        let mut interval_start = start;
        let mut in_interval: u64 = 0;
        let mut until_check = cfg.check_every;
        loop {
            let c = a.f_matmul(&b)?;
            *iterations += 1;
            ctx.progress.tick(1);
            in_interval += 1;
            until_check -= 1;
            if until_check == 0 {
                until_check = cfg.check_every;
                *checks += 1;
                let same = c.f_view_dtype(bits_kind(kind))?.f_equal(&first_bits)?;
                if !same {
                    *mism += 1;
                    let d = digest(&c)?;
                    tracing::error!(
                        "product {} differs from the first: digest {d}, first {first_digest}",
                        *iterations
                    );
                }
            }
            let now = Instant::now();
            if now.duration_since(interval_start) >= cfg.interval || now >= end {
                ctx.dev.synchronize();
                let t = Instant::now();
                let secs = t.duration_since(interval_start).as_secs_f64();
                let v = flops_per_product * in_interval as f64 / secs / 1e12;
                tflops.push(v);
                interval_start = t;
                in_interval = 0;
                ctx.sample_memory();
                let frac =
                    from + t.duration_since(start).as_secs_f64() / duration.as_secs_f64().max(1e-9);
                ctx.progress.update(
                    &format!("gemm {} n={n}{label}", cfg.precision),
                    frac.min(1.0),
                    &[("tflops", v)],
                );
                tracing::debug!(tflops = v, iterations = *iterations, "interval");
                if t >= end {
                    break;
                }
            }
        }
        Ok(())
    };

    let mut solo = Vec::new();
    let comm_stats = if let (Some(c), Some(buf)) = (comm.as_mut(), comm_buf.as_ref()) {
        let alone = solo_phase(duration);
        gemm_loop(
            &mut solo,
            &mut iterations,
            &mut checks,
            &mut self_mismatches,
            (alone, 0.0),
            " alone",
        )?;
        // The all_reduce starts on every rank at once.
        c.barrier().context("barrier before the all_reduce")?;
        let rest = (
            duration.saturating_sub(alone),
            alone.as_secs_f64() / duration.as_secs_f64().max(1e-9),
        );
        std::thread::scope(|sc| {
            let stop = &stop;
            let buf = buf.shallow_clone();
            let h = sc.spawn(move || c.all_reduce_loop(&buf, stop));
            let r = gemm_loop(
                &mut tflops,
                &mut iterations,
                &mut checks,
                &mut self_mismatches,
                rest,
                " with all_reduce",
            );
            stop.store(true, Ordering::SeqCst);
            let cs = h
                .join()
                .map_err(|_| anyhow::anyhow!("the all_reduce thread panicked"))?;
            r?;
            cs.map(Some)
        })?
    } else {
        gemm_loop(
            &mut tflops,
            &mut iterations,
            &mut checks,
            &mut self_mismatches,
            (duration, 0.0),
            "",
        )?;
        None
    };
    if let Some(s) = comm_stats {
        let algbw = s.bytes_per_op as f64 * s.ops as f64 / s.seconds.max(1e-9) / 1e9;
        let n = ctx.env.world_size as f64;
        tracing::info!(
            ops = s.ops,
            busbw_gbps = algbw * 2.0 * (n - 1.0) / n,
            "background all_reduce during the GEMMs"
        );
    }
    drop(comm);

    let (min, max) = tflops.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
        (lo.min(*v), hi.max(*v))
    });
    let result = StressResult {
        dtype: cfg.precision.clone(),
        matrix_size: n as u32,
        iterations,
        tflops_median: gpuctl_core::stats::median(tflops.clone()).unwrap_or(0.0),
        tflops_min: if tflops.is_empty() { 0.0 } else { min },
        tflops_max: max,
        tflops_per_interval: tflops,
        digest: first_digest,
        self_mismatches,
        checks,
        device_class: class,
        interval_s: cfg.interval.as_secs_f64(),
        with_comm: cfg.with_comm,
        solo_tflops_median: gpuctl_core::stats::median(solo.clone()).unwrap_or(0.0),
        solo_tflops_per_interval: solo,
    };
    tracing::info!(
        iterations,
        checks,
        self_mismatches,
        median = result.tflops_median,
        "stress done"
    );
    let error = if self_mismatches > 0 {
        Some(format!(
            "silent data corruption: {self_mismatches} of {checks} checks gave a product that differs from the first"
        ))
    } else {
        None
    };
    Ok(Outcome {
        detail: Detail::Stress(result),
        nccl_version,
        error,
        more_train: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precisions_map_to_kinds() {
        assert_eq!(kind_of("bf16", false).unwrap(), Kind::BFloat16);
        assert_eq!(kind_of("tf32", true).unwrap(), Kind::Float);
        assert!(kind_of("tf32", false)
            .unwrap_err()
            .to_string()
            .contains("GPU"));
        assert!(kind_of("fp8", true).is_err());
    }

    #[test]
    fn seeded_cpu_product_is_reproducible() {
        // Other tests of this binary seed libtorch's global generator too.
        let _rng = crate::workloads::models::BUILD_LOCK
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        tch::set_num_threads(1);
        let prod = || {
            tch::manual_seed(1234);
            let a = Tensor::randn([32, 32], (Kind::Float, Device::Cpu));
            let b = Tensor::randn([32, 32], (Kind::Float, Device::Cpu));
            digest(&a.matmul(&b)).unwrap()
        };
        let d = prod();
        assert_eq!(d.len(), 16);
        assert_eq!(d, prod());
    }
}

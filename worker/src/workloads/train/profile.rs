//! `--profile-steps`: a few training steps under libtorch's profiler, after
//! the timed ones, with the top operators and a trace file per rank.

use std::time::Instant;

use anyhow::Result;
use gpuctl_proto::pb::OperatorProfile;

use super::{sync, ProfileRun, Reporter, TrainConfig, Trainer};
use crate::comm::Collectives;
use crate::workloads::models::Batch;

/// Profiles `p.steps` steps with libtorch's profiler. A profiler that fails
/// says so in the result and costs the run nothing else; a step that fails
/// fails the run, as any training step does.
pub(super) fn profile_steps<'c>(
    cfg: &TrainConfig,
    p: &ProfileRun,
    tr: &mut Trainer,
    batch: &Batch,
    rank: usize,
    mut comm: Option<&mut (dyn Collectives + 'c)>,
    progress: &dyn Reporter,
) -> Result<OperatorProfile> {
    let dev = tr.model.device;
    let mut out = OperatorProfile {
        steps: p.steps as u32,
        ..Default::default()
    };
    let name = format!(
        "profile-{}-{}-rank{rank}.json",
        cfg.mode.name(),
        gpuctl_core::catalogue::model_label(
            &cfg.model.name,
            if tr.model.is_gpt() { &cfg.variant } else { "" }
        )
        .replace(' ', "-")
    );
    let path = p.dir.join(name);
    sync(dev);
    // The steps run even without a profiler: the other ranks' collectives
    // wait for this rank's.
    let started = crate::profile::start(dev.is_cuda());
    let t0 = Instant::now();
    for i in 0..p.steps {
        progress.update(&format!("profile step {}/{}", i + 1, p.steps), 1.0, &[]);
        if let Err(e) = tr.step(batch, comm.as_deref_mut()) {
            if started.is_ok() {
                let _ = crate::profile::stop(None);
            }
            return Err(e.context(format!("profiled step {}", i + 1)));
        }
    }
    sync(dev);
    out.step_ms = t0.elapsed().as_secs_f64() * 1e3 / p.steps.max(1) as f64;
    match started.and_then(|()| crate::profile::stop(Some(&path))) {
        Ok(events) => {
            let t = crate::profile::rank(&events);
            out.top_cpu = t.cpu;
            out.top_cuda = t.cuda;
            out.top_memory = t.memory;
            let abs = std::path::absolute(&path).unwrap_or(path.clone());
            out.trace_bytes = std::fs::metadata(&abs).map(|m| m.len()).unwrap_or(0);
            out.trace_path = abs.display().to_string();
        }
        Err(e) => out.error = format!("{e:#}"),
    }
    tracing::info!(
        steps = p.steps,
        trace = %out.trace_path,
        top_cpu = out.top_cpu.first().map(|o| o.name.as_str()).unwrap_or(""),
        error = %out.error,
        "profiled"
    );
    Ok(out)
}

//! Checks of the GPUs one by one: one model per node (`gpus`), persistence
//! and ECC mode on (`persistence_mode`, `ecc_mode`), and no other process
//! holding GPU memory (`gpu_processes`).
//!
//! Together in one file because each reads only the per-GPU state NVML
//! gave (`GpuState`), not how GPUs connect (topology.rs) or the driver
//! (driver.rs).

use std::collections::BTreeMap;

use gpuctl_proto::pb::{PreflightCheck, Verdict};

use super::{check, list};
use crate::preflight::{GpuState, Snapshot};

pub fn gpus(s: &Snapshot) -> PreflightCheck {
    const NAME: &str = "gpus";
    if s.gpus.is_empty() {
        return check(
            &s.node,
            NAME,
            Verdict::Pass,
            format!("no GPU: {} CPU ranks", s.cpu_ranks),
            "",
        );
    }
    let mut by_model: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for g in &s.gpus {
        by_model.entry(g.name.as_str()).or_default().push(g.index);
    }
    if by_model.len() == 1 {
        let (model, idx) = by_model.iter().next().unwrap();
        return check(
            &s.node,
            NAME,
            Verdict::Pass,
            format!("{} × {model}", idx.len()),
            "",
        );
    }
    let detail = by_model
        .iter()
        .map(|(m, idx)| format!("GPU {}: {m}", list(idx)))
        .collect::<Vec<_>>()
        .join("; ");
    check(
        &s.node,
        NAME,
        Verdict::Warn,
        format!("mixed GPU models: {detail}"),
        "results are compared within one model; keep one model per node, or select nodes with --selector gpu=MODEL",
    )
}

pub fn persistence_mode(s: &Snapshot) -> PreflightCheck {
    mode_check(
        s,
        "persistence_mode",
        |g| g.persistence,
        "nvidia-smi -pm 1 (or run nvidia-persistenced): without it the driver re-initialises the GPUs for every job",
    )
}

pub fn ecc_mode(s: &Snapshot) -> PreflightCheck {
    mode_check(
        s,
        "ecc_mode",
        |g| g.ecc,
        "nvidia-smi -e 1, then reboot (or reset the GPUs): without ECC, memory errors go unnoticed",
    )
}

fn mode_check(
    s: &Snapshot,
    name: &str,
    get: fn(&GpuState) -> Option<bool>,
    fix: &str,
) -> PreflightCheck {
    if s.gpus.is_empty() {
        return check(&s.node, name, Verdict::Pass, "no GPU".into(), "");
    }
    let off: Vec<u32> = s
        .gpus
        .iter()
        .filter(|g| get(g) == Some(false))
        .map(|g| g.index)
        .collect();
    let unknown: Vec<u32> = s
        .gpus
        .iter()
        .filter(|g| get(g).is_none())
        .map(|g| g.index)
        .collect();
    if !off.is_empty() {
        return check(
            &s.node,
            name,
            Verdict::Warn,
            format!("off on GPU {}", list(&off)),
            fix,
        );
    }
    let mut detail = if unknown.len() == s.gpus.len() {
        "not reported by NVML (not supported on these GPUs)".to_string()
    } else {
        format!("on for {} GPU(s)", s.gpus.len() - unknown.len())
    };
    if !unknown.is_empty() && unknown.len() < s.gpus.len() {
        detail.push_str(&format!("; unknown on GPU {}", list(&unknown)));
    }
    check(&s.node, name, Verdict::Pass, detail, "")
}

/// The check that lists other processes holding GPU memory.
pub const GPU_PROCESSES: &str = "gpu_processes";

pub fn gpu_processes(s: &Snapshot) -> PreflightCheck {
    const NAME: &str = GPU_PROCESSES;
    if s.gpus.is_empty() {
        return check(&s.node, NAME, Verdict::Pass, "no GPU".into(), "");
    }
    let mut found = Vec::new();
    for g in &s.gpus {
        for p in &g.foreign {
            let mem = p
                .used_bytes
                .map(|b| format!("{} MiB", b / (1024 * 1024)))
                .unwrap_or_else(|| "memory unknown".into());
            let cmd = if p.command.is_empty() {
                String::new()
            } else {
                format!(" ({})", p.command)
            };
            found.push(format!("GPU {}: pid {}{cmd} {mem}", g.index, p.pid));
        }
    }
    if found.is_empty() {
        return check(
            &s.node,
            NAME,
            Verdict::Pass,
            "no other process holds GPU memory".into(),
            "",
        );
    }
    check(
        &s.node,
        NAME,
        Verdict::Warn,
        format!("other processes hold GPU memory: {}", found.join("; ")),
        "stop them (`nvidia-smi` lists them) before a run: they take memory and compute from the workers",
    )
}

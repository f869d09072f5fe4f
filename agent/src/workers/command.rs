//! The worker's command line and environment, exactly as docs/architecture.md
//! ("Worker process") defines them. Pure functions, so the contract is tested
//! without spawning anything.

use gpuctl_proto::pb::{Assignment, RankPlacement};

use super::WorkerSettings;

/// Arguments and environment of one worker, as docs/architecture.md
/// ("Worker process") defines them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerCommand {
    pub args: Vec<String>,
    /// Applied in order over the agent's own environment (later wins).
    pub env: Vec<(String, String)>,
}

pub fn worker_command(
    s: &WorkerSettings,
    coordinator_url: &str,
    a: &Assignment,
    p: &RankPlacement,
) -> Result<WorkerCommand, String> {
    let spec = a.spec.clone().unwrap_or_default();
    let gpu = p.gpu_index;
    let mut args: Vec<String> = vec![
        "--coordinator".into(),
        coordinator_url.into(),
        "--job-id".into(),
        a.job_id.clone(),
        "--attempt".into(),
        a.attempt.to_string(),
        "--workload".into(),
        spec.workload.clone(),
        "--node".into(),
        s.node.clone(),
    ];
    let mut uuid = None;
    if let Some(index) = gpu {
        let u = if !p.gpu_uuid.is_empty() {
            p.gpu_uuid.clone()
        } else {
            s.gpu_uuids.get(&index).cloned().ok_or_else(|| {
                format!("placement names GPU {index}, which NVML does not list on this node")
            })?
        };
        args.extend([
            "--gpu-index".into(),
            index.to_string(),
            "--gpu-uuid".into(),
            u.clone(),
        ]);
        uuid = Some(u);
    }
    if spec.duration_ms > 0 {
        args.extend(["--duration-ms".into(), spec.duration_ms.to_string()]);
    }
    if a.deadline_unix_ms > 0 {
        args.extend(["--deadline-unix-ms".into(), a.deadline_unix_ms.to_string()]);
    }
    let first = gpuctl_core::spec::first_progress_ms(a.world_size, &spec, p.rank);
    if first > 0 {
        args.extend(["--first-report-ms".into(), first.to_string()]);
    }
    let mut params: Vec<_> = spec.params.iter().collect();
    params.sort();
    for (k, v) in params {
        args.extend(["--param".into(), format!("{k}={v}")]);
    }

    let mut env: Vec<(String, String)> = Vec::new();
    if let Some(ld) = &s.ld_library_path {
        env.push(("LD_LIBRARY_PATH".into(), ld.to_string_lossy().into_owned()));
    }
    env.push(("GPUCTL_COORDINATOR".into(), coordinator_url.into()));
    // The worker's credentials: its rank's secret, and the CA to reach a TLS
    // coordinator with (none for the agent's plain loopback relay); not the
    // agent's own certificate (empty = unset).
    if let Some(secret) = a.rank_secrets.get(&p.rank) {
        env.push((gpuctl_core::auth::RANK_SECRET_ENV.into(), secret.clone()));
    }
    let tls = gpuctl_core::client::tls();
    if let Some(ca) = tls.ca.filter(|_| coordinator_url.starts_with("https://")) {
        env.push((
            gpuctl_core::client::TLS_CA_ENV.into(),
            ca.to_string_lossy().into_owned(),
        ));
    }
    env.push((gpuctl_core::client::TLS_CERT_ENV.into(), String::new()));
    env.push((gpuctl_core::client::TLS_KEY_ENV.into(), String::new()));
    // torchrun's names, so that existing scripts can reuse them.
    env.extend([
        ("RANK".into(), p.rank.to_string()),
        ("LOCAL_RANK".into(), p.local_rank.to_string()),
        ("WORLD_SIZE".into(), a.world_size.to_string()),
        ("LOCAL_WORLD_SIZE".into(), a.ranks.len().to_string()),
        ("GROUP_RANK".into(), a.node_rank.to_string()),
        ("MASTER_ADDR".into(), a.master_addr.clone()),
        ("MASTER_PORT".into(), a.master_port.to_string()),
    ]);
    // The planned environment, then the user's overrides (the coordinator
    // normally merged them already; applying them last again is harmless).
    let mut planned: Vec<_> = a.env.iter().collect();
    planned.sort();
    env.extend(planned.into_iter().map(|(k, v)| (k.clone(), v.clone())));
    // The coordinator refuses these at submit; an older one may not have.
    let mut user: Vec<_> = spec
        .env
        .iter()
        .filter(|(k, _)| gpuctl_core::spec::reserved_env(k).is_none())
        .collect();
    user.sort();
    env.extend(user.into_iter().map(|(k, v)| (k.clone(), v.clone())));
    if let Some(u) = uuid {
        // Last, so that nothing can undo it: the worker always uses CUDA
        // ordinal 0, and NVML indices are not CUDA ordinals anyway.
        env.push(("CUDA_VISIBLE_DEVICES".into(), u));
    }
    Ok(WorkerCommand { args, env })
}

//! Bounds on what one gpuctl process accepts from another, in one table:
//! the coordinator checks every registration, rendezvous write and job spec
//! against them at the gRPC edge (the CLI checks specs too, before sending),
//! and each refusal names the field, the limit and what to do.

use crate::catalogue::SpecError;
use prost::Message;

use crate::pb::{Heartbeat, JobSpec, PreflightCheck, RegisterRequest, RunningJob};

/// A node name (a DNS name's length).
pub const MAX_NODE_NAME: usize = 253;
/// GPUs one node may offer.
pub const MAX_GPUS: usize = 64;
/// Labels, interfaces, addresses or InfiniBand devices of one node.
pub const MAX_LIST: usize = 64;
/// Any one free-text field (a CPU model, a label value, a check's detail).
pub const MAX_TEXT: usize = 4096;
/// Preflight checks in one message.
pub const MAX_CHECKS: usize = 256;
/// A rendezvous key and value.
pub const MAX_RDV_KEY: usize = 256;
pub const MAX_RDV_VALUE: usize = 64 * 1024;
/// A job's name, environment overrides and selectors.
pub const MAX_JOB_NAME: usize = 256;
pub const MAX_ENV: usize = 256;
pub const MAX_ENV_KEY: usize = 128;
pub const MAX_SELECTORS: usize = 64;
/// Nodes a job may be limited to (a suite's stage on the nodes still in).
pub const MAX_ONLY_NODES: usize = 65_536;
/// One address, interface name or InfiniBand device of a node.
pub const MAX_ADDRESS: usize = 256;
/// A whole registration or heartbeat, whatever fields it carries (later ones
/// too): the per-field bounds above keep a real one under a megabyte.
pub const MAX_AGENT_MESSAGE: usize = 4 << 20;
/// The largest piece of a trace one `FetchTrace` may ask an agent for
/// (`gpuctl profile --trace`): the coordinator refuses more, the agent reads
/// no more.
pub const MAX_TRACE_PIECE: u32 = 4 << 20;
/// Nodes the coordinator keeps by default (`gpuctl-coordinator --max-nodes`).
pub const DEFAULT_MAX_NODES: usize = 65_536;
/// A timed workload runs at most a week; a job's deadline is at most 30 days.
pub const MAX_DURATION_MS: u64 = 7 * 86_400_000;
pub const MAX_TIMEOUT_MS: u64 = 30 * 86_400_000;

fn err(field: impl Into<String>, message: impl Into<String>) -> SpecError {
    SpecError {
        field: field.into(),
        message: message.into(),
    }
}

fn text(field: &str, value: &str, max: usize) -> Result<(), SpecError> {
    if value.len() > max {
        return Err(err(
            field,
            format!("{} bytes; at most {max} are accepted", value.len()),
        ));
    }
    Ok(())
}

fn list<T>(field: &str, items: &[T], max: usize) -> Result<(), SpecError> {
    if items.len() > max {
        return Err(err(
            field,
            format!("{} entries; at most {max} are accepted", items.len()),
        ));
    }
    Ok(())
}

/// A node name: letters, digits, `.`, `-`, `_`, at most [`MAX_NODE_NAME`].
pub fn node_name(name: &str) -> Result<(), SpecError> {
    text("name", name, MAX_NODE_NAME)?;
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c));
    if !ok {
        return Err(err(
            "name",
            format!(
                "`{name}` is not a node name; use letters, digits, `-`, `.` and `_` (agent --name)"
            ),
        ));
    }
    Ok(())
}

/// What an agent says of itself when it registers.
pub fn register(req: &RegisterRequest) -> Result<(), SpecError> {
    node_name(req.name.trim())?;
    list("gpus", &req.gpus, MAX_GPUS)?;
    for g in &req.gpus {
        for (field, v) in [
            ("gpus.uuid", &g.uuid),
            ("gpus.name", &g.name),
            ("gpus.pci_bus_id", &g.pci_bus_id),
            ("gpus.compute_capability", &g.compute_capability),
        ] {
            text(field, v, MAX_TEXT)?;
        }
    }
    checks(&req.preflight)?;
    running(&req.running)?;
    if let Some(f) = &req.facts {
        // Every offered rank becomes a row of a plan: as bounded as GPUs.
        if f.cpu_ranks as usize > MAX_GPUS {
            return Err(err(
                "facts.cpu_ranks",
                format!(
                    "{} CPU ranks; at most {MAX_GPUS} (start the agent with a smaller --cpu-ranks)",
                    f.cpu_ranks
                ),
            ));
        }
        for (field, v) in [
            ("facts.hostname", &f.hostname),
            ("facts.cpu_model", &f.cpu_model),
            ("facts.driver_version", &f.driver_version),
            ("facts.cuda_driver_version", &f.cuda_driver_version),
            ("facts.nvml_status", &f.nvml_status),
            ("facts.agent_version", &f.agent_version),
            ("facts.libtorch", &f.libtorch),
            ("facts.os", &f.os),
            ("facts.kernel", &f.kernel),
            ("facts.nccl_version", &f.nccl_version),
            ("facts.torch_version", &f.torch_version),
        ] {
            text(field, v, MAX_TEXT)?;
        }
        list("facts.addresses", &f.addresses, MAX_LIST)?;
        for a in &f.addresses {
            text("facts.addresses", a, MAX_ADDRESS)?;
        }
        list("facts.interfaces", &f.interfaces, MAX_LIST)?;
        for i in &f.interfaces {
            text("facts.interfaces.name", &i.name, MAX_ADDRESS)?;
            text("facts.interfaces.ipv4", &i.ipv4, MAX_ADDRESS)?;
        }
        list("facts.ib_devices", &f.ib_devices, MAX_LIST)?;
        for d in &f.ib_devices {
            text("facts.ib_devices", d, MAX_ADDRESS)?;
        }
        if f.labels.len() > MAX_LIST {
            return Err(err(
                "facts.labels",
                format!("{} labels; at most {MAX_LIST}", f.labels.len()),
            ));
        }
        for (k, v) in &f.labels {
            text("facts.labels", k, MAX_JOB_NAME)?;
            text("facts.labels", v, MAX_TEXT)?;
        }
    }
    whole("register", req.encoded_len())
}

/// A heartbeat: what it may carry besides the node's name.
pub fn heartbeat(hb: &Heartbeat) -> Result<(), SpecError> {
    text("heartbeat.node", &hb.node, MAX_NODE_NAME)?;
    checks(&hb.preflight)?;
    running(&hb.running)?;
    whole("heartbeat", hb.encoded_len())
}

fn checks(preflight: &[PreflightCheck]) -> Result<(), SpecError> {
    list("preflight", preflight, MAX_CHECKS)?;
    for c in preflight {
        for (field, v) in [
            ("preflight.name", &c.name),
            ("preflight.detail", &c.detail),
            ("preflight.fix", &c.fix),
        ] {
            text(field, v, MAX_TEXT)?;
        }
    }
    Ok(())
}

fn running(jobs: &[RunningJob]) -> Result<(), SpecError> {
    list("running", jobs, MAX_LIST)?;
    for r in jobs {
        text("running.job_id", &r.job_id, MAX_NODE_NAME)?;
        list("running.ranks", &r.ranks, MAX_GPUS)?;
        list("running.processes", &r.processes, MAX_GPUS)?;
    }
    Ok(())
}

/// The catch-all: a message over [`MAX_AGENT_MESSAGE`] is refused whatever
/// field makes it so, including fields added after this check was written.
fn whole(what: &str, len: usize) -> Result<(), SpecError> {
    if len > MAX_AGENT_MESSAGE {
        return Err(err(
            what,
            format!("{len} bytes in all; at most {MAX_AGENT_MESSAGE} are accepted"),
        ));
    }
    Ok(())
}

/// One rendezvous write.
pub fn rendezvous(key: &str, value: &[u8]) -> Result<(), SpecError> {
    if key.is_empty() {
        return Err(err("key", "the rendezvous key is empty"));
    }
    text("key", key, MAX_RDV_KEY)?;
    if value.len() > MAX_RDV_VALUE {
        return Err(err(
            "value",
            format!(
                "{} bytes; a rendezvous value holds at most {MAX_RDV_VALUE}",
                value.len()
            ),
        ));
    }
    Ok(())
}

/// The parts of a job spec that are not workload parameters.
pub fn spec(s: &JobSpec) -> Result<(), SpecError> {
    text("--name", &s.name, MAX_JOB_NAME)?;
    text("--baseline", &s.baseline, MAX_JOB_NAME)?;
    list("--selector", &s.selectors, MAX_SELECTORS)?;
    for sel in &s.selectors {
        text("--selector", sel, MAX_JOB_NAME)?;
    }
    list("only_nodes", &s.only_nodes, MAX_ONLY_NODES)?;
    for n in &s.only_nodes {
        text("only_nodes", n, MAX_NODE_NAME)?;
    }
    if s.env.len() > MAX_ENV {
        return Err(err(
            "--env",
            format!("{} variables; at most {MAX_ENV}", s.env.len()),
        ));
    }
    for (k, v) in &s.env {
        text("--env", k, MAX_ENV_KEY)?;
        text("--env", v, MAX_TEXT)?;
    }
    for v in s.params.values() {
        text("--param", v, MAX_TEXT)?;
    }
    if s.duration_ms > MAX_DURATION_MS {
        return Err(err(
            "--duration",
            format!(
                "{} h is longer than a timed workload may run ({} h, 7 days)",
                s.duration_ms / 3_600_000,
                MAX_DURATION_MS / 3_600_000
            ),
        ));
    }
    if s.timeout_ms > MAX_TIMEOUT_MS {
        return Err(err(
            "--timeout",
            format!(
                "{} h is longer than a job may last ({} h, 30 days)",
                s.timeout_ms / 3_600_000,
                MAX_TIMEOUT_MS / 3_600_000
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::{GpuInfo, HostFacts};

    #[test]
    fn registrations_are_bounded_field_by_field() {
        let ok = RegisterRequest {
            name: "gpu-node-7.rack-a".into(),
            gpus: vec![GpuInfo::default(); 8],
            ..Default::default()
        };
        assert!(register(&ok).is_ok());
        let mut r = ok.clone();
        r.name = "x".repeat(10 << 20);
        assert_eq!(register(&r).unwrap_err().field, "name");
        r.name = "bad name".into();
        assert!(register(&r)
            .unwrap_err()
            .message
            .contains("not a node name"));
        let mut r = ok.clone();
        r.gpus = vec![GpuInfo::default(); 100_000];
        let e = register(&r).unwrap_err();
        assert_eq!(e.field, "gpus");
        assert!(e.message.contains("at most 64"), "{e}");
        let mut r = ok;
        r.facts = Some(HostFacts {
            cpu_model: "y".repeat(MAX_TEXT + 1),
            ..Default::default()
        });
        assert_eq!(register(&r).unwrap_err().field, "facts.cpu_model");
    }

    #[test]
    fn rendezvous_values_and_spec_bounds() {
        assert!(rendezvous("nccl/id", &[0; 128]).is_ok());
        assert_eq!(
            rendezvous("k", &vec![0; 50 << 20]).unwrap_err().field,
            "value"
        );
        assert_eq!(rendezvous("", b"x").unwrap_err().field, "key");
        let mut s = JobSpec {
            duration_ms: u64::MAX,
            ..Default::default()
        };
        assert_eq!(spec(&s).unwrap_err().field, "--duration");
        s.duration_ms = 0;
        s.timeout_ms = u64::MAX;
        assert_eq!(spec(&s).unwrap_err().field, "--timeout");
        s.timeout_ms = 0;
        s.name = "n".repeat(10 << 20);
        assert_eq!(spec(&s).unwrap_err().field, "--name");
        s.name.clear();
        for i in 0..10_000 {
            s.env.insert(format!("V{i}"), "1".into());
        }
        assert_eq!(spec(&s).unwrap_err().field, "--env");
    }
}

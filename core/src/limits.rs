//! Bounds on what one gpuctl process accepts from another, in one table:
//! the coordinator checks every registration, rendezvous write and job spec
//! against them at the gRPC edge (the CLI checks specs too, before sending),
//! and each refusal names the field, the limit and what to do.

use crate::catalogue::SpecError;
use prost::Message;

use gpuctl_proto::pb::{
    Heartbeat, JobSpec, PreflightCheck, RegisterRequest, RunningJob, SubmitSuiteRequest,
};

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
/// A word an agent reads from its host: a boot id (36 characters), a
/// process's state letter and its name (`sleeping`).
pub const MAX_WORD: usize = 64;
/// A whole registration or heartbeat, whatever fields it carries (later ones
/// too): the per-field bounds above keep a real one under a megabyte.
pub const MAX_AGENT_MESSAGE: usize = 4 << 20;
/// What the coordinator keeps of one node (its name, facts, GPUs and
/// checks, as encoded): each field within its own bound still allowed
/// 3.9 MiB, and 20 such nodes made `gpuctl nodes -o json` fail for
/// everyone. Measured, a real agent's registration: 1,001 bytes (a CPU
/// agent, 12 checks), 1,501 bytes (a 1-GPU H200 host, 12 checks); each
/// further GPU adds ~100 bytes and each NIC ~50, so an 8-GPU host with
/// 8 InfiniBand ports stays near 3 KiB, and the identity acceptance
/// certificates tie to (each GPU's serial, part number, VBIOS and InfoROM
/// versions, NVLink ends counted per remote, PCIe paths by index) adds
/// about 1.5 KiB (estimated, not measured). 64 KiB is over 10 times that.
pub const MAX_NODE_BYTES: usize = 64 << 10;
/// The fleet's budget for what its nodes make the coordinator keep, per
/// node it may hold: `--max-nodes` times this, 512 MiB at the default.
/// Twice a real 8-GPU host's registration, so that a fleet of real nodes
/// never nears it, while nodes at [`MAX_NODE_BYTES`] fill it at an eighth
/// of `--max-nodes`.
pub const NODE_SHARE_BYTES: usize = 8 << 10;
/// A page of a listing (`ListNodes`, `GetFleet`): the coordinator answers
/// at most this much a call, and `gpuctl` asks page after page, so that no
/// fleet size outgrows a message (64 MiB).
pub const MAX_LIST_PAGE: usize = 8 << 20;
/// A `--rules` text (a job's, a suite's).
pub const MAX_RULES_BYTES: usize = 64 * 1024;
/// A suite file's size (`--suite FILE` travels to the coordinator).
pub const MAX_SUITE_BYTES: usize = 64 * 1024;
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
        text("facts.boot_id", &f.boot_id, MAX_WORD)?;
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
        text("preflight.node", &c.node, MAX_NODE_NAME)?;
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
        for p in &r.processes {
            text("running.processes.state", &p.state, MAX_WORD)?;
            text("running.processes.state_name", &p.state_name, MAX_WORD)?;
        }
    }
    Ok(())
}

/// One page of `items` (sorted by name): those named after `after`, as
/// many as fit in `page_bytes` (at most [`MAX_LIST_PAGE`]; at least one,
/// so that every page moves on), and the name to ask after next, empty on
/// the last page. Keyed by name, not by position: a node registered or
/// removed between two pages neither repeats nor hides another. `bytes`
/// is given each item's index beside it (a size kept apart from the
/// items, as a listing encoded ahead keeps its rows' ends).
pub fn page<T>(
    items: &[T],
    name: impl Fn(&T) -> &str,
    bytes: impl Fn(usize, &T) -> usize,
    after: &str,
    page_bytes: u32,
) -> (std::ops::Range<usize>, String) {
    let start = if after.is_empty() {
        0
    } else {
        items.partition_point(|t| name(t) <= after)
    };
    let room = (page_bytes as usize).min(MAX_LIST_PAGE);
    let (mut end, mut used) = (start, 0usize);
    while end < items.len() {
        let b = bytes(end, &items[end]);
        if end > start && used + b > room {
            break;
        }
        used += b;
        end += 1;
    }
    let next = if end < items.len() && end > start {
        name(&items[end - 1]).to_string()
    } else {
        String::new()
    };
    (start..end, next)
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

/// A suite as `gpuctl accept` sends it: refused before the scheduler sees
/// it, since each stage's job and the suite itself keep a copy.
pub fn suite(req: &SubmitSuiteRequest) -> Result<(), SpecError> {
    text("--level", &req.level, MAX_JOB_NAME)?;
    if req.suite_toml.len() > MAX_SUITE_BYTES {
        return Err(err(
            "--suite",
            format!(
                "{} bytes; a suite file holds at most {}",
                req.suite_toml.len(),
                MAX_SUITE_BYTES
            ),
        ));
    }
    rules(&req.rules)?;
    list("--selector", &req.selectors, MAX_SELECTORS)?;
    for sel in &req.selectors {
        text("--selector", sel, MAX_JOB_NAME)?;
    }
    Ok(())
}

/// A `--rules` text, before anything parses it.
pub fn rules(text: &str) -> Result<(), SpecError> {
    if text.len() > MAX_RULES_BYTES {
        return Err(err(
            "--rules",
            format!(
                "{} bytes; a rules file holds at most {MAX_RULES_BYTES}",
                text.len()
            ),
        ));
    }
    Ok(())
}

/// The parts of a job spec that are not workload parameters.
pub fn spec(s: &JobSpec) -> Result<(), SpecError> {
    text("--name", &s.name, MAX_JOB_NAME)?;
    rules(&s.rules)?;
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
    use gpuctl_proto::pb::{GpuInfo, HostFacts};

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

    /// Issue 46: fields a node fills that had no bound of their own.
    #[test]
    fn boot_ids_check_nodes_and_process_states_are_bounded() {
        use gpuctl_proto::pb::RankProcess;
        let long = "z".repeat(1 << 20);
        let ok = RegisterRequest {
            name: "n1".into(),
            ..Default::default()
        };
        let mut r = ok.clone();
        r.facts = Some(HostFacts {
            boot_id: long.clone(),
            ..Default::default()
        });
        assert_eq!(register(&r).unwrap_err().field, "facts.boot_id");
        let mut r = ok.clone();
        r.preflight = vec![PreflightCheck {
            node: long.clone(),
            ..Default::default()
        }];
        assert_eq!(register(&r).unwrap_err().field, "preflight.node");
        let mut hb = Heartbeat {
            running: vec![RunningJob {
                processes: vec![RankProcess {
                    state: long.clone(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(heartbeat(&hb).unwrap_err().field, "running.processes.state");
        hb.running[0].processes[0].state = "S".into();
        hb.running[0].processes[0].state_name = long;
        assert_eq!(
            heartbeat(&hb).unwrap_err().field,
            "running.processes.state_name"
        );
    }

    #[test]
    fn suite_rules_are_bounded_like_a_jobs() {
        let mut req = SubmitSuiteRequest {
            level: "quick".into(),
            rules: "[fleet]\nmin_ranks = 3\n".into(),
            ..Default::default()
        };
        assert!(suite(&req).is_ok());
        req.rules = "#".repeat(MAX_RULES_BYTES + 1);
        let e = suite(&req).unwrap_err();
        assert_eq!(e.field, "--rules");
        assert!(e.message.contains("at most 65536"), "{e}");
        req.rules.clear();
        req.suite_toml = "#".repeat(MAX_SUITE_BYTES + 1);
        assert_eq!(suite(&req).unwrap_err().field, "--suite");
        let s = JobSpec {
            rules: "#".repeat(MAX_RULES_BYTES + 1),
            ..Default::default()
        };
        assert_eq!(spec(&s).unwrap_err().field, "--rules");
    }

    #[test]
    fn pages_follow_names_fill_to_the_size_and_always_move_on() {
        let items: Vec<(String, usize)> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|n| (n.to_string(), 10))
            .collect();
        let cut =
            |after: &str, bytes: u32| page(&items, |t| t.0.as_str(), |_, t| t.1, after, bytes);
        assert_eq!(cut("", 25), (0..2, "b".to_string()));
        assert_eq!(cut("b", 25), (2..4, "d".to_string()));
        assert_eq!(cut("d", 25), (4..5, String::new()));
        // A name removed between pages: the next page starts after it.
        assert_eq!(cut("bb", 25), (2..4, "d".to_string()));
        // One item past the page still goes, alone.
        assert_eq!(cut("", 1), (0..1, "a".to_string()));
        assert_eq!(cut("e", 25), (5..5, String::new()));
        // The page is capped whatever is asked.
        let big: Vec<(String, usize)> = (0..20)
            .map(|i| (format!("n{i:02}"), MAX_LIST_PAGE / 4))
            .collect();
        let (r, next) = page(&big, |t| t.0.as_str(), |_, t| t.1, "", u32::MAX);
        assert_eq!((r, next.as_str()), (0..4, "n03"));
    }
}

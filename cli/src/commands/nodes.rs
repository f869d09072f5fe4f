//! `gpuctl nodes`: the inventory as the coordinator sees it — who is alive, what
//! each node offers (GPUs or CPU ranks), and what it is busy with.

use anyhow::Result;
use gpuctl_proto::pb;
use gpuctl_proto::units::format_bytes;

use crate::args::OutputFormat;
use crate::client::Coordinator;
use crate::exit::Exit;
use crate::output::{self, table::Table};

/// `gpuctl nodes remove NAME`.
pub async fn remove(c: &mut Coordinator, name: &str, out: OutputFormat) -> Result<Exit> {
    let node = c.remove_node(name).await?;
    match out {
        OutputFormat::Json => output::print_json(&serde_json::json!({ "removed": node.name })),
        _ => output::print_text(&format!(
            "node {} removed; an agent still running under that name registers it again\n",
            node.name
        )),
    }
    Ok(Exit::Ok)
}

pub async fn run(c: &mut Coordinator, out: OutputFormat) -> Result<Exit> {
    // JSON carries every fact and check; a table needs far less.
    let mut nodes = c.nodes(!matches!(out, OutputFormat::Json)).await?;
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let now = gpuctl_proto::now_ms();
    match out {
        OutputFormat::Json => output::print_json(&serde_json::Value::Array(
            nodes.iter().map(|n| output::json::node(n, now)).collect(),
        )),
        out if out.is_grid() => output::grid::print(&grid(&nodes, now), out)?,
        _ => {
            if nodes.is_empty() {
                eprintln!(
                    "no nodes registered at {}; start agents with `gpuctl-agent --coordinator {}`",
                    c.url(),
                    c.url()
                );
            } else {
                output::print_text(&render(&nodes, now));
            }
        }
    }
    Ok(Exit::Ok)
}

/// "8 gpu" or "2 cpu": what the node runs ranks on.
fn slots(n: &pb::Node) -> String {
    if n.gpus.is_empty() {
        let ranks = if n.slots > 0 {
            n.slots
        } else {
            n.facts.as_ref().map(|f| f.cpu_ranks).unwrap_or(0)
        };
        format!("{ranks} cpu")
    } else {
        // A brief listing has one entry per model; `slots` counts the GPUs.
        format!("{} gpu", (n.slots as usize).max(n.gpus.len()))
    }
}

/// GPU model(s); mixed models are listed so a heterogeneous node stands out.
fn model(n: &pb::Node) -> String {
    let mut names: Vec<&str> = n.gpus.iter().map(|g| g.name.as_str()).collect();
    names.dedup();
    if names.is_empty() {
        "-".into()
    } else {
        names.join(", ")
    }
}

pub fn render(nodes: &[pb::Node], now: u64) -> String {
    grid(nodes, now).render()
}

/// The nodes' table before layout (also `-o csv|md`).
pub fn grid(nodes: &[pb::Node], now: u64) -> Table {
    let mut t = Table::new(&[
        "NAME",
        "STATE",
        "RANKS",
        "GPU",
        "SHM",
        "HEARTBEAT",
        "JOB",
        "REASON",
    ])
    .right(&[2]);
    for n in nodes {
        let shm = n
            .facts
            .as_ref()
            .map(|f| f.shm_bytes)
            .filter(|b| *b > 0)
            .map(format_bytes)
            .unwrap_or_else(|| "-".into());
        t.row([
            n.name.clone(),
            n.state().label().to_string(),
            slots(n),
            model(n),
            shm,
            output::age(n.last_heartbeat_unix_ms, now),
            output::dash(&n.current_job),
            output::truncate(&output::dash(&n.state_reason), 50),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_gpu_nodes_render() {
        let cpu = pb::Node {
            name: "local-0".into(),
            state: pb::NodeState::Ready as i32,
            slots: 2,
            last_heartbeat_unix_ms: 9_000,
            facts: Some(pb::HostFacts {
                shm_bytes: 64 << 20,
                cpu_ranks: 2,
                ..Default::default()
            }),
            ..Default::default()
        };
        let gpu = pb::Node {
            name: "gpu-1".into(),
            state: pb::NodeState::Busy as i32,
            slots: 2,
            current_job: "job-000007".into(),
            gpus: vec![
                pb::GpuInfo {
                    name: "NVIDIA H200".into(),
                    ..Default::default()
                },
                pb::GpuInfo {
                    name: "NVIDIA H200".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let s = render(&[cpu, gpu], 10_000);
        let lines: Vec<&str> = s.lines().collect();
        assert!(lines[0].starts_with("NAME"));
        assert!(
            lines[1].contains("local-0")
                && lines[1].contains("ready")
                && lines[1].contains("2 cpu")
        );
        assert!(lines[1].contains("64 MiB") && lines[1].contains("1s ago"));
        assert!(
            lines[2].contains("busy")
                && lines[2].contains("2 gpu")
                && lines[2].contains("NVIDIA H200")
        );
        assert!(lines[2].contains("job-000007"));
    }

    #[test]
    fn a_brief_node_counts_its_gpus_by_slots() {
        // ListNodesRequest.brief: one entry per model.
        let n = pb::Node {
            name: "gpu-2".into(),
            slots: 8,
            gpus: vec![pb::GpuInfo {
                name: "NVIDIA H200".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let s = render(&[n], 10_000);
        let row = s.lines().nth(1).unwrap();
        assert!(
            row.contains("8 gpu") && row.contains("NVIDIA H200"),
            "{row}"
        );
    }
}

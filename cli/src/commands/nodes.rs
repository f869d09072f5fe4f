//! `gpuctl nodes`: the inventory as the coordinator sees it — who is alive, what
//! each node offers (GPUs or CPU ranks), and what it is busy with.

use anyhow::Result;
use clap::{Args, Subcommand};
use gpuctl_core::listing::NodeRow;
use gpuctl_core::units::format_bytes;

use crate::client::Coordinator;
use crate::exit::Exit;
use crate::output::{self, table::Table, OutputFormat};

#[derive(Debug, Args)]
pub struct NodesArgs {
    #[command(subcommand)]
    pub action: Option<NodesAction>,
}

#[derive(Debug, Subcommand)]
pub enum NodesAction {
    /// Forget a node that runs no job (a host taken out of the fleet).
    Remove {
        /// The node's name, as `gpuctl nodes` lists it.
        name: String,
    },
}

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
    let now = gpuctl_core::now_ms();
    // JSON carries every fact and check; a table needs far less.
    if matches!(out, OutputFormat::Json) {
        let mut nodes = c.nodes().await?;
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        output::print_json(&serde_json::Value::Array(
            nodes.iter().map(|n| output::json::node(n, now)).collect(),
        ));
        return Ok(Exit::Ok);
    }
    let table = c.node_table().await?;
    let mut rows: Vec<NodeRow> = table.rows().collect();
    rows.sort_by(|a, b| a.name.cmp(b.name));
    if out.is_grid() {
        output::grid::print(&grid(&rows, now), out)?;
    } else if rows.is_empty() {
        eprintln!(
            "no nodes registered at {}; start agents with `gpuctl-agent --coordinator {}`",
            c.url(),
            c.url()
        );
    } else {
        output::print_text(&render(&rows, now));
    }
    Ok(Exit::Ok)
}

/// "8 gpu" or "2 cpu": what the node runs ranks on.
fn slots(n: &NodeRow) -> String {
    let kind = if n.model.is_empty() { "cpu" } else { "gpu" };
    format!("{} {kind}", n.slots)
}

pub fn render(rows: &[NodeRow], now: u64) -> String {
    grid(rows, now).render()
}

/// The nodes' table before layout (also `-o csv|md`).
pub fn grid(rows: &[NodeRow], now: u64) -> Table {
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
    for n in rows {
        let shm = match n.shm_bytes {
            0 => "-".into(),
            b => format_bytes(b),
        };
        t.row([
            n.name.to_string(),
            n.state.label().to_string(),
            slots(n),
            output::dash(n.model),
            shm,
            output::age(n.last_heartbeat_unix_ms, now),
            output::dash(n.job),
            output::truncate(&output::dash(n.reason), 50),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_core::pb;

    #[test]
    fn cpu_and_gpu_nodes_render() {
        let cpu = NodeRow {
            name: "local-0",
            state: pb::NodeState::Ready,
            slots: 2,
            last_heartbeat_unix_ms: 9_000,
            shm_bytes: 64 << 20,
            ..Default::default()
        };
        let gpu = NodeRow {
            name: "gpu-1",
            state: pb::NodeState::Busy,
            slots: 8,
            model: "NVIDIA H200",
            job: "job-000007",
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
                && lines[2].contains("8 gpu")
                && lines[2].contains("NVIDIA H200")
        );
        assert!(lines[2].contains("job-000007"));
    }
}

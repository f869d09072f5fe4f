//! `gpuctl nodes`: the inventory as the coordinator sees it — who is alive, what
//! each node offers (GPUs or CPU ranks), and what it is busy with.

use anyhow::Result;
use clap::{Args, Subcommand};
use gpuctl_core::clock::Clock;
use gpuctl_proto::listing::NodeRow;

use crate::client::Coordinator;
use crate::exit::Exit;
use crate::output::{self, OutputFormat};

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

pub async fn run(c: &mut Coordinator, out: OutputFormat, clock: &Clock) -> Result<Exit> {
    let now = clock.now_ms();
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
        output::grid::print(&output::nodes::grid(&rows, now), out)?;
    } else if rows.is_empty() {
        eprintln!(
            "no nodes registered at {}; start agents with `gpuctl-agent --coordinator {}`",
            c.url(),
            c.url()
        );
    } else {
        output::print_text(&output::nodes::render(&rows, now));
    }
    Ok(Exit::Ok)
}

//! `gpuctl fleet`: one row per node from the history that finished jobs leave
//! behind: the last verdict and when, stress TFLOP/s (slowest and median
//! GPU), all_reduce bandwidth, the median link, training rate, the last p2p
//! run's slowest GPU (median pair, host-to-device, device-to-host), and the
//! figures that drifted below the node's own history. `--node NAME` lists one node's
//! runs, newest first; `fleet links` the latest bandwidth of every pair.

use anyhow::Result;
use clap::{Args, Subcommand};
use gpuctl_core::clock::Clock;
use serde_json::json;

use crate::client::Coordinator;
use crate::exit::Exit;
use crate::output::fleet::{
    by_node, cert_json, link, links_grid, links_table, node_run, row, rows_grid, runs_grid,
};
use crate::output::{self, OutputFormat};

pub const EXAMPLES: &str = "\
Examples:
  gpuctl fleet                             # every node: last verdict, figures, drift
  gpuctl fleet --node gpu-017              # one node's runs, newest first
  gpuctl fleet links --since 7d            # the latest measurement of every pair
  gpuctl fleet -o csv > fleet.csv";

#[derive(Debug, Args)]
pub struct FleetArgs {
    #[command(subcommand)]
    pub view: Option<FleetView>,
    /// Only runs that ended within this long, e.g. 7d.
    #[arg(long, global = true)]
    pub since: Option<String>,
    /// One node's runs, newest first.
    #[arg(long, global = true)]
    pub node: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum FleetView {
    /// The latest bandwidth of every pair of nodes, with its age.
    Links,
}

pub async fn run(
    c: &mut Coordinator,
    a: &FleetArgs,
    since_unix_ms: u64,
    out: OutputFormat,
    clock: &Clock,
) -> Result<Exit> {
    let node = a.node.as_deref().unwrap_or("");
    // The tables show flagged drift alone; JSON every figure's.
    let flagged_drift = !matches!(out, OutputFormat::Json);
    let f = c.fleet(since_unix_ms, node, flagged_drift).await?;
    if !node.is_empty() && f.runs.is_empty() {
        anyhow::bail!(
            "no runs of node `{node}` in the fleet history (`gpuctl fleet` lists the nodes)"
        );
    }
    // Each node's certificate (issue 50) beside its acceptance state.
    let certs = c.certs().await?;
    let cert_of = by_node(&certs);
    let now = clock.now_ms();
    match (out, &a.view) {
        (OutputFormat::Json, Some(FleetView::Links)) => output::print_json(
            &json!({ "links": f.links.iter().map(|l| link(l, now)).collect::<Vec<_>>() }),
        ),
        (OutputFormat::Json, None) => output::print_json(&json!({
            "nodes": f.rows.iter().map(|r| {
                let mut v = row(r);
                v["certificate"] = cert_json(cert_of.get(r.node.as_str()).copied(), now);
                v
            }).collect::<Vec<_>>(),
            "runs": f.runs.iter().map(node_run).collect::<Vec<_>>(),
        })),
        // CSV and Markdown: the same tables; `fleet links` without its matrix.
        (out, view) if out.is_grid() => {
            let t = match view {
                Some(FleetView::Links) => links_grid(&f.links, now),
                None if !node.is_empty() => runs_grid(&f.runs, now),
                None => rows_grid(&f.rows, &certs, now),
            };
            output::grid::print(&t, out)?
        }
        (_, Some(FleetView::Links)) => output::print_text(&links_table(&f.links, now)),
        (_, None) if !node.is_empty() => output::print_text(&runs_grid(&f.runs, now).render()),
        (_, None) => output::print_text(&rows_grid(&f.rows, &certs, now).render()),
    }
    Ok(Exit::Ok)
}

//! A job's report for people and machines: `print` picks the format (table,
//! JSON, CSV, Markdown, JUnit, HTML); `render` is the table report, verdict
//! and findings first, then nodes, ranks, each workload's figures, the
//! collectives laid out like nccl-tests, GPU health, the environment plan
//! and the preflight checks. `gpuctl report`, `submit --wait` and `accept`
//! print it; the HTML, CSV and JUnit forms reuse its tables.

pub mod collectives;
pub mod gpu;
pub mod grid;
pub mod header;
pub mod ranks;
#[cfg(test)]
mod tests;

use anyhow::Result;
use gpuctl_core::units::format_duration_ms;
use gpuctl_proto::pb;

use self::collectives::collectives_table;
use self::gpu::{health_table, telemetry_table};
use super::{findings, plan, OutputFormat};
use crate::output;

/// Prints a report in any format; `html` without the telemetry timeline,
/// which only `gpuctl report` fetches.
pub fn print(report: &pb::Report, out: OutputFormat) -> Result<()> {
    match out {
        OutputFormat::Json => output::print_json(&output::json::report(report)),
        OutputFormat::Table => output::print_text(&render(report)),
        OutputFormat::Csv => output::print_text(&grid::csv(report)?),
        OutputFormat::Md => output::print_text(&grid::markdown(report)),
        OutputFormat::Junit => output::print_text(&output::junit::report(report)?),
        // Only `report` takes html (commands::check_format) and its `run`
        // passes the telemetry timeline; with no connection here, none.
        OutputFormat::Html => {
            output::print_text(&output::html::page(report, &pb::Timeline::default())?)
        }
    }
    Ok(())
}

/// The table report, as `gpuctl report` prints it.
pub fn render(r: &pb::Report) -> String {
    // The verdict first and last, the findings right under it: the lines a
    // person reads before anything else.
    let mut s = findings::verdict_line(r);
    if !r.findings.is_empty() {
        s.push_str(&format!("\nFINDINGS ({})\n", findings::counts(&r.findings)));
        s.push_str(&findings::findings_table(&r.findings));
    }
    s.push('\n');
    s.push_str(&header::header(r));
    for n in &r.notes {
        s.push_str(&format!("note: {n}\n"));
    }
    if !r.nodes.is_empty() {
        s.push_str("\nNODES\n");
        s.push_str(&ranks::nodes_table(r));
        s.push_str("\nRANKS\n");
        s.push_str(&ranks::ranks_table(r));
        if output::hang::hung(r) {
            s.push_str(&format!(
                "\nLAST PROGRESS (the job hung: no progress for the hang timeout of {}; ! = blamed)\n",
                format_duration_ms(r.hang_timeout_ms)
            ));
            s.push_str(&output::hang::last_progress_table(r));
        }
    }
    if let Some(models) = output::models::section(r) {
        s.push_str(&models);
    }
    if let Some(loader) = output::loader::section(r) {
        s.push_str(&loader);
    }
    if let Some(profile) = output::profile::section(r) {
        s.push_str(&profile);
    }
    if let Some(curve) = output::maxbatch::curve(r) {
        s.push_str("\nMAXBATCH (each trial: batch -> peak memory; OOM = out of memory)\n");
        s.push_str(&curve);
    }
    // p2p: per node the GPU pairs' matrix, then the host<->device copies.
    if let Some(p2p) = output::p2p::section(r) {
        s.push_str(&p2p);
    }
    if !r.links.is_empty() {
        s.push_str("\nLINKS (every pair of nodes; the slowest rank of each pair)\n");
        s.push_str(&output::links::matrix(&r.links));
    }
    let search = r
        .spec
        .as_ref()
        .and_then(|sp| sp.params.get("pattern"))
        .is_some_and(|p| p == "search");
    if !r.bisect.is_empty() && search {
        s.push_str("\nSEARCH (groups measured at the same time; a slow one is split, a suspect confirmed with two cleared nodes)\n");
        s.push_str(&output::links::bisect(&r.bisect));
    } else if !r.bisect.is_empty() {
        s.push_str("\nBISECT (halves measured at the same time; the slower one is split again)\n");
        s.push_str(&output::links::bisect(&r.bisect));
    }
    if !r.collectives.is_empty() {
        s.push_str("\nCOLLECTIVES (across ranks: slowest rank's time, #wrong summed)\n");
        s.push_str(&collectives_table(&r.collectives));
    }
    if !r.health.is_empty() {
        s.push_str("\nGPU HEALTH\n");
        s.push_str(&health_table(&r.health));
    }
    if !r.telemetry.is_empty() {
        s.push_str("\nGPU TELEMETRY (over the run)\n");
        s.push_str(&telemetry_table(&r.telemetry));
    }
    if !r.env.is_empty() {
        if r.collectives.is_empty() {
            s.push('\n');
        }
        s.push_str("ENVIRONMENT\n");
        s.push_str(&plan::env_table(&r.env));
    }
    if !r.preflight.is_empty() {
        s.push_str("\nPREFLIGHT (at job start)\n");
        s.push_str(&plan::checks_table(&r.preflight));
    }
    s.push('\n');
    s.push_str(&findings::verdict_line(r));
    s
}

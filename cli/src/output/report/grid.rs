//! A report as CSV or Markdown: the table report's sections (summary,
//! findings, nodes, ranks, models, p2p's GPU pairs per node and host<->device
//! copies, collectives) as separate tables, so each pastes
//! into a spreadsheet or a ticket as it is. Markdown opens with the verdict.

use anyhow::Result;
use gpuctl_proto::pb;

use super::header::header_pairs;
use super::ranks::{nodes_grid, ranks_grid};
use crate::output::grid::{self, Section};
use crate::output::{findings, table::Table};

/// One row per collective size, nccl-tests' columns with their units in the headers.
fn collectives_grid(rows: &[pb::CollectiveRow]) -> Table {
    let mut t = Table::new(&[
        "OP",
        "SIZE B",
        "COUNT",
        "TYPE",
        "REDOP",
        "ROOT",
        "TIME US",
        "ALGBW GB/S",
        "BUSBW GB/S",
        "WRONG",
        "IN-PLACE TIME US",
        "IN-PLACE ALGBW GB/S",
        "IN-PLACE BUSBW GB/S",
        "IN-PLACE WRONG",
    ]);
    for r in rows {
        t.row([
            r.op.clone(),
            r.bytes.to_string(),
            r.count.to_string(),
            r.dtype.clone(),
            r.redop.clone(),
            r.root.to_string(),
            format!("{:.2}", r.time_us),
            format!("{:.2}", r.algbw_gbps),
            format!("{:.2}", r.busbw_gbps),
            r.wrong.to_string(),
            format!("{:.2}", r.time_us_ip),
            format!("{:.2}", r.algbw_gbps_ip),
            format!("{:.2}", r.busbw_gbps_ip),
            r.wrong_ip.to_string(),
        ]);
    }
    t
}

/// The sections in the table report's order; empty ones are left out.
pub fn sections(r: &pb::Report) -> Vec<Section> {
    let mut summary = Table::new(&["KEY", "VALUE"]);
    for (k, v) in header_pairs(r) {
        summary.row([k.to_string(), v]);
    }
    let mut out = vec![Section::new("summary", summary)];
    if !r.findings.is_empty() {
        out.push(Section::new(
            "findings",
            findings::findings_grid(&r.findings),
        ));
    }
    if !r.nodes.is_empty() {
        out.push(Section::new("nodes", nodes_grid(r)));
        out.push(Section::new("ranks", ranks_grid(r)));
    }
    if let Some(models) = crate::output::models::grid(r) {
        out.push(Section::new("models", models));
    }
    if let Some(loader) = crate::output::loader::grid(r) {
        out.push(Section::new("loader", loader));
    }
    if let Some(profile) = crate::output::profile::grid(r) {
        out.push(Section::new("profile", profile));
    }
    out.extend(crate::output::p2p::grid_sections(r));
    if !r.collectives.is_empty() {
        out.push(Section::new(
            "collectives",
            collectives_grid(&r.collectives),
        ));
    }
    out
}

pub fn csv(r: &pb::Report) -> Result<String> {
    grid::csv_sections(&sections(r))
}

/// `**VERDICT FAIL**: reason`, the job's notes, then the sections.
pub fn markdown(r: &pb::Report) -> String {
    let mut s = format!("**VERDICT {}**", r.verdict().label().to_uppercase());
    if !r.reason.is_empty() {
        s.push_str(&format!(": {}", r.reason));
    }
    s.push('\n');
    for n in &r.notes {
        s.push_str(&format!("\n> note: {n}\n"));
    }
    s.push_str(&grid::markdown_sections(&sections(r)));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stress_report_has_its_sections() {
        let r = crate::output::fixtures::stress_report();
        let csv = csv(&r).unwrap();
        for title in ["# summary\n", "# nodes\n", "# ranks\n"] {
            assert!(csv.contains(title), "{csv}");
        }
        let md = markdown(&r);
        assert!(md.starts_with("**VERDICT FAIL**"), "{md}");
        assert!(md.contains("### ranks\n\n| RANK | NODE |"), "{md}");
        assert!(!csv.contains("# gpu pairs"), "{csv}");
    }

    #[test]
    fn p2p_report_has_a_matrix_per_node_and_the_host_copies() {
        let r = crate::output::fixtures::p2p_report();
        let csv = csv(&r).unwrap();
        let pairs = csv.find("# gpu pairs node-a\n").expect(&csv);
        let host = csv.find("# host device\n").expect(&csv);
        assert!(pairs < host, "{csv}");
        assert!(
            csv.contains("FROM \\ TO,GPU 0,GPU 1,GPU 2,GPU 3,MEDIAN\n"),
            "{csv}"
        );
        assert!(
            csv.contains("GPU 1,360.0,,360.0,150.0/148.5*,360.0\n"),
            "{csv}"
        );
        let md = markdown(&r);
        assert!(md.contains("### gpu pairs node-a\n"), "{md}");
        assert!(
            md.contains("| node-a | GPU 2 | pinned | 53.1 (52.9/53.1) |"),
            "{md}"
        );
    }
}

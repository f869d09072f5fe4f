//! `gpuctl cert show FILE -o html [--evidence DIR]`: a certificate as one
//! self-contained page, verdict first, then the node's identity, the suite,
//! every figure against its reference, the findings, and with the evidence
//! the plots of each stage's report (as `gpuctl report -o html` draws
//! them). An evidence file whose hash is not the certificate's is named and
//! not plotted. Every string is escaped.

use std::path::Path;

use anyhow::Result;
use gpuctl_cert::envelope::sha256_hex;
use gpuctl_cert::Certificate;
use gpuctl_proto::pb;
use html_escape::encode_text as text;
use prost::Message;

use super::{figure, figures, folded, page_end, page_start, table};
use crate::output::table::Table;

/// The page for `c`; `evidence` is the folder `cert export --evidence` wrote.
pub fn page(c: &Certificate, evidence: Option<&Path>) -> Result<String> {
    let mut s = page_start(&format!(
        "{} {}: {}",
        c.id,
        c.node,
        c.verdict.to_uppercase()
    ));
    let verdict = match c.verdict.as_str() {
        v @ ("pass" | "warn" | "fail") => v,
        _ => "incomplete",
    };
    s.push_str(&format!(
        "<header class=\"banner v-{verdict}\" id=\"verdict\">\n<h1>CERTIFICATE {} ({})</h1>\n<p>node {} · {}</p>\n<p class=\"sub\">{} · issued {} · expires {} (unix ms) · by {} · key {}</p>\n</header>\n",
        text(&c.verdict.to_uppercase()),
        text(&c.status),
        text(&c.node),
        text(if c.remediation.is_empty() { "accepted" } else { &c.remediation }),
        text(&c.id),
        c.issued_unix_ms,
        c.expires_unix_ms,
        text(&c.issuer.coordinator),
        text(&c.issuer.key_id),
    ));
    s.push_str("<h2 id=\"identity\">Identity</h2>\n");
    s.push_str(&table(&identity(c)));
    if !c.identity.gpus.is_empty() {
        s.push_str(&table(&gpus(c)));
    }
    s.push_str(&format!(
        "<h2 id=\"suite\">Suite {} `{}`: {}</h2>\n",
        text(&c.suite.id),
        text(&c.suite.name),
        text(&c.suite.state)
    ));
    s.push_str(&table(&stages(c)));
    s.push_str(&format!(
        "<p class=\"note\">Rules sha256 {}.</p>\n",
        text(&c.rules.sha256)
    ));
    s.push_str(&folded(
        "Rules in force",
        &format!("<pre>{}</pre>\n", text(&c.rules.effective)),
    ));
    s.push_str(&format!(
        "<h2 id=\"figures\">Figures ({})</h2>\n",
        c.figures.len()
    ));
    s.push_str(&table(&figures_table(c)));
    if !c.findings.is_empty() {
        s.push_str("<h2 id=\"findings\">Findings</h2>\n<ol class=\"findings\">\n");
        for f in &c.findings {
            s.push_str(&format!(
                "<li>{} · {}: {}</li>\n",
                text(&f.level),
                text(&f.stage),
                text(&f.detail)
            ));
        }
        s.push_str("</ol>\n");
    }
    s.push_str("<h2 id=\"plots\">Evidence</h2>\n");
    s.push_str(&plots(c, evidence)?);
    s.push_str(&page_end(
        " Its figures are the certificate's; verify the certificate itself with `gpuctl cert verify`.",
    ));
    Ok(s)
}

fn identity(c: &Certificate) -> Table {
    let id = &c.identity;
    let mut t = Table::new(&["FIELD", "VALUE"]);
    let rows = [
        ("hostname", id.hostname.clone()),
        ("product serial", id.product_serial.clone()),
        ("board serial", id.board_serial.clone()),
        ("os", id.os.clone()),
        ("kernel", id.kernel.clone()),
        ("cpu", format!("{} × {}", id.cpu_count, id.cpu_model)),
        ("cpu ranks", id.cpu_ranks.to_string()),
        ("memory bytes", id.memory_total_bytes.to_string()),
        ("driver", id.driver_version.clone()),
        ("CUDA", id.cuda_driver_version.clone()),
        ("NCCL", id.nccl_version.clone()),
        ("torch", id.torch_version.clone()),
        ("agent", id.agent_version.clone()),
        ("InfiniBand", id.ib_devices.join(", ")),
    ];
    for (k, v) in rows {
        t.row([k.to_string(), crate::output::dash(&v)]);
    }
    t
}

fn gpus(c: &Certificate) -> Table {
    let mut t = Table::new(&[
        "GPU",
        "UUID",
        "NAME",
        "SERIAL",
        "PART",
        "VBIOS",
        "INFOROM",
        "PCI",
        "PCIE",
        "NVLINKS",
        "NVLINKS TO",
        "PCIE PATHS",
    ]);
    for g in &c.identity.gpus {
        t.row([
            g.index.to_string(),
            g.uuid.clone(),
            g.name.clone(),
            crate::output::dash(&g.serial),
            crate::output::dash(&g.board_part_number),
            crate::output::dash(&g.vbios_version),
            crate::output::dash(&g.inforom_image_version),
            g.pci_bus_id.clone(),
            format!("gen{} x{}", g.pcie_gen_max, g.pcie_width_max),
            g.nvlinks_active.to_string(),
            g.nvlink_remotes.join(", "),
            g.pcie_paths.join(", "),
        ]);
    }
    t
}

fn stages(c: &Certificate) -> Table {
    let mut t = Table::new(&["STAGE", "WORKLOAD", "JOB", "STATE", "MS", "NODE IN", "NOTE"]);
    for st in &c.suite.stages {
        t.row([
            st.name.clone(),
            st.workload.clone(),
            crate::output::dash(&st.job_id),
            st.state.clone(),
            st.duration_ms.to_string(),
            if st.took_part { "yes" } else { "no" }.to_string(),
            st.note.clone(),
        ]);
    }
    t
}

fn figures_table(c: &Certificate) -> Table {
    let mut t = Table::new(&[
        "VERDICT",
        "STAGE",
        "RANK",
        "METRIC",
        "KEY",
        "VALUE",
        "UNIT",
        "AGAINST",
        "REFERENCE",
        "MARGIN %",
        "FAIL <",
        "WARN <",
    ]);
    for f in &c.figures {
        t.row([
            f.verdict.clone(),
            f.stage.clone(),
            f.rank.map_or("job".into(), |r| r.to_string()),
            f.metric.clone(),
            f.key.clone(),
            format!("{:.4}", f.value),
            f.unit.clone(),
            f.reference_kind.clone(),
            format!("{:.4}", f.reference),
            format!("{:+.1}", f.margin * 100.0),
            format!("{:.2}", f.fail_below),
            format!("{:.2}", f.warn_below),
        ]);
    }
    t
}

/// Each evidence report's plots, or why not.
fn plots(c: &Certificate, dir: Option<&Path>) -> Result<String> {
    let Some(dir) = dir else {
        return Ok("<p class=\"note\">No evidence given: `gpuctl cert export NODE --evidence DIR`, then `cert show FILE -o html --evidence DIR` draws each stage's plots.</p>\n".into());
    };
    let mut s = String::new();
    for e in &c.evidence {
        let stage = c
            .suite
            .stages
            .iter()
            .find(|st| st.job_id == e.job_id)
            .map_or("", |st| st.name.as_str());
        s.push_str(&format!("<h3>{} · {}</h3>\n", text(stage), text(&e.job_id)));
        let plain = !e.file.contains('/') && !e.file.starts_with('.');
        let bytes = if plain {
            std::fs::read(dir.join(&e.file)).ok()
        } else {
            None
        };
        let report = match bytes {
            None => Err(format!("{} is missing", e.file)),
            Some(b) if sha256_hex(&b) != e.sha256 => Err(format!(
                "{}'s sha256 is not the certificate's: not plotted",
                e.file
            )),
            Some(b) => pb::Report::decode(b.as_slice())
                .map_err(|err| format!("{} is not a report: {err}", e.file)),
        };
        match report {
            Err(why) => s.push_str(&format!("<p class=\"note\">{}</p>\n", text(&why))),
            Ok(r) => {
                let figs = figures(&r, &pb::Timeline::default())?;
                if figs.is_empty() {
                    s.push_str("<p class=\"note\">No plot applies to this stage.</p>\n");
                }
                for f in &figs {
                    s.push_str(&figure(f));
                }
            }
        }
    }
    Ok(s)
}

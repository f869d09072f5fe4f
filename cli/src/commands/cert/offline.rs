//! What `gpuctl cert` does with no coordinator: verify and show a
//! certificate file, and lay a node's live identity beside its certificate.
//! All of it is `gpuctl-cert`'s; here, reading files and printing.

use std::path::Path;

use anyhow::{Context, Result};
use gpuctl_cert::envelope::{self, open};
use gpuctl_cert::verify::{verify as check_all, Inputs, Revocation};
use gpuctl_cert::{identity, Certificate, Identity};
use gpuctl_proto::pb;
use serde_json::json;

use super::{ShowArgs, VerifyArgs};
use crate::exit::Exit;
use crate::output::{self, OutputFormat};

/// Largest revocation list read.
const MAX_LIST_BYTES: u64 = 16 << 20;

fn read_cert(path: &Path) -> Result<(Vec<u8>, envelope::Opened)> {
    let meta = std::fs::metadata(path).with_context(|| path.display().to_string())?;
    if meta.len() > envelope::MAX_ENVELOPE_BYTES as u64 {
        anyhow::bail!(
            "{}: {} bytes; a certificate is at most {}",
            path.display(),
            meta.len(),
            envelope::MAX_ENVELOPE_BYTES
        );
    }
    let bytes = std::fs::read(path).with_context(|| path.display().to_string())?;
    let opened = open(&bytes).with_context(|| path.display().to_string())?;
    Ok((bytes, opened))
}

pub fn verify(a: &VerifyArgs, key_pem: &str, out: OutputFormat, now: u64) -> Result<Exit> {
    let key = envelope::read_public_pem(key_pem).context("--key")?;
    let (_, opened) = read_cert(&a.file)?;
    let revoked: Option<Vec<Revocation>> = match &a.revoked {
        Some(p) => {
            let len = std::fs::metadata(p)
                .with_context(|| format!("--revoked {}", p.display()))?
                .len();
            if len > MAX_LIST_BYTES {
                anyhow::bail!(
                    "--revoked {}: {len} bytes; at most {MAX_LIST_BYTES}",
                    p.display()
                );
            }
            let text = std::fs::read(p).with_context(|| format!("--revoked {}", p.display()))?;
            Some(serde_json::from_slice(&text).with_context(|| {
                format!(
                    "--revoked {}: not the list `gpuctl cert revoked -o json` writes",
                    p.display()
                )
            })?)
        }
        None => None,
    };
    let checks = check_all(
        &opened,
        &Inputs {
            key: &key,
            now_unix_ms: now,
            revoked: revoked.as_deref(),
            evidence: a.evidence.as_deref(),
        },
    );
    let ok = checks.iter().all(|c| c.ok);
    match out {
        OutputFormat::Json => output::print_json(&json!({
            "id": opened.cert.id,
            "node": opened.cert.node,
            "valid": ok,
            "checks": checks,
        })),
        _ => {
            let mut s = String::new();
            for c in &checks {
                s.push_str(&format!(
                    "{:4}  {:18}  {}\n",
                    if c.ok { "ok" } else { "FAIL" },
                    c.name,
                    c.detail
                ));
            }
            s.push_str(&format!(
                "{} {}: {}\n",
                opened.cert.id,
                opened.cert.node,
                if ok { "VALID" } else { "NOT VALID" }
            ));
            output::print_text(&s)
        }
    }
    Ok(Exit::failed_if(!ok))
}

pub fn show(a: &ShowArgs, out: OutputFormat, now: u64) -> Result<Exit> {
    let (_, opened) = read_cert(&a.file)?;
    let c = &opened.cert;
    match out {
        OutputFormat::Json => output::print_json(&c.to_json()),
        OutputFormat::Html => {
            output::print_text(&output::html::cert::page(c, a.evidence.as_deref())?)
        }
        _ => output::print_text(&render(c, now)),
    }
    Ok(Exit::Ok)
}

fn render(c: &Certificate, now: u64) -> String {
    let mut s = format!(
        "{}  node {}  {} ({})\nissued {} by {} (key {}), {}\n",
        c.id,
        c.node,
        c.verdict.to_uppercase(),
        c.status,
        output::age(c.issued_unix_ms, now),
        c.issuer.coordinator,
        &c.issuer.key_id[..c.issuer.key_id.len().min(16)],
        expiry(c.expires_unix_ms, now),
    );
    if !c.remediation.is_empty() {
        s.push_str(&format!("remediation: {}\n", c.remediation));
    }
    let id = &c.identity;
    s.push_str(&format!(
        "\nhost {}  product serial {}  board serial {}\n{} · kernel {} · {} × {}\ndriver {} · CUDA {} · NCCL {} · torch {}\n",
        id.hostname, or_dash(&id.product_serial), or_dash(&id.board_serial), id.os, id.kernel,
        id.cpu_count, id.cpu_model, or_dash(&id.driver_version), or_dash(&id.cuda_driver_version),
        or_dash(&id.nccl_version), or_dash(&id.torch_version),
    ));
    if id.gpus.is_empty() {
        s.push_str(&format!("no GPUs: {} CPU ranks\n", id.cpu_ranks));
    }
    for g in &id.gpus {
        s.push_str(&format!(
            "GPU {} {} {} serial {} part {} VBIOS {} InfoROM {} PCIe {} gen{} x{} NVLinks {}\n",
            g.index,
            g.uuid,
            g.name,
            or_dash(&g.serial),
            or_dash(&g.board_part_number),
            or_dash(&g.vbios_version),
            or_dash(&g.inforom_image_version),
            g.pci_bus_id,
            g.pcie_gen_max,
            g.pcie_width_max,
            g.nvlinks_active
        ));
        if !g.nvlink_remotes.is_empty() {
            s.push_str(&format!("  NVLinks to {}\n", g.nvlink_remotes.join(", ")));
        }
        if !g.pcie_paths.is_empty() {
            s.push_str(&format!("  PCIe paths: {}\n", g.pcie_paths.join(", ")));
        }
    }
    if !id.ib_devices.is_empty() {
        s.push_str(&format!("InfiniBand: {}\n", id.ib_devices.join(", ")));
    }
    s.push_str(&format!(
        "\nsuite {} `{}` {}; rules sha256 {}\n",
        c.suite.id,
        c.suite.name,
        c.suite.state,
        &c.rules.sha256[..c.rules.sha256.len().min(16)]
    ));
    for st in &c.suite.stages {
        s.push_str(&format!(
            "  {:12} {:10} {:14} {:10} {}{}\n",
            st.name,
            st.workload,
            or_dash(&st.job_id),
            st.state,
            if st.took_part { "" } else { "(not in) " },
            st.note
        ));
    }
    s.push_str(&format!("\n{} figures:\n", c.figures.len()));
    for f in &c.figures {
        let who = f.rank.map_or("job".to_string(), |r| format!("rank {r}"));
        s.push_str(&format!(
            "  {:8} {:10} {:16} {:24} {:>12.4} {:5} vs {} {:.4} ({:+.1} %)\n",
            f.verdict,
            f.stage,
            who,
            format!("{} {}", f.metric, f.key),
            f.value,
            f.unit,
            f.reference_kind,
            f.reference,
            f.margin * 100.0
        ));
    }
    for f in &c.findings {
        s.push_str(&format!("  {} {}: {}\n", f.level, f.stage, f.detail));
    }
    s.push_str(&format!("\nevidence: {} job reports\n", c.evidence.len()));
    s
}

fn expiry(at: u64, now: u64) -> String {
    const DAY: u64 = 24 * 3600 * 1000;
    match at.saturating_sub(now) {
        0 => "expired".into(),
        left if left >= DAY => format!("expires in {} days", left / DAY),
        left => format!("expires in {}", output::fmt_duration_opt(Some(left))),
    }
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() {
        "-"
    } else {
        s
    }
}

/// The live node against its latest certificate; exit 1 naming each difference.
pub fn check(node: &str, r: &pb::CertResponse, out: OutputFormat) -> Result<Exit> {
    let cert = open(r.envelope.as_bytes())
        .context("the coordinator's certificate")?
        .cert;
    let diffs = if r.live_identity.is_empty() {
        vec![format!("node `{node}` is not registered now")]
    } else {
        let live: Identity = serde_json::from_str(&r.live_identity).context("the live identity")?;
        identity::differences(&cert.identity, &live)
    };
    let holds = diffs.is_empty();
    match out {
        OutputFormat::Json => output::print_json(&json!({
            "node": node, "id": cert.id, "holds": holds, "differences": diffs,
        })),
        _ => {
            let mut s = String::new();
            for d in &diffs {
                s.push_str(&format!("{d}\n"));
            }
            s.push_str(&format!(
                "{}: {}\n",
                cert.id,
                if holds {
                    "the node matches its certificate"
                } else {
                    "the certificate no longer holds"
                }
            ));
            output::print_text(&s)
        }
    }
    Ok(Exit::failed_if(!holds))
}

pub fn revocation_json(r: &pb::Revocation) -> serde_json::Value {
    json!({ "id": r.id, "reason": r.reason, "revoked_unix_ms": r.revoked_unix_ms })
}

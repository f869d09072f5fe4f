//! The `topology` check: NVLinks up on every GPU, as many on each, and the
//! PCIe paths between GPU pairs.
//!
//! Its own file because it is the one check of how GPUs connect, and the
//! longest: links that did not answer are unknown, never down, so the
//! comparison has its own rules.

use std::collections::BTreeMap;

use gpuctl_proto::pb::{PreflightCheck, Verdict};

use super::{check, list};
use crate::preflight::Snapshot;

pub fn topology(s: &Snapshot) -> PreflightCheck {
    const NAME: &str = "topology";
    let n = &s.node;
    match s.gpus.len() {
        0 => return check(n, NAME, Verdict::Pass, "no GPU".into(), ""),
        1 => {
            return check(
                n,
                NAME,
                Verdict::Pass,
                "one GPU: no GPU-to-GPU link to check".into(),
                "",
            )
        }
        _ => {}
    }
    let mut pcie: BTreeMap<&str, u32> = BTreeMap::new();
    for p in &s.pairs {
        *pcie.entry(p.pcie.as_str()).or_default() += 1;
    }
    let pcie_text = if pcie.is_empty() {
        "PCIe paths unknown".to_string()
    } else {
        format!(
            "PCIe paths between GPU pairs: {}",
            pcie.iter()
                .map(|(k, v)| format!("{v}×{k}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let with_links: Vec<_> = s.gpus.iter().filter(|g| g.nvlinks_present > 0).collect();
    if with_links.is_empty() {
        return check(
            n,
            NAME,
            Verdict::Pass,
            format!("no NVLink: GPUs talk over PCIe; {pcie_text}"),
            "",
        );
    }
    let best = with_links
        .iter()
        .map(|g| g.nvlinks_active)
        .max()
        .unwrap_or(0);
    // A GPU some of whose links did not answer is not compared: unknown is
    // never down.
    let answered = with_links
        .iter()
        .map(|g| g.nvlinks_present)
        .max()
        .unwrap_or(0);
    let dead: Vec<u32> = with_links
        .iter()
        .filter(|g| g.nvlinks_active == 0 && g.nvlinks_present == answered)
        .map(|g| g.index)
        .collect();
    let short: Vec<String> = with_links
        .iter()
        .filter(|g| {
            g.nvlinks_active > 0 && g.nvlinks_active < best && g.nvlinks_present == answered
        })
        .map(|g| format!("GPU {} has {}", g.index, g.nvlinks_active))
        .collect();
    let counts: Vec<String> = s
        .gpus
        .iter()
        .map(|g| format!("{}/{}", g.nvlinks_active, g.nvlinks_present))
        .collect();
    let summary = if counts.iter().all(|c| *c == counts[0]) {
        format!("NVLink {} active on every GPU", counts[0])
    } else {
        format!("NVLinks active per GPU: {}", counts.join(" "))
    };
    const FIX: &str = "check the NVLink fabric: `nvidia-smi nvlink -s`; on NVSwitch systems start nvidia-fabricmanager (same version as the driver); reseat or RMA a GPU whose links stay down";
    if !dead.is_empty() {
        return check(
            n,
            NAME,
            Verdict::Warn,
            format!("GPU {} has NVLink but no active link (traffic falls back to PCIe); {summary}; {pcie_text}", list(&dead)),
            FIX,
        );
    }
    if !short.is_empty() {
        return check(
            n,
            NAME,
            Verdict::Warn,
            format!(
                "{} of {best} active NVLinks; {summary}; {pcie_text}",
                short.join(", ")
            ),
            FIX,
        );
    }
    check(
        n,
        NAME,
        Verdict::Pass,
        format!("{summary}; {pcie_text}"),
        "",
    )
}

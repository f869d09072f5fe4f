//! The report's GPU health findings and telemetry summary, a row per GPU.

use gpuctl_proto::pb;

use crate::output::{self, table::Table};

/// Findings worst first, so the reason a node failed is the first line.
pub fn health_table(findings: &[pb::HealthFinding]) -> String {
    let mut f: Vec<&pb::HealthFinding> = findings.iter().collect();
    f.sort_by_key(|x| {
        (
            x.verdict() != pb::Verdict::Fail,
            x.node.clone(),
            x.gpu_index,
        )
    });
    let mut t = Table::new(&["NODE", "GPU", "VERDICT", "RULE", "DETAIL"]).right(&[1]);
    for x in f {
        t.row([
            x.node.clone(),
            x.gpu_index.to_string(),
            x.verdict().label().to_string(),
            x.rule.clone(),
            output::dash(&x.detail),
        ]);
    }
    t.render()
}

/// One row per GPU: how busy, hot and hungry it was, how steady, and what its
/// error counters did during the run.
pub fn telemetry_table(summaries: &[pb::GpuTelemetrySummary]) -> String {
    telemetry_grid(summaries).render()
}

/// The telemetry table before layout (the HTML report's too).
pub(crate) fn telemetry_grid(summaries: &[pb::GpuTelemetrySummary]) -> Table {
    let mut t = Table::new(&[
        "NODE",
        "GPU",
        "VERDICT",
        "SAMPLES",
        "UTIL MEAN",
        "MAX",
        "STD",
        "<10%",
        "MEM MAX",
        "TEMP MEAN",
        "MAX",
        "POWER MEAN",
        "MAX",
        "SM MHZ",
        "ECC C/U",
        "PCIE REPLAYS",
        "NVLINK CRC",
        "XIDS",
    ])
    .right(&(1..17).filter(|c| *c != 2).collect::<Vec<_>>());
    for x in summaries {
        t.row([
            x.node.clone(),
            x.index.to_string(),
            x.verdict().label().to_string(),
            x.samples.to_string(),
            format!("{:.1}%", x.util_mean),
            format!("{:.0}%", x.util_max),
            format!("{:.1}", x.util_std),
            format!("{:.0}%", x.util_low_share * 100.0),
            gpuctl_core::units::format_bytes(x.mem_used_max_bytes),
            format!("{:.1}°C", x.temp_mean),
            format!("{:.0}°C", x.temp_max),
            format!("{:.0} W", x.power_mean_w),
            format!("{:.0} W", x.power_max_w),
            format!("{:.0}", x.sm_clock_mean_mhz),
            format!("{}/{}", x.ecc_corrected_delta, x.ecc_uncorrected_delta),
            x.pcie_replays_delta.to_string(),
            x.nvlink_crc_delta.to_string(),
            output::dash(
                &x.xids
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        ]);
    }
    t
}

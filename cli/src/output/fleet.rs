//! The fleet's history for people and scripts: a row per node (last
//! verdict, figures, drift), one node's runs, and the latest bandwidth of
//! every pair of nodes; tables (also `-o csv|md`) and JSON.

use gpuctl_proto::pb;
use serde_json::{json, Value};

use crate::output::{self, table::Table};

fn num(v: f64) -> String {
    if v <= 0.0 || !v.is_finite() {
        "-".into()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

fn drift_text(d: &[pb::Drift]) -> String {
    let flagged: Vec<String> = d
        .iter()
        .filter(|d| d.flagged)
        .map(|d| {
            format!(
                "{} {} {:.2}x of {} runs",
                d.metric, d.key, d.ratio, d.previous_runs
            )
        })
        .collect();
    if flagged.is_empty() {
        "-".into()
    } else {
        flagged.join("; ")
    }
}

/// A node's latest acceptance certificate (issue 50): its verdict and how
/// long it holds, or why it does not.
pub fn cert_text(c: Option<&pb::CertSummary>, now: u64) -> String {
    match c {
        None => "-".into(),
        Some(c) if c.revoked => format!("{} revoked", c.verdict),
        Some(c) if c.expires_unix_ms <= now => format!("{} expired", c.verdict),
        Some(c) => format!(
            "{}, {}d left",
            c.verdict,
            (c.expires_unix_ms - now) / (24 * 3600 * 1000)
        ),
    }
}

/// As JSON: `null` without a certificate.
pub fn cert_json(c: Option<&pb::CertSummary>, now: u64) -> Value {
    c.map_or(Value::Null, |c| {
        json!({
            "id": c.id,
            "verdict": c.verdict,
            "issued_unix_ms": c.issued_unix_ms,
            "expires_unix_ms": c.expires_unix_ms,
            "revoked": c.revoked,
            "valid": !c.revoked && c.expires_unix_ms > now,
        })
    })
}

pub fn rows_grid(rows: &[pb::FleetRow], certs: &[pb::CertSummary], now: u64) -> Table {
    let cert_of = by_node(certs);
    let mut t = Table::new(&[
        "NODE",
        "ACCEPTANCE",
        "CERTIFICATE",
        "LAST",
        "WHEN",
        "RUNS",
        "TFLOP/S WORST",
        "MEDIAN",
        "ALL_REDUCE GB/S",
        "MEDIAN LINK",
        "SAMPLES/S",
        "P2P GB/S WORST",
        "H2D WORST",
        "D2H WORST",
        "DRIFT",
    ])
    .right(&[5, 6, 7, 8, 9, 10, 11, 12, 13]);
    for r in rows {
        t.row([
            r.node.clone(),
            acceptance_text(r.acceptance.as_ref(), now),
            cert_text(cert_of.get(r.node.as_str()).copied(), now),
            r.last_verdict().label().to_string(),
            output::age(r.last_unix_ms, now),
            r.runs.to_string(),
            num(r.stress_tflops_worst),
            num(r.stress_tflops_median),
            num(r.all_reduce_busbw_gbps),
            num(r.median_link_gbps),
            num(r.samples_per_s),
            num(r.p2p_gbps_worst),
            num(r.h2d_gbps_worst),
            num(r.d2h_gbps_worst),
            drift_text(&r.drift),
        ]);
    }
    t
}

pub fn runs_grid(runs: &[pb::NodeRun], now: u64) -> Table {
    let mut t = Table::new(&["WHEN", "JOB", "WORKLOAD", "VERDICT", "FIGURES", "REASON"]);
    for r in runs {
        let figs: Vec<String> = r
            .figures
            .iter()
            .map(|f| match f.gpu_index {
                Some(g) => format!("{} GPU {g} {}", f.metric, num(f.value)),
                None => format!("{} {}", f.metric, num(f.value)),
            })
            .collect();
        t.row([
            output::age(r.finished_unix_ms, now),
            r.job_id.clone(),
            r.workload.clone(),
            r.verdict().label().to_string(),
            output::dash(&figs.join(", ")),
            output::dash(&r.reason),
        ]);
    }
    t
}

pub fn links_table(links: &[pb::Link], now: u64) -> String {
    let mut s = output::links::matrix(links);
    s.push('\n');
    s.push_str(&links_grid(links, now).render());
    s
}

pub fn links_grid(links: &[pb::Link], now: u64) -> Table {
    let mut t = Table::new(&["A", "B", "OP", "GB/S", "VERDICT", "MEASURED"]).right(&[3]);
    for l in links {
        t.row([
            l.a.clone(),
            l.b.clone(),
            l.op.clone(),
            num(l.busbw_gbps),
            l.verdict().label().to_string(),
            output::age(l.measured_unix_ms, now),
        ]);
    }
    t
}

/// "accepted 3d ago at standard", "failed quick at stress 2h ago", or "-".
pub fn acceptance_text(a: Option<&pb::Acceptance>, now: u64) -> String {
    let Some(a) = a else {
        return "-".into();
    };
    let age = output::age(a.finished_unix_ms, now);
    match a.verdict() {
        pb::Verdict::Pass | pb::Verdict::Warn => format!("accepted {age} at {}", a.level),
        pb::Verdict::Fail => format!("failed {} at {} {age}", a.level, output::dash(&a.stage)),
        _ => format!("not accepted at {} {age}", a.level),
    }
}

/// Each node's certificate, found by name: a scan per row was quadratic,
/// 2.7e8 comparisons for 16,384 certified nodes.
pub fn by_node(certs: &[pb::CertSummary]) -> std::collections::HashMap<&str, &pb::CertSummary> {
    certs.iter().map(|c| (c.node.as_str(), c)).collect()
}

pub fn row(r: &pb::FleetRow) -> Value {
    json!({
        "node": r.node,
        "acceptance": r.acceptance.as_ref().map(|a| json!({
            "suite": a.suite_id,
            "level": a.level,
            "verdict": a.verdict().label(),
            "stage": a.stage,
            "reason": a.reason,
            "finished_unix_ms": a.finished_unix_ms,
        })),
        "last_verdict": r.last_verdict().label(),
        "last_unix_ms": r.last_unix_ms,
        "last_job": r.last_job,
        "runs": r.runs,
        "stress_tflops_worst": r.stress_tflops_worst,
        "stress_tflops_median": r.stress_tflops_median,
        "all_reduce_busbw_gbps": r.all_reduce_busbw_gbps,
        "median_link_gbps": r.median_link_gbps,
        "samples_per_s": r.samples_per_s,
        "p2p_gbps_worst": r.p2p_gbps_worst,
        "h2d_gbps_worst": r.h2d_gbps_worst,
        "d2h_gbps_worst": r.d2h_gbps_worst,
        "drift": r.drift.iter().map(|d| json!({
            "metric": d.metric,
            "key": d.key,
            "last": d.last,
            "previous_median": d.previous_median,
            "previous_runs": d.previous_runs,
            "ratio": d.ratio,
            "flagged": d.flagged,
        })).collect::<Vec<_>>(),
    })
}

pub fn node_run(r: &pb::NodeRun) -> Value {
    json!({
        "node": r.node,
        "job_id": r.job_id,
        "workload": r.workload,
        "finished_unix_ms": r.finished_unix_ms,
        "verdict": r.verdict().label(),
        "reason": r.reason,
        "figures": r.figures.iter().map(|f| json!({
            "metric": f.metric,
            "key": f.key,
            "value": f.value,
            "gpu_uuid": f.gpu_uuid,
            "gpu_index": f.gpu_index,
        })).collect::<Vec<_>>(),
    })
}

pub fn link(l: &pb::Link, now: u64) -> Value {
    json!({
        "a": l.a,
        "b": l.b,
        "op": l.op,
        "bytes": l.bytes,
        "busbw_gbps": l.busbw_gbps,
        "verdict": l.verdict().label(),
        "measured_unix_ms": l.measured_unix_ms,
        "age_s": now.saturating_sub(l.measured_unix_ms) / 1000,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet_row(node: &str, p2p: f64, h2d: f64, d2h: f64) -> pb::FleetRow {
        pb::FleetRow {
            node: node.into(),
            runs: 3,
            p2p_gbps_worst: p2p,
            h2d_gbps_worst: h2d,
            d2h_gbps_worst: d2h,
            ..Default::default()
        }
    }

    #[test]
    fn p2p_figures_have_columns_and_a_node_without_them_dashes() {
        let rows = [
            fleet_row("gpu-1", 301.4, 53.12, 51.0),
            fleet_row("gpu-2", 0.0, 0.0, 0.0),
        ];
        let t = rows_grid(&rows, &[], 0);
        let col = |h: &str| t.headers().iter().position(|x| x == h).unwrap();
        let cells = |row: usize| -> Vec<&str> {
            ["P2P GB/S WORST", "H2D WORST", "D2H WORST"]
                .iter()
                .map(|h| t.rows()[row][col(h)].as_str())
                .collect()
        };
        assert_eq!(cells(0), ["301", "53.12", "51.00"]);
        assert_eq!(cells(1), ["-", "-", "-"]);
        assert!(col("D2H WORST") < col("DRIFT"));
        let v = row(&rows[0]);
        assert_eq!(v["p2p_gbps_worst"], 301.4);
        assert_eq!(v["h2d_gbps_worst"], 53.12);
        assert_eq!(v["d2h_gbps_worst"], 51.0);
        let csv = crate::output::grid::csv(&rows_grid(&rows, &[], 0)).unwrap();
        assert!(csv.contains(",301,53.12,51.00,"), "{csv}");
    }
}

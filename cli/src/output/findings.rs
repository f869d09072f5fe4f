//! What a person reads first in a report: the verdict line and the findings
//! that failed or warned, each with its node, GPU or rank, figure, reference
//! and rule; and preflight checks folded so that only what is not a pass
//! takes a row.

use std::collections::BTreeSet;

use gpuctl_proto::pb;

use super::table::Table;

/// `VERDICT  FAIL: 1 of 4 ranks failed: ...`: first and last line of a report.
pub fn verdict_line(r: &pb::Report) -> String {
    let mut s = format!("VERDICT  {}", r.verdict().label().to_uppercase());
    if !r.reason.is_empty() {
        s.push_str(&format!(": {}", r.reason));
    }
    s.push('\n');
    s
}

fn num(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn with_unit(v: f64, unit: &str) -> String {
    if unit.is_empty() {
        num(v)
    } else {
        format!("{} {unit}", num(v))
    }
}

/// Where: `GPU 0 (GPU-1a2b3c4d)`, `rank 3`, or `-`.
fn place(f: &pb::Finding) -> String {
    let uuid = if f.gpu_uuid.is_empty() {
        String::new()
    } else {
        format!(" ({})", &f.gpu_uuid[..f.gpu_uuid.len().min(12)])
    };
    match (f.gpu_index, f.rank) {
        (Some(g), Some(r)) => format!("rank {r}, GPU {g}{uuid}"),
        (Some(g), None) => format!("GPU {g}{uuid}"),
        (None, Some(r)) => format!("rank {r}"),
        (None, None) => "-".into(),
    }
}

/// A finding's level as shown: `fail`, `warn`, or `note` for one that only
/// says what a figure was judged against (level pass).
pub fn level(f: &pb::Finding) -> &'static str {
    match f.level() {
        pb::Verdict::Fail | pb::Verdict::Warn => f.level().label(),
        _ => "note",
    }
}

/// `1 fail, 0 warn` (and `, 1 note` when there are notes): the findings' heading.
pub fn counts(findings: &[pb::Finding]) -> String {
    let n = |l: &str| findings.iter().filter(|f| level(f) == l).count();
    let mut s = format!("{} fail, {} warn", n("fail"), n("warn"));
    if n("note") > 0 {
        s.push_str(&format!(", {} note", n("note")));
    }
    s
}

/// One row per finding, worst first as the coordinator sorted them.
pub fn findings_table(findings: &[pb::Finding]) -> String {
    findings_grid(findings).render()
}

/// The findings' table before layout (also the CSV and Markdown `findings`).
pub fn findings_grid(findings: &[pb::Finding]) -> Table {
    let mut t = Table::new(&[
        "LEVEL",
        "NODE",
        "WHERE",
        "WHAT",
        "VALUE",
        "REFERENCE",
        "RULE",
    ]);
    for f in findings {
        let what = if f.key.is_empty() {
            f.metric.clone()
        } else {
            format!("{} {}", f.metric, f.key)
        };
        let perf = !f.reference_kind.is_empty();
        let value = match (perf, f.missing) {
            (false, _) => "-".to_string(),
            (true, true) => "missing".to_string(),
            (true, false) => with_unit(f.value, &f.unit),
        };
        let reference = if !perf {
            "-".to_string()
        } else if f.missing || f.reference <= 0.0 {
            format!("{} {}", f.reference_kind, with_unit(f.reference, &f.unit))
        } else {
            let ratio = if f.metric == "step_ms_p99" && f.value > 0.0 {
                f.reference / f.value
            } else {
                f.value / f.reference
            };
            format!(
                "{} {} ({ratio:.2}x)",
                f.reference_kind,
                with_unit(f.reference, &f.unit)
            )
        };
        let rule = if perf { &f.rule } else { &f.detail };
        t.row([
            level(f).to_string(),
            if f.node.is_empty() {
                "(job)".to_string()
            } else {
                f.node.clone()
            },
            place(f),
            what,
            value,
            reference,
            super::dash(rule),
        ]);
    }
    t
}

/// `12 checks pass on 4 nodes` for the passing rows, and the others as they are.
pub fn fold_checks(checks: &[pb::PreflightCheck]) -> (Option<String>, Vec<&pb::PreflightCheck>) {
    let (pass, other): (Vec<&pb::PreflightCheck>, Vec<&pb::PreflightCheck>) = checks
        .iter()
        .partition(|c| c.verdict() == pb::Verdict::Pass);
    if pass.is_empty() {
        return (None, other);
    }
    let nodes: BTreeSet<&str> = pass
        .iter()
        .map(|c| c.node.as_str())
        .filter(|n| !n.is_empty())
        .collect();
    let kinds: BTreeSet<&str> = pass.iter().map(|c| c.name.as_str()).collect();
    let mut line = format!(
        "{} check{} pass",
        pass.len(),
        if pass.len() == 1 { "" } else { "s" }
    );
    match nodes.len() {
        0 => {}
        1 => line.push_str(&format!(" on {}", nodes.iter().next().unwrap_or(&""))),
        n => line.push_str(&format!(" on {n} nodes")),
    }
    line.push_str(&format!(
        " ({} kind{})",
        kinds.len(),
        if kinds.len() == 1 { "" } else { "s" }
    ));
    (Some(line), other)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(node: &str, name: &str, v: pb::Verdict) -> pb::PreflightCheck {
        pb::PreflightCheck {
            node: node.into(),
            name: name.into(),
            verdict: v as i32,
            detail: format!("{name} detail"),
            ..Default::default()
        }
    }

    #[test]
    fn passing_checks_fold_into_one_line() {
        let mut checks = Vec::new();
        for n in ["a", "b", "c", "d"] {
            for name in ["shm", "driver", "memlock"] {
                checks.push(check(n, name, pb::Verdict::Pass));
            }
        }
        checks.push(check("c", "gpu_processes", pb::Verdict::Warn));
        let (line, rest) = fold_checks(&checks);
        assert_eq!(line.as_deref(), Some("12 checks pass on 4 nodes (3 kinds)"));
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].name, "gpu_processes");
    }

    #[test]
    fn a_performance_finding_shows_value_reference_and_rule() {
        let f = pb::Finding {
            node: "node-2".into(),
            rank: Some(2),
            metric: "stress_tflops".into(),
            key: "fp32 256".into(),
            value: 3.1,
            reference: 6.8,
            reference_kind: "fleet".into(),
            rule: "fleet rule stress_tflops: fail below 0.90x".into(),
            level: pb::Verdict::Fail as i32,
            unit: "TFLOP/s".into(),
            ..Default::default()
        };
        let s = findings_table(&[f]);
        assert!(s.contains("fail"), "{s}");
        assert!(s.contains("node-2") && s.contains("rank 2"), "{s}");
        assert!(s.contains("stress_tflops fp32 256"), "{s}");
        assert!(s.contains("3.10 TFLOP/s"), "{s}");
        assert!(s.contains("fleet 6.80 TFLOP/s (0.46x)"), "{s}");
        assert!(s.contains("fleet rule stress_tflops"), "{s}");
    }
}

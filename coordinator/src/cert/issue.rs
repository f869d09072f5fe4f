//! One certificate per node of a suite that ended, passed or not: the
//! node's identity, the suite's stages, the rules, every figure of the node
//! against its reference with thresholds and verdict, the findings, and the
//! evidence's hashes; signed. Figures are read from each stage's report with
//! the judge's own reading (`judge::figures`), so that a certificate and a
//! report speak of the same figures.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpuctl_cert::envelope::{self, sha256_hex};
use gpuctl_cert::judge::judged;
use gpuctl_cert::model::{evidence_file, SCHEMA};
use gpuctl_cert::{
    Certificate, EvidenceRecord, FigureRecord, FindingRecord, Identity, Issuer, RulesRecord,
    StageRecord, SuiteRecord,
};
use gpuctl_core::stats::median;
use gpuctl_proto::pb::{Finding, Report, Suite};
use prost::Message;
use tracing::{info, warn};

use super::{records, Authority};
use crate::judge::checks::perf::rules::{Floor, PerfRules};
use crate::judge::figures::{of_report, Figures, Metric, RankFigures};
use crate::store::StateStore;

/// A node's outcome in the suite, as its acceptance state says.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub node: String,
    pub verdict: String,
    pub stage: String,
    pub reason: String,
    /// As its agent last registered; `None` when it is gone.
    pub identity: Option<Identity>,
}

/// Issues and stores the certificates of `suite`'s nodes. Runs off the
/// scheduler's task: it reads every stage's report from the store.
pub async fn issue_suite(
    store: StateStore,
    authority: Arc<Authority>,
    rules: Arc<PerfRules>,
    suite: Suite,
    outcomes: Vec<Outcome>,
    now_ms: u64,
) {
    let mut reports = Vec::new();
    for stage in suite.stages.iter().filter(|s| !s.job_id.is_empty()) {
        match store.report(&stage.job_id).await {
            Ok(Some(r)) => reports.push((stage.name.clone(), r.encode_to_vec(), r)),
            Ok(None) => warn!(suite = %suite.id, job = %stage.job_id, "no report to certify"),
            Err(e) => warn!(suite = %suite.id, job = %stage.job_id, "report unreadable: {e}"),
        }
    }
    let certs: Vec<(String, String)> = outcomes
        .iter()
        .map(|o| {
            let cert = build(&authority, &rules, &suite, o, &reports, now_ms);
            (o.node.clone(), envelope::sign(&cert, &authority.key))
        })
        .collect();
    let evidence = reports
        .into_iter()
        .map(|(_, bytes, r)| (r.job_id, bytes))
        .collect();
    let n = certs.len();
    match records::put(&store, &suite.id, evidence, certs).await {
        Ok(()) => info!(suite = %suite.id, certificates = n, "certificates issued"),
        Err(e) => warn!(suite = %suite.id, "certificates not stored: {e}"),
    }
}

type StageReport = (String, Vec<u8>, Report);

fn build(
    authority: &Authority,
    rules: &PerfRules,
    suite: &Suite,
    o: &Outcome,
    reports: &[StageReport],
    now_ms: u64,
) -> Certificate {
    let suite_rules = suite
        .request
        .as_ref()
        .map(|r| r.rules.clone())
        .unwrap_or_default();
    let effective = rules
        .overlay(&suite_rules)
        .unwrap_or_else(|_| rules.clone());
    let effective_text = format!("{effective:#?}");
    let mine: Vec<&StageReport> = reports
        .iter()
        .filter(|(_, _, r)| r.nodes.iter().any(|n| n.name == o.node))
        .collect();
    let mut figures = Vec::new();
    let mut findings = Vec::new();
    for (stage, _, report) in &mine {
        figures.extend(node_figures(&effective, stage, report, &o.node));
        findings.extend(
            report
                .findings
                .iter()
                .filter(|f| f.node == o.node || f.node.is_empty())
                .map(|f| FindingRecord {
                    stage: stage.clone(),
                    job_id: report.job_id.clone(),
                    level: f.level().label().to_string(),
                    metric: f.metric.clone(),
                    key: f.key.clone(),
                    detail: f.detail.clone(),
                }),
        );
    }
    let remediation = match (o.verdict.as_str(), o.stage.as_str()) {
        ("pass" | "warn", _) => String::new(),
        (_, "") => format!("{}; accept the node again once fixed", o.reason),
        (_, stage) => format!(
            "stage {stage}: {}; accept the node again once fixed",
            o.reason
        ),
    };
    Certificate {
        schema: SCHEMA.into(),
        id: format!("cert-{}-{}", suite.id, o.node),
        issued_unix_ms: now_ms,
        expires_unix_ms: now_ms + authority.validity_ms,
        issuer: Issuer {
            coordinator: authority.issuer.clone(),
            key_id: authority.key_id(),
        },
        node: o.node.clone(),
        status: Certificate::status_of(&o.verdict).into(),
        verdict: o.verdict.clone(),
        remediation,
        identity: o.identity.clone().unwrap_or_default(),
        suite: SuiteRecord {
            id: suite.id.clone(),
            name: suite.level.clone(),
            state: suite.state().label().to_string(),
            started_unix_ms: suite.created_unix_ms,
            finished_unix_ms: suite.finished_unix_ms,
            stages: suite
                .stages
                .iter()
                .map(|s| StageRecord {
                    name: s.name.clone(),
                    workload: s.workload.clone(),
                    job_id: s.job_id.clone(),
                    state: s.state().label().to_string(),
                    duration_ms: s.finished_unix_ms.saturating_sub(s.started_unix_ms),
                    took_part: s.nodes.contains(&o.node),
                    note: s.note.clone(),
                })
                .collect(),
        },
        rules: RulesRecord {
            sha256: sha256_hex(effective_text.as_bytes()),
            effective: effective_text,
            suite_rules,
        },
        figures,
        findings,
        evidence: mine
            .iter()
            .map(|(_, bytes, r)| EvidenceRecord {
                job_id: r.job_id.clone(),
                file: evidence_file(&r.job_id),
                bytes: bytes.len() as u64,
                sha256: sha256_hex(bytes),
            })
            .collect(),
    }
}

/// The finding the judge wrote for one figure, if it missed.
fn finding_of<'a>(
    report: &'a Report,
    node: &str,
    rank: Option<u32>,
    metric: Metric,
    key: &str,
) -> Option<&'a Finding> {
    report.findings.iter().find(|f| {
        (f.node == node || (rank.is_none() && f.node.is_empty()))
            && f.rank == rank
            && f.metric == metric.name()
            && f.key == key
    })
}

/// The floor the judge held `metric key` to on `model`, as (the floor, the
/// score under which it warns): `None` where no floor applies, as the
/// judge decides it (`judge::checks::perf::floors`).
fn floor_of(
    rules: &PerfRules,
    figs: &Figures,
    model: &str,
    metric: Metric,
    key: &str,
) -> Option<(f64, f64)> {
    let single_node = figs.job.single_node.is_some();
    if Floor::lone_link(metric, figs.ranks.len()) {
        return None;
    }
    let f = rules
        .floors
        .iter()
        .find(|f| f.metric == metric.name() && f.key == key && f.fits(model, single_node))?;
    let warn = match f.warn {
        Some(w) if metric.higher_is_better() && f.fail > 0.0 => w / f.fail,
        Some(w) if w > 0.0 => f.fail / w,
        _ => 1.0,
    };
    Some((f.fail, warn))
}

/// Every figure of `node` in one stage's report, each against the reference
/// the judge used where it missed (its finding), else against the job's
/// median of the same figure among ranks of the same device class, else
/// against the floor it met.
fn node_figures(rules: &PerfRules, stage: &str, report: &Report, node: &str) -> Vec<FigureRecord> {
    let figs = of_report(report);
    let mut peers: BTreeMap<(Metric, &str, &str), Vec<f64>> = BTreeMap::new();
    for r in figs.ranks.iter().filter(|r| r.reported) {
        for f in &r.figures {
            peers
                .entry((f.metric, &*f.key, &*r.class))
                .or_default()
                .push(f.value);
        }
    }
    let mut out = Vec::new();
    let record = |r: Option<&RankFigures>, metric: Metric, key: &str, value: f64| {
        let rank = r.map(|r| r.rank);
        let rule = rules.metric(metric);
        let cpu = r.is_some_and(|r| r.gpu_index.is_none());
        let (kind, reference, (fail, warn)) = match finding_of(report, node, rank, metric, key) {
            Some(f) if f.reference_kind == "floor" => {
                ("floor".to_string(), f.reference, (1.0, 1.0))
            }
            Some(f) if f.reference_kind == "baseline" => (
                "baseline".to_string(),
                f.reference,
                (rule.baseline_fail(), rule.baseline_warn()),
            ),
            Some(f) => (
                f.reference_kind.clone(),
                f.reference,
                rule.fleet_ratios(cpu),
            ),
            None => {
                let fleet = match r {
                    Some(r) if rule.fleet => {
                        let vals = peers
                            .get(&(metric, key, &*r.class))
                            .cloned()
                            .unwrap_or_default();
                        (vals.len() >= rules.fleet_min_ranks).then(|| {
                            let m = median(vals).unwrap_or(0.0);
                            ("fleet".to_string(), m, rule.fleet_ratios(cpu))
                        })
                    }
                    _ => None,
                };
                // Met its floor: the judge wrote nothing, but the floor it
                // held the figure to is the reference a reader wants.
                let model = r.map(|r| &*r.model).or(figs.job.model.as_deref());
                fleet
                    .or_else(|| {
                        floor_of(rules, &figs, model?, metric, key)
                            .map(|(fail, warn)| ("floor".to_string(), fail, (1.0, warn)))
                    })
                    .unwrap_or(("none".to_string(), 0.0, (0.0, 0.0)))
            }
        };
        // JSON has no NaN: a reference that is not a number judges nothing.
        let (kind, reference) = if reference.is_finite() {
            (kind, reference)
        } else {
            ("none".to_string(), 0.0)
        };
        judged(FigureRecord {
            stage: stage.to_string(),
            job_id: report.job_id.clone(),
            rank,
            gpu_uuid: r.map(|r| r.gpu_uuid.clone()).unwrap_or_default(),
            metric: metric.name().to_string(),
            key: key.to_string(),
            unit: metric.unit().to_string(),
            value,
            reference_kind: kind,
            reference,
            higher_is_better: metric.higher_is_better(),
            fail_below: fail,
            warn_below: warn,
            margin: 0.0,
            verdict: String::new(),
        })
    };
    for r in figs.ranks.iter().filter(|r| *r.node == *node) {
        for f in r.figures.iter().filter(|f| f.value.is_finite()) {
            out.push(record(Some(r), f.metric, &f.key, f.value));
        }
    }
    for f in figs.job.figures.iter().filter(|f| f.value.is_finite()) {
        out.push(record(None, f.metric, &f.key, f.value));
    }
    out
}

#[cfg(test)]
mod tests {
    use gpuctl_proto::pb::{
        rank_result::Detail, NodeReport, RankReport, RankResult, StressResult, Verdict,
    };

    use super::*;

    fn rank(i: u32, median: f64, intervals: f64) -> NodeReport {
        NodeReport {
            name: format!("n{i}"),
            ranks: vec![RankReport {
                rank: i,
                gpu_index: Some(0),
                gpu_uuid: format!("GPU-{i}"),
                result: Some(Box::new(RankResult {
                    rank: i,
                    ok: true,
                    device_name: "NVIDIA H200".into(),
                    detail: Some(Detail::Stress(StressResult {
                        dtype: "bf16".into(),
                        matrix_size: 8192,
                        tflops_per_interval: vec![intervals; 10],
                        tflops_median: median,
                        ..Default::default()
                    })),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn finding(node: &str, rank: u32, metric: &str, reference: f64, kind: &str) -> Finding {
        Finding {
            node: node.into(),
            rank: Some(rank),
            metric: metric.into(),
            key: "bf16 8192".into(),
            reference,
            reference_kind: kind.into(),
            level: Verdict::Fail as i32,
            ..Default::default()
        }
    }

    fn report() -> Report {
        Report {
            job_id: "job-000001".into(),
            workload: "stress".into(),
            nodes: vec![
                rank(0, 700.0, 700.0),
                rank(1, 710.0, 710.0),
                rank(2, 690.0, 600.0),
                rank(3, 500.0, 500.0),
            ],
            findings: vec![
                finding("n3", 3, "stress_tflops", 700.0, "fleet"),
                finding("n2", 2, "stress_tflops_worst", 680.0, "floor"),
            ],
            ..Default::default()
        }
    }

    fn of<'a>(figs: &'a [FigureRecord], metric: &str) -> &'a FigureRecord {
        figs.iter().find(|f| f.metric == metric).unwrap()
    }

    #[test]
    fn each_figure_is_judged_against_the_judges_reference_where_it_missed_else_the_median() {
        let rules = PerfRules::default();
        let n0 = node_figures(&rules, "stress", &report(), "n0");
        let tf = of(&n0, "stress_tflops");
        assert_eq!((tf.reference_kind.as_str(), tf.reference), ("fleet", 695.0));
        assert_eq!(tf.verdict, "pass");
        assert_eq!(tf.rank, Some(0));
        assert_eq!(tf.gpu_uuid, "GPU-0");
        // The judge's finding gives the reference; the rules the thresholds.
        let n3 = node_figures(&rules, "stress", &report(), "n3");
        let tf = of(&n3, "stress_tflops");
        assert_eq!((tf.reference, tf.verdict.as_str()), (700.0, "fail"));
        let rule = rules.metric(Metric::StressTflops);
        assert_eq!((tf.fail_below, tf.warn_below), rule.fleet_ratios(false));
        assert!((tf.margin - (500.0 / 700.0 - 1.0)).abs() < 1e-12);
        // A floor is met or not: both thresholds are 1.
        let n2 = node_figures(&rules, "stress", &report(), "n2");
        let worst = of(&n2, "stress_tflops_worst");
        assert_eq!(
            (
                worst.reference_kind.as_str(),
                worst.fail_below,
                worst.verdict.as_str()
            ),
            ("floor", 1.0, "fail")
        );
        // Each figure's recorded verdict is what re-judging gives.
        for f in n0.iter().chain(&n2).chain(&n3) {
            assert_eq!(&judged(f.clone()), f);
        }
    }

    #[test]
    fn a_lone_gpu_that_met_its_floor_records_the_floor_not_nothing() {
        // One H200 on its own (the device machine's one-GPU lease): no fleet
        // to compare with, no finding, but the built-in floor it met.
        let rules = PerfRules::default();
        let one = Report {
            job_id: "job-000001".into(),
            workload: "stress".into(),
            nodes: vec![rank(0, 657.8, 655.0)],
            ..Default::default()
        };
        let figs = node_figures(&rules, "stress", &one, "n0");
        let tf = of(&figs, "stress_tflops");
        let floor = rules
            .floors
            .iter()
            .find(|f| f.gpu == "NVIDIA H200" && f.metric == "stress_tflops" && f.key == "bf16 8192")
            .expect("a built-in H200 stress floor");
        assert_eq!(
            (
                tf.reference_kind.as_str(),
                tf.reference,
                tf.verdict.as_str()
            ),
            ("floor", floor.fail, "pass")
        );
        assert_eq!(&judged(tf.clone()), tf);
        // Below it: fail, against the same floor.
        let slow = Report {
            nodes: vec![rank(0, 295.0, 290.0)],
            ..one
        };
        let tf = node_figures(&rules, "stress", &slow, "n0")
            .into_iter()
            .find(|f| f.metric == "stress_tflops")
            .unwrap();
        assert_eq!(
            (tf.reference_kind.as_str(), tf.verdict.as_str()),
            ("floor", "fail")
        );
    }
}

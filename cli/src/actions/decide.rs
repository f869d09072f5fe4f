//! The decision of `gpuctl accept --drain` / `--kubernetes`: from a finished
//! suite's verdicts (and, for Slurm, each node's state before acting) to the
//! steps to take. Pure, so that every rule of docs/operations.md ("Slurm",
//! "Kubernetes labels and taints") is a unit test here; the effectors
//! (`slurm.rs`, `kubernetes.rs`) only turn steps into commands.
//!
//! The rules:
//! - only a node the suite *blamed* (verdict fail) is drained or tainted; a
//!   suite that failed without naming a node (a stage that could not start, a
//!   job that failed as a whole, a cancelled suite) acts on nothing;
//! - a node is accepted (resumed, untainted) only when it passed (or warned)
//!   and no stage it sat in failed without blaming someone, since then its
//!   pass is no measurement;
//! - gpuctl's drains carry the reason prefix [`REASON_PREFIX`]: a drained node
//!   is resumed only when that prefix says gpuctl drained it, and a node
//!   someone else drained is neither resumed nor re-drained (which would
//!   overwrite their reason and let a later pass resume it).

use std::collections::BTreeMap;

use gpuctl_proto::pb;

/// Every Slurm reason gpuctl sets starts with this; it is how gpuctl tells
/// its own drains from an operator's.
pub const REASON_PREFIX: &str = "gpuctl:";

/// Longest reason set, in characters: `sinfo -R -o '%100E'` and
/// `scontrol show node` show it whole.
pub const MAX_REASON: usize = 200;

/// What the suite says of one node, scheduler aside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judged {
    /// Blamed: failed at `stage` (its job `job`, empty for preflight) with `finding`.
    Failed {
        stage: String,
        job: String,
        finding: String,
    },
    /// Passed every stage it ran (warnings included).
    Accepted,
    /// No verdict to act on, and why.
    Undecided(String),
}

/// The finding that failed `node` in a stage's report: its first failed
/// finding's sentence (with the rank), or the suite's reason for the node
/// when the report has none (preflight, a stage without a job).
fn finding(report: Option<&pb::Report>, node: &str, reason: &str) -> String {
    let found = report.and_then(|r| {
        r.nodes
            .iter()
            .filter(|n| n.name == node)
            .flat_map(|n| &n.findings)
            .chain(r.findings.iter().filter(|f| f.node == node))
            .find(|f| f.level() == pb::Verdict::Fail && !f.detail.is_empty())
    });
    match found {
        Some(f) => match f.rank {
            Some(rank) if !f.detail.contains("rank ") => format!("rank {rank}: {}", f.detail),
            _ => f.detail.clone(),
        },
        None => reason.to_string(),
    }
}

/// Each node of the suite, by name, with what the suite says of it;
/// `reports` are the stages' reports (by job id) for the findings.
pub fn judge(suite: &pb::Suite, reports: &[pb::Report]) -> Vec<(String, Judged)> {
    if suite.state() == pb::JobState::Cancelled {
        return suite
            .verdicts
            .iter()
            .map(|n| {
                (
                    n.node.clone(),
                    Judged::Undecided("the suite was cancelled".into()),
                )
            })
            .collect();
    }
    let blamed_at = |stage: &str| {
        suite
            .verdicts
            .iter()
            .any(|v| v.verdict() == pb::Verdict::Fail && v.stage == stage)
    };
    // Stages that failed as a whole: nobody in them was measured.
    let unexplained: Vec<&pb::SuiteStage> = suite
        .stages
        .iter()
        .filter(|s| s.state() == pb::JobState::Failed && !blamed_at(&s.name))
        .collect();
    suite
        .verdicts
        .iter()
        .map(|n| {
            let judged = match n.verdict() {
                pb::Verdict::Fail => {
                    let job = suite
                        .stages
                        .iter()
                        .find(|s| s.name == n.stage)
                        .map(|s| s.job_id.clone())
                        .unwrap_or_default();
                    let report = reports.iter().find(|r| !job.is_empty() && r.job_id == job);
                    Judged::Failed {
                        stage: n.stage.clone(),
                        finding: finding(report, &n.node, &n.reason),
                        job,
                    }
                }
                pb::Verdict::Pass | pb::Verdict::Warn => {
                    match unexplained.iter().find(|s| s.nodes.contains(&n.node)) {
                        Some(s) => Judged::Undecided(format!(
                            "stage {} failed without blaming a node",
                            s.name
                        )),
                        None => Judged::Accepted,
                    }
                }
                _ => Judged::Undecided(if n.reason.is_empty() {
                    "no verdict".into()
                } else {
                    format!("incomplete: {}", n.reason)
                }),
            };
            (n.node.clone(), judged)
        })
        .collect()
}

/// A node's state in Slurm before acting, as `sinfo` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmNode {
    /// `drained`, `draining`, `idle+drain`…: any state with a drain flag.
    pub drained: bool,
    /// The reason set with the drain (empty when none).
    pub reason: String,
}

impl SlurmNode {
    /// Drained by gpuctl: drained, with gpuctl's reason prefix.
    pub fn ours(&self) -> bool {
        self.drained && self.reason.starts_with(REASON_PREFIX)
    }
}

/// One step on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// `scontrol update nodename=NODE state=drain reason=REASON`.
    Drain { node: String, reason: String },
    /// `scontrol update nodename=NODE state=resume`.
    Resume { node: String },
    /// Nothing done, and why (printed, so the operator sees every node).
    Leave { node: String, why: String },
}

impl Step {
    pub fn node(&self) -> &str {
        match self {
            Step::Drain { node, .. } | Step::Resume { node } | Step::Leave { node, .. } => node,
        }
    }
}

/// The reason gpuctl sets on a node it drains: the prefix, the suite and its
/// level, the stage, the stage's job (and the Slurm job when inside one), and
/// the finding, on one line of at most [`MAX_REASON`] characters.
/// `gpuctl: acc-000002 quick/stress job-000005 slurm-job 41: stress_tflops 0.11x …`
pub fn reason(suite: &pb::Suite, stage: &str, job: &str, slurm_job: &str, finding: &str) -> String {
    let mut r = format!("{REASON_PREFIX} {} {}/{stage}", suite.id, suite.level);
    if !job.is_empty() {
        r += &format!(" {job}");
    }
    if !slurm_job.is_empty() {
        r += &format!(" slurm-job {slurm_job}");
    }
    // One line: sinfo prints a reason as is, and scontrol takes it as one argument.
    let finding: Vec<&str> = finding.split_whitespace().collect();
    let finding = if finding.is_empty() {
        "failed".to_string()
    } else {
        finding.join(" ")
    };
    r += ": ";
    r += &finding;
    if r.chars().count() > MAX_REASON {
        r = r.chars().take(MAX_REASON - 1).collect::<String>() + "…";
    }
    r
}

/// The Slurm steps for a finished suite, given each node's state in Slurm
/// (a node missing from `held` is not a Slurm node: left alone).
pub fn slurm_steps(
    suite: &pb::Suite,
    reports: &[pb::Report],
    held: &BTreeMap<String, SlurmNode>,
    slurm_job: &str,
) -> Vec<Step> {
    judge(suite, reports)
        .into_iter()
        .map(|(node, judged)| {
            let leave = |why: String| Step::Leave {
                node: node.clone(),
                why,
            };
            let Some(state) = held.get(&node) else {
                return leave("not a node Slurm knows".into());
            };
            match judged {
                Judged::Undecided(why) => leave(format!("no action: {why}")),
                Judged::Failed {
                    stage,
                    job,
                    finding,
                } => {
                    if state.drained && !state.ours() {
                        leave(format!(
                            "failed, but already drained by someone else (reason: {}); their drain is kept",
                            if state.reason.is_empty() { "none" } else { &state.reason }
                        ))
                    } else {
                        // Drained by gpuctl before: drained again, with today's reason.
                        Step::Drain {
                            reason: reason(suite, &stage, &job, slurm_job, &finding),
                            node: node.clone(),
                        }
                    }
                }
                Judged::Accepted => {
                    if state.ours() {
                        Step::Resume { node: node.clone() }
                    } else if state.drained {
                        leave(format!(
                            "passed, but drained by someone else (reason: {}); gpuctl resumes only its own drains",
                            if state.reason.is_empty() { "none" } else { &state.reason }
                        ))
                    } else {
                        leave("passed; not drained".into())
                    }
                }
            }
        })
        .collect()
}

/// Kubernetes label keys and the taint key gpuctl owns; it never touches others.
pub const LABEL_VERDICT: &str = "gpuctl.io/acceptance";
pub const LABEL_SUITE: &str = "gpuctl.io/acceptance-suite";
pub const LABEL_STAGE: &str = "gpuctl.io/acceptance-stage";
pub const TAINT_KEY: &str = "gpuctl.io/acceptance-failed";

/// One node's Kubernetes step: the labels to set, and whether gpuctl's taint
/// is put on (`NoSchedule`, value the stage) or taken off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeStep {
    Set {
        node: String,
        labels: Vec<(String, String)>,
        /// `Some(value)`: taint `TAINT_KEY=value:NoSchedule`; `None`: remove it.
        taint: Option<String>,
    },
    Leave {
        node: String,
        why: String,
    },
}

impl KubeStep {
    pub fn node(&self) -> &str {
        match self {
            KubeStep::Set { node, .. } | KubeStep::Leave { node, .. } => node,
        }
    }
}

/// A label value as Kubernetes takes it: at most 63 of `[A-Za-z0-9._-]`,
/// starting and ending alphanumeric.
pub fn label_value(s: &str) -> String {
    let v: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(63)
        .collect();
    v.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// The Kubernetes steps for a finished suite: the same decision as Slurm's,
/// where gpuctl's own taint key plays the part of the reason prefix (a taint
/// someone else set has another key and is never removed).
pub fn kube_steps(suite: &pb::Suite) -> Vec<KubeStep> {
    judge(suite, &[])
        .into_iter()
        .map(|(node, judged)| {
            let suite_label = (LABEL_SUITE.to_string(), label_value(&suite.id));
            match judged {
                Judged::Failed { stage, .. } => KubeStep::Set {
                    node,
                    labels: vec![
                        (LABEL_VERDICT.into(), "fail".into()),
                        suite_label,
                        (LABEL_STAGE.into(), label_value(&stage)),
                    ],
                    taint: Some(label_value(&stage)),
                },
                Judged::Accepted => KubeStep::Set {
                    node,
                    labels: vec![
                        (LABEL_VERDICT.into(), "pass".into()),
                        suite_label,
                        (LABEL_STAGE.into(), String::new()),
                    ],
                    taint: None,
                },
                Judged::Undecided(why) => KubeStep::Leave {
                    node,
                    why: format!("no action: {why}"),
                },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn suite(state: pb::JobState, nodes: &[(&str, pb::Verdict, &str)]) -> pb::Suite {
        pb::Suite {
            id: "acc-000007".into(),
            level: "quick".into(),
            state: state as i32,
            verdicts: nodes
                .iter()
                .map(|(n, v, stage)| pb::SuiteNode {
                    node: n.to_string(),
                    verdict: *v as i32,
                    stage: stage.to_string(),
                    reason: if stage.is_empty() {
                        String::new()
                    } else {
                        "rank 0: stress_tflops 0.11x\nthe fleet".into()
                    },
                })
                .collect(),
            stages: vec![
                pb::SuiteStage {
                    name: "preflight".into(),
                    workload: "preflight".into(),
                    state: pb::JobState::Succeeded as i32,
                    nodes: nodes.iter().map(|n| n.0.to_string()).collect(),
                    ..Default::default()
                },
                pb::SuiteStage {
                    name: "stress".into(),
                    workload: "stress".into(),
                    job_id: "job-000012".into(),
                    state: if nodes.iter().any(|n| n.1 == pb::Verdict::Fail) {
                        pb::JobState::Failed as i32
                    } else {
                        pb::JobState::Succeeded as i32
                    },
                    nodes: nodes.iter().map(|n| n.0.to_string()).collect(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    fn idle() -> SlurmNode {
        SlurmNode {
            drained: false,
            reason: String::new(),
        }
    }

    fn drained(reason: &str) -> SlurmNode {
        SlurmNode {
            drained: true,
            reason: reason.into(),
        }
    }

    fn held(states: &[(&str, SlurmNode)]) -> BTreeMap<String, SlurmNode> {
        states
            .iter()
            .map(|(n, s)| (n.to_string(), s.clone()))
            .collect()
    }

    fn kinds(steps: &[Step]) -> Vec<String> {
        steps
            .iter()
            .map(|s| match s {
                Step::Drain { node, .. } => format!("drain {node}"),
                Step::Resume { node } => format!("resume {node}"),
                Step::Leave { node, .. } => format!("leave {node}"),
            })
            .collect()
    }

    #[test]
    fn a_blamed_node_is_drained_with_a_readable_reason_and_the_rest_left() {
        use pb::Verdict::*;
        let s = suite(
            pb::JobState::Failed,
            &[("n1", Pass, ""), ("n2", Fail, "stress"), ("n3", Warn, "")],
        );
        let h = held(&[("n1", idle()), ("n2", idle()), ("n3", idle())]);
        let steps = slurm_steps(&s, &[], &h, "41");
        assert_eq!(kinds(&steps), ["leave n1", "drain n2", "leave n3"]);
        let Step::Drain { reason, .. } = &steps[1] else {
            unreachable!()
        };
        assert_eq!(
            reason,
            "gpuctl: acc-000007 quick/stress job-000012 slurm-job 41: rank 0: stress_tflops 0.11x the fleet"
        );
        // With the stage's report, the reason quotes the node's failed finding.
        let report = pb::Report {
            job_id: "job-000012".into(),
            nodes: vec![pb::NodeReport {
                name: "n2".into(),
                findings: vec![
                    pb::Finding {
                        node: "n2".into(),
                        level: Warn as i32,
                        detail: "a warning first".into(),
                        ..Default::default()
                    },
                    pb::Finding {
                        node: "n2".into(),
                        rank: Some(1),
                        level: Fail as i32,
                        detail: "stress_tflops fp32 256 = 0.002 TFLOP/s against fleet reference 0.009 TFLOP/s".into(),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }],
            ..Default::default()
        };
        let steps = slurm_steps(&s, &[report], &h, "");
        let Step::Drain { reason, .. } = &steps[1] else {
            unreachable!()
        };
        assert_eq!(
            reason,
            "gpuctl: acc-000007 quick/stress job-000012: rank 1: stress_tflops fp32 256 = 0.002 TFLOP/s against fleet reference 0.009 TFLOP/s"
        );
    }

    #[test]
    fn only_gpuctls_own_drains_are_resumed_and_others_are_never_overwritten() {
        use pb::Verdict::*;
        let s = suite(
            pb::JobState::Failed,
            &[
                ("ours", Pass, ""),
                ("theirs", Pass, ""),
                ("theirs-failed", Fail, "stress"),
                ("ours-failed", Fail, "stress"),
                ("unknown", Pass, ""),
            ],
        );
        let h = held(&[
            ("ours", drained("gpuctl: acc-000001 quick/stress: old")),
            ("theirs", drained("disk swap")),
            ("theirs-failed", drained("gpuctl-like but not: reboot")),
            (
                "ours-failed",
                drained("gpuctl: acc-000001 quick/stress: old"),
            ),
        ]);
        let steps = slurm_steps(&s, &[], &h, "");
        assert_eq!(
            kinds(&steps),
            [
                "resume ours",
                "leave theirs",
                "leave theirs-failed",
                "drain ours-failed",
                "leave unknown"
            ]
        );
        let Step::Leave { why, .. } = &steps[1] else {
            unreachable!()
        };
        assert!(why.contains("disk swap"), "{why}");
        let Step::Drain { reason, .. } = &steps[3] else {
            unreachable!()
        };
        assert!(
            reason.starts_with("gpuctl: acc-000007 quick/stress job-000012: "),
            "{reason}"
        );
        // A passing node drained by a gpuctl reason but not drained any more
        // (an operator resumed it) needs nothing.
        let s = suite(pb::JobState::Succeeded, &[("n", Pass, "")]);
        let h = held(&[(
            "n",
            SlurmNode {
                drained: false,
                reason: "gpuctl: x".into(),
            },
        )]);
        assert_eq!(kinds(&slurm_steps(&s, &[], &h, "")), ["leave n"]);
    }

    #[test]
    fn a_suite_that_failed_without_blaming_a_node_or_was_cancelled_acts_on_nothing() {
        use pb::Verdict::*;
        let ours = drained("gpuctl: acc-000001 quick/stress: old");
        // The stress job failed as a whole: everyone incomplete or "passed" a
        // stage that never measured them.
        let mut s = suite(
            pb::JobState::Failed,
            &[("a", Pass, ""), ("b", Incomplete, "stress")],
        );
        s.stages[1].state = pb::JobState::Failed as i32;
        let h = held(&[("a", ours.clone()), ("b", idle())]);
        let steps = slurm_steps(&s, &[], &h, "");
        assert_eq!(kinds(&steps), ["leave a", "leave b"]);
        assert!(
            matches!(&steps[0], Step::Leave { why, .. } if why.contains("stage stress failed without blaming"))
        );
        assert!(kube_steps(&s)
            .iter()
            .all(|k| matches!(k, KubeStep::Leave { .. })));

        let s = suite(
            pb::JobState::Cancelled,
            &[("a", Pass, ""), ("b", Fail, "stress")],
        );
        let h = held(&[("a", ours), ("b", idle())]);
        assert_eq!(kinds(&slurm_steps(&s, &[], &h, "")), ["leave a", "leave b"]);
    }

    #[test]
    fn reasons_stay_one_short_line() {
        let s = suite(pb::JobState::Failed, &[]);
        let long = "x ".repeat(500);
        let r = reason(&s, "preflight", "", "", &long);
        assert_eq!(r.chars().count(), MAX_REASON);
        assert!(
            r.starts_with("gpuctl: acc-000007 quick/preflight: x x"),
            "{r}"
        );
        assert!(!r.contains('\n'));
        assert_eq!(
            reason(&s, "stress", "job-1", "", " \n"),
            "gpuctl: acc-000007 quick/stress job-1: failed"
        );
    }

    #[test]
    fn kubernetes_gets_labels_and_only_gpuctls_taint() {
        use pb::Verdict::*;
        let s = suite(
            pb::JobState::Failed,
            &[("a", Pass, ""), ("b", Fail, "stress")],
        );
        let k = kube_steps(&s);
        let KubeStep::Set { labels, taint, .. } = &k[0] else {
            panic!("{k:?}")
        };
        assert_eq!(taint, &None);
        assert!(labels.contains(&(LABEL_VERDICT.into(), "pass".into())));
        let KubeStep::Set { labels, taint, .. } = &k[1] else {
            panic!("{k:?}")
        };
        assert_eq!(taint.as_deref(), Some("stress"));
        assert!(labels.contains(&(LABEL_VERDICT.into(), "fail".into())));
        assert!(labels.contains(&(LABEL_SUITE.into(), "acc-000007".into())));
        assert_eq!(label_value("all reduce/1:2!"), "all_reduce_1_2");
        assert_eq!(label_value("-x-"), "x");
    }
}

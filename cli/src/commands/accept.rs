//! `gpuctl accept`: runs an acceptance suite (docs/acceptance.md) on the fleet
//! and prints one verdict per node, the stage that failed it, then each
//! stage's own report. The coordinator runs the stages (a node that fails
//! one sits out the later ones); this follows the suite, showing the stage
//! and the time left, and exits 0 only when every node passed every stage.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use gpuctl_core::clock::Clock;
use gpuctl_core::suite::{Suite as SuiteDef, LEVELS, MAX_SUITE_BYTES};
use gpuctl_proto::pb;
use serde_json::json;

use super::parse::{parse_duration_flag, parse_nodes, read_rules};
use crate::actions::Actions;
use crate::client::Coordinator;
use crate::error::UsageError;
use crate::exit::Exit;
use crate::output::{self, table::Table, OutputFormat};

pub const EXAMPLES: &str = "\
Examples:
  gpuctl accept --nodes all --level quick
  gpuctl accept --nodes all --level standard -o json > acceptance.json
  gpuctl accept --nodes all --level burn-in --duration 8h
  gpuctl accept --nodes 16 --selector rack=a1 --suite my-suite.toml
  gpuctl accept --nodes all --level quick --drain --dry-run";

#[derive(Debug, Args)]
pub struct AcceptArgs {
    /// How many nodes, or `all`.
    #[arg(long, default_value = "all", allow_hyphen_values = true)]
    pub nodes: String,
    /// quick (about 2 min), standard (about 15 min) or burn-in (--duration, default 2h).
    #[arg(long, default_value = "quick")]
    pub level: String,
    /// A suite file of your own (docs/acceptance.md) instead of a level.
    #[arg(long, value_name = "FILE")]
    pub suite: Option<PathBuf>,
    /// The suite's total time (burn-in fills what the other stages leave).
    #[arg(long, allow_hyphen_values = true)]
    pub duration: Option<String>,
    /// Node selector, key=value or key!=value; repeatable.
    #[arg(long = "selector", short = 'l', value_name = "K=V")]
    pub selectors: Vec<String>,
    /// Performance rules (TOML, docs/reports.md) for every stage.
    #[arg(long, value_name = "FILE")]
    pub rules: Option<PathBuf>,
    /// A foreign process on a GPU at a stage's start fails the node.
    #[arg(long)]
    pub exclusive: bool,
    /// Slurm: drain each node the suite fails (reason `gpuctl: …`), resume
    /// each node gpuctl drained that now passes (docs/operations.md "Slurm").
    #[arg(long)]
    pub drain: bool,
    /// Kubernetes: label each node with its verdict and taint the failed ones
    /// (docs/operations.md "Kubernetes labels and taints").
    #[arg(long)]
    pub kubernetes: bool,
    /// With --drain or --kubernetes: print what would change, change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// With --drain or --kubernetes: resume or untaint a node only with a valid
    /// certificate of this suite that still matches it (`gpuctl cert check`).
    #[arg(long)]
    pub require_cert: bool,
}

fn usage(msg: String) -> UsageError {
    UsageError(msg)
}

impl AcceptArgs {
    /// The request, checked here first: bad input sends nothing.
    pub fn to_request(&self) -> Result<pb::SubmitSuiteRequest, UsageError> {
        let (node_count, all_nodes) = parse_nodes(&self.nodes)?;
        let mut req = pb::SubmitSuiteRequest {
            level: self.level.trim().to_ascii_lowercase(),
            all_nodes,
            node_count,
            selectors: self
                .selectors
                .iter()
                .map(|s| s.trim().to_string())
                .collect(),
            exclusive: self.exclusive,
            ..Default::default()
        };
        if let Some(path) = &self.suite {
            let meta = std::fs::metadata(path)
                .map_err(|e| usage(format!("--suite: cannot read {}: {e}", path.display())))?;
            if meta.len() > MAX_SUITE_BYTES as u64 {
                return Err(usage(format!(
                    "--suite: {} is {} bytes; a suite file holds at most {MAX_SUITE_BYTES}",
                    path.display(),
                    meta.len()
                )));
            }
            req.suite_toml = std::fs::read_to_string(path)
                .map_err(|e| usage(format!("--suite: cannot read {}: {e}", path.display())))?;
            SuiteDef::parse(&req.suite_toml).map_err(|e| {
                usage(format!(
                    "--suite {}: {}: {}",
                    path.display(),
                    e.field,
                    e.message
                ))
            })?;
        } else if !LEVELS.contains(&req.level.as_str()) {
            return Err(usage(format!(
                "--level: `{}` is not a level; pick {} or give --suite FILE",
                self.level,
                LEVELS.join(", ")
            )));
        }
        if let Some(d) = &self.duration {
            req.duration_ms = parse_duration_flag("--duration", d)?;
        }
        if let Some(path) = &self.rules {
            req.rules = read_rules(path)?;
        }
        if self.require_cert && !self.actions().any() {
            return Err(usage(
                "--require-cert: give --drain or --kubernetes too; it decides which nodes they let back in"
                    .into(),
            ));
        }
        if self.dry_run && !self.actions().any() {
            return Err(usage(
                "--dry-run: give --drain or --kubernetes too; it prints what they would change"
                    .into(),
            ));
        }
        Ok(req)
    }

    /// What the verdicts should do once the suite ends.
    pub fn actions(&self) -> Actions {
        Actions {
            drain: self.drain,
            kubernetes: self.kubernetes,
            dry_run: self.dry_run,
            require_cert: self.require_cert,
        }
    }
}

/// How often the suite is looked at.
const POLL: Duration = Duration::from_secs(1);

pub async fn run(
    c: &mut Coordinator,
    req: pb::SubmitSuiteRequest,
    actions: Actions,
    out: OutputFormat,
    clock: &Clock,
) -> Result<Exit> {
    let mut suite = c.submit_suite(req).await?;
    eprintln!(
        "{}: {} on {} nodes, {} stages, about {}",
        suite.id,
        suite.level,
        suite.nodes.len(),
        suite.stages.len(),
        output::fmt_duration_opt(Some(suite.estimate_ms))
    );
    let tty = std::io::stderr().is_terminal();
    let mut said = String::new();
    while !suite.state().is_terminal() {
        tokio::time::sleep(POLL).await;
        suite = c.suite(&suite.id).await?;
        let line = progress(&suite, clock.now_ms());
        if tty {
            eprint!("\r\x1b[2K{line}");
            let _ = std::io::stderr().flush();
        } else if stage_of(&line) != stage_of(&said) {
            eprintln!("{line}");
        }
        said = line;
    }
    if tty {
        eprintln!();
    }
    let mut reports = Vec::new();
    for s in &suite.stages {
        let report = match s.job_id.as_str() {
            "" => None,
            id => Some(c.report(id).await?),
        };
        reports.push(report);
    }
    match out {
        OutputFormat::Json => output::print_json(&to_json(&suite, &reports)),
        _ => output::print_text(&render(&suite, &reports)),
    }
    // After the report, and whatever the scheduler says: same verdict, same exit.
    let stage_reports: Vec<pb::Report> = reports.iter().flatten().cloned().collect();
    // The gate changes what the actions see, never the verdict or the exit.
    let acted = if actions.require_cert {
        crate::actions::require_cert::gate(c, &suite, clock.now_ms()).await
    } else {
        suite.clone()
    };
    crate::actions::act(&acted, &stage_reports, actions).await;
    Ok(exit_of(&suite))
}

/// Exit 0 only when every node passed every stage (a warning passes).
pub fn exit_of(suite: &pb::Suite) -> Exit {
    let all_passed = !suite.verdicts.is_empty()
        && suite
            .verdicts
            .iter()
            .all(|n| matches!(n.verdict(), pb::Verdict::Pass | pb::Verdict::Warn));
    Exit::failed_if(suite.state() != pb::JobState::Succeeded || !all_passed)
}

/// The stage part of a progress line, to print a line per stage when not
/// on a terminal.
fn stage_of(line: &str) -> &str {
    line.split(',').next().unwrap_or("")
}

/// `acc-000001 quick: stage 2/4 stress (job-000012), 4 of 4 nodes in, about 1m 30s left`.
pub fn progress(suite: &pb::Suite, now: u64) -> String {
    let n = suite.stages.len();
    let i = (suite.current as usize).min(n);
    let stage = suite
        .stages
        .get(i)
        .map(|s| {
            let job = if s.job_id.is_empty() {
                String::new()
            } else {
                format!(" ({})", s.job_id)
            };
            format!("stage {}/{n} {}{job}", i + 1, s.name)
        })
        .unwrap_or_else(|| "finishing".into());
    let still_in = suite
        .verdicts
        .iter()
        .filter(|v| !matches!(v.verdict(), pb::Verdict::Fail | pb::Verdict::Incomplete))
        .count();
    let spent = now.saturating_sub(suite.created_unix_ms);
    let left = suite.estimate_ms.saturating_sub(spent);
    format!(
        "{} {}: {stage}, {still_in} of {} nodes in, about {} left",
        suite.id,
        suite.level,
        suite.verdicts.len(),
        output::fmt_duration_opt(Some(left))
    )
}

/// The suite's verdict line: PASS only when every node passed.
fn headline(suite: &pb::Suite) -> String {
    let failed: Vec<String> = suite
        .verdicts
        .iter()
        .filter(|n| matches!(n.verdict(), pb::Verdict::Fail | pb::Verdict::Incomplete))
        .map(|n| format!("{} at {}", n.node, output::dash(&n.stage)))
        .collect();
    let n = suite.verdicts.len();
    if suite.state() == pb::JobState::Cancelled {
        return format!("VERDICT: CANCELLED ({})", suite.message);
    }
    if failed.is_empty() && suite.state() == pb::JobState::Succeeded {
        let warned = suite
            .verdicts
            .iter()
            .filter(|v| v.verdict() == pb::Verdict::Warn)
            .count();
        return if warned > 0 {
            format!(
                "VERDICT: PASS — all {n} nodes accepted at {} ({warned} with warnings)",
                suite.level
            )
        } else {
            format!("VERDICT: PASS — all {n} nodes accepted at {}", suite.level)
        };
    }
    if failed.is_empty() {
        return format!("VERDICT: FAIL — {}", suite.message);
    }
    format!(
        "VERDICT: FAIL — {} of {n} nodes not accepted at {}: {}",
        failed.len(),
        suite.level,
        failed.join(", ")
    )
}

pub fn render(suite: &pb::Suite, reports: &[Option<pb::Report>]) -> String {
    let mut out = String::new();
    out += &headline(suite);
    out += "\n\nNODES\n";
    let mut t = Table::new(&["NODE", "VERDICT", "FAILED AT", "REASON"]);
    for n in &suite.verdicts {
        t.row([
            n.node.clone(),
            n.verdict().label().to_string(),
            output::dash(&n.stage),
            output::truncate(&output::dash(&n.reason), 90),
        ]);
    }
    out += &t.render();
    out += "\nSTAGES\n";
    let mut t = Table::new(&["STAGE", "WORKLOAD", "JOB", "STATE", "NODES", "TIME", "NOTE"]);
    for s in &suite.stages {
        let time = (s.finished_unix_ms > 0 && s.started_unix_ms > 0)
            .then(|| s.finished_unix_ms.saturating_sub(s.started_unix_ms));
        t.row([
            s.name.clone(),
            s.workload.clone(),
            output::dash(&s.job_id),
            s.state().label().to_string(),
            s.nodes.len().to_string(),
            output::fmt_duration_opt(time),
            output::dash(&s.note),
        ]);
    }
    out += &t.render();
    for (s, r) in suite.stages.iter().zip(reports) {
        if let Some(r) = r {
            out += &format!("\n── stage {} ({}) ──\n", s.name, s.job_id);
            out += &output::report::render(r);
        }
    }
    out += "\n";
    out += &headline(suite);
    out += "\n";
    out
}

pub fn to_json(suite: &pb::Suite, reports: &[Option<pb::Report>]) -> serde_json::Value {
    let verdict = if exit_of(suite) == Exit::Ok {
        "pass"
    } else {
        "fail"
    };
    json!({
        "suite": suite.id,
        "level": suite.level,
        "state": suite.state().label(),
        "verdict": verdict,
        "message": suite.message,
        "created_unix_ms": suite.created_unix_ms,
        "finished_unix_ms": suite.finished_unix_ms,
        "nodes": suite.verdicts.iter().map(|n| json!({
            "name": n.node,
            "verdict": n.verdict().label(),
            "stage": n.stage,
            "reason": n.reason,
        })).collect::<Vec<_>>(),
        "stages": suite.stages.iter().zip(reports).map(|(s, r)| json!({
            "name": s.name,
            "workload": s.workload,
            "job_id": s.job_id,
            "state": s.state().label(),
            "nodes": s.nodes,
            "started_unix_ms": s.started_unix_ms,
            "finished_unix_ms": s.finished_unix_ms,
            "note": s.note,
            "report": r.as_ref().map(output::json::report),
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn suite(verdicts: &[(&str, pb::Verdict, &str)], state: pb::JobState) -> pb::Suite {
        pb::Suite {
            id: "acc-000001".into(),
            level: "quick".into(),
            state: state as i32,
            verdicts: verdicts
                .iter()
                .map(|(n, v, stage)| pb::SuiteNode {
                    node: n.to_string(),
                    verdict: *v as i32,
                    stage: stage.to_string(),
                    reason: if stage.is_empty() {
                        String::new()
                    } else {
                        "rank 0 failed".into()
                    },
                })
                .collect(),
            stages: vec![pb::SuiteStage {
                name: "stress".into(),
                workload: "stress".into(),
                job_id: "job-000001".into(),
                state: pb::JobState::Failed as i32,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_failed_node_leads_and_ends_the_report_and_fails_the_exit() {
        let s = suite(
            &[
                ("a", pb::Verdict::Pass, ""),
                ("b", pb::Verdict::Fail, "stress"),
            ],
            pb::JobState::Failed,
        );
        let text = render(&s, &[None]);
        let first = text.lines().next().unwrap();
        assert!(first.starts_with("VERDICT: FAIL"), "{text}");
        assert!(first.contains("b at stress"), "{first}");
        assert_eq!(text.trim_end().lines().last().unwrap(), first);
        assert_eq!(exit_of(&s), Exit::Failed);
        let j = to_json(&s, &[None]);
        assert_eq!(j["verdict"], "fail");
        assert_eq!(j["nodes"][1]["stage"], "stress");
    }

    #[test]
    fn every_node_passing_is_the_only_success() {
        let ok = suite(
            &[("a", pb::Verdict::Pass, ""), ("b", pb::Verdict::Warn, "")],
            pb::JobState::Succeeded,
        );
        assert_eq!(exit_of(&ok), Exit::Ok);
        assert!(render(&ok, &[None]).starts_with("VERDICT: PASS"));
        let cancelled = suite(&[("a", pb::Verdict::Pass, "")], pb::JobState::Cancelled);
        assert_eq!(exit_of(&cancelled), Exit::Failed);
        assert!(
            progress(&ok, 0).contains("2 of 2 nodes in"),
            "{}",
            progress(&ok, 0)
        );
    }

    #[test]
    fn bad_input_is_refused_before_sending() {
        let args = |level: &str, nodes: &str| AcceptArgs {
            nodes: nodes.into(),
            level: level.into(),
            suite: None,
            duration: None,
            selectors: Vec::new(),
            rules: None,
            exclusive: false,
            drain: false,
            kubernetes: false,
            dry_run: false,
            require_cert: false,
        };
        let e = args("fast", "all").to_request().unwrap_err();
        assert!(
            e.0.contains("--level") && e.0.contains("quick, standard, burn-in"),
            "{}",
            e.0
        );
        let e = args("quick", "0").to_request().unwrap_err();
        assert!(e.0.contains("--nodes"), "{}", e.0);
        let mut a = args("quick", "all");
        a.duration = Some("soon".into());
        assert!(a.to_request().unwrap_err().0.contains("--duration"));
        let mut a = args("quick", "all");
        a.dry_run = true;
        assert!(a.to_request().unwrap_err().0.contains("--dry-run"));
        let req = args("standard", "3").to_request().unwrap();
        assert_eq!(
            (req.node_count, req.all_nodes, req.level.as_str()),
            (3, false, "standard")
        );
    }
}

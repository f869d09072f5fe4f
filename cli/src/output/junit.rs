//! A report as JUnit XML, the format CI systems and test dashboards read: one
//! test suite for the job, a test case for the job as a whole, one per node
//! and one per rank (GPU). A failed node or rank carries a `<failure>` whose
//! message is its reason and whose text is its findings' sentences; a rank
//! that never reported is an `<error>`; a warning passes with the sentences in
//! `<system-out>`, so a dashboard shows it without turning red.

use anyhow::Result;
use gpuctl_proto::pb;
use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};

use crate::output::report::ranks::{rank_reason, ranks_in_order};

/// The sentences a person reads, one a line.
fn sentences<'a>(findings: impl Iterator<Item = &'a pb::Finding>) -> String {
    let mut s = String::new();
    for f in findings {
        let text = if f.detail.is_empty() {
            &f.rule
        } else {
            &f.detail
        };
        s.push_str(&format!("{}: {text}\n", crate::output::findings::level(f)));
    }
    s
}

fn case(
    name: String,
    classname: &str,
    verdict: pb::Verdict,
    reason: &str,
    findings: String,
) -> TestCase {
    let kind = match verdict {
        pb::Verdict::Fail => Some(NonSuccessKind::Failure),
        pb::Verdict::Incomplete => Some(NonSuccessKind::Error),
        _ => None,
    };
    let status = match kind {
        Some(kind) => {
            let mut st = TestCaseStatus::non_success(kind);
            st.set_message(if reason.is_empty() {
                verdict.label()
            } else {
                reason
            });
            st.set_type(verdict.label());
            if !findings.is_empty() {
                st.set_description(findings.clone());
            }
            st
        }
        None => TestCaseStatus::success(),
    };
    let mut c = TestCase::new(name, status);
    c.set_classname(classname);
    if kind.is_none() && !findings.is_empty() {
        c.set_system_out(findings);
    }
    c
}

pub fn report(r: &pb::Report) -> Result<String> {
    let class = format!("gpuctl.{}", r.workload);
    let mut suite = TestSuite::new(format!("{} {}", r.job_id, r.workload));
    suite.set_time(std::time::Duration::from_millis(r.duration_ms));
    // Findings of the job as a whole (no node): a dashboard needs somewhere to show them.
    let job = sentences(r.findings.iter().filter(|f| f.node.is_empty()));
    suite.add_test_case(case(
        format!("job {}", r.job_id),
        &class,
        r.verdict(),
        &r.reason,
        job,
    ));
    for n in &r.nodes {
        let mine = sentences(r.findings.iter().filter(|f| f.node == n.name));
        suite.add_test_case(case(
            format!("node {}", n.name),
            &class,
            n.verdict(),
            &n.reason,
            mine,
        ));
    }
    for (node, rank) in ranks_in_order(r) {
        let mine = sentences(r.findings.iter().filter(|f| f.rank == Some(rank.rank)));
        let reason = rank_reason(rank);
        let device = if rank.device.is_empty() {
            String::new()
        } else {
            format!(" {}", rank.device)
        };
        suite.add_test_case(case(
            format!("rank {} ({node}{device})", rank.rank),
            &format!("{class}.{node}"),
            rank.verdict(),
            &reason,
            mine,
        ));
    }
    let mut out = Report::new(format!("gpuctl {}", r.job_id));
    out.add_test_suite(suite);
    Ok(out.to_string()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_rank_is_a_failure_with_its_reason() {
        let r = crate::output::fixtures::stress_report();
        let xml = report(&r).unwrap();
        assert!(xml.contains("<testsuite name=\""), "{xml}");
        assert!(xml.contains("<failure"), "{xml}");
        let cases = xml.matches("<testcase ").count();
        let ranks: usize = r.nodes.iter().map(|n| n.ranks.len()).sum();
        assert_eq!(cases, 1 + r.nodes.len() + ranks, "{xml}");
    }
}

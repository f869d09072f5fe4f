//! The job's preflight checks: the plan's, each node's replaced by what its
//! agent found at start, each with the phase that made it.

use gpuctl_proto::pb::{Job, Plan, PreflightCheck, Verdict};

use super::*;

fn check(node: &str, name: &str, verdict: Verdict) -> PreflightCheck {
    PreflightCheck {
        node: node.into(),
        name: name.into(),
        verdict: verdict as i32,
        detail: format!("{name} on {node}"),
        fix: "do this".into(),
    }
}

#[test]
fn a_nodes_start_checks_replace_its_plan_checks() {
    let job = Job {
        plan: Some(Plan {
            checks: vec![
                check("n0", "shm", Verdict::Fail),
                check("n1", "shm", Verdict::Pass),
                check("", "gpu-models", Verdict::Warn),
            ],
            ..Default::default()
        }),
        start_checks: vec![check("n0", "driver", Verdict::Pass)],
        ..Default::default()
    };
    let got: Vec<(String, String, Level, Phase)> = checks(&job)
        .into_iter()
        .map(|c| (c.node, c.rule, c.level, c.phase))
        .collect();
    let want = |n: &str, r: &str, l, p| (n.to_string(), r.to_string(), l, p);
    assert_eq!(
        got,
        vec![
            want("n1", "shm", Level::Pass, Phase::Plan),
            want("", "gpu-models", Level::Warn, Phase::Plan),
            want("n0", "driver", Level::Pass, Phase::Start),
        ]
    );
    assert_eq!(of_job(&job).len(), 3);
}

#[test]
fn the_wire_shape_round_trips() {
    for v in [
        Verdict::Pass,
        Verdict::Warn,
        Verdict::Fail,
        Verdict::Unspecified,
    ] {
        let c = check("n0", "shm", v);
        assert_eq!(wire(&check_of(&c)), c);
    }
}

fn check_of(c: &PreflightCheck) -> Check {
    super::check(c, Phase::Plan)
}

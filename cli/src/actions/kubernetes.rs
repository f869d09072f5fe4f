//! The Kubernetes effector of `gpuctl accept --kubernetes`: turns each
//! [`decide::KubeStep`] into `kubectl label` and `kubectl taint` commands on
//! the node of the same name, and runs them (or prints them, dry run).
//!
//! Why kubectl rather than a client crate: `kube` with `k8s-openapi` adds
//! several minutes to a cold build of this workspace on the 2-core CI machine
//! for three calls, while kubectl is already where a Kubernetes operator
//! works, brings their kubeconfig, context and RBAC as they are, and its
//! `label --overwrite` and `taint` merge into the node instead of replacing
//! its taint list (a JSON merge patch of `spec.taints` would drop other
//! people's taints). gpuctl touches only its own keys (`gpuctl.io/…`).
//! Not tested against a real API server here (none can run in CI); the
//! commands are unit-tested and documented in docs/operations.md.

use super::decide::{KubeStep, TAINT_KEY};

/// The kubectl commands of one step (none for [`KubeStep::Leave`]).
pub fn commands(step: &KubeStep) -> Vec<Vec<String>> {
    let KubeStep::Set {
        node,
        labels,
        taint,
    } = step
    else {
        return Vec::new();
    };
    let mut label = vec![
        "kubectl".to_string(),
        "label".into(),
        "node".into(),
        node.clone(),
        "--overwrite".into(),
    ];
    // An empty value removes the label (`key-`), so a pass leaves no stale stage.
    label.extend(labels.iter().map(|(k, v)| {
        if v.is_empty() {
            format!("{k}-")
        } else {
            format!("{k}={v}")
        }
    }));
    let taint = match taint {
        Some(value) => vec![
            "kubectl".into(),
            "taint".into(),
            "node".into(),
            node.clone(),
            "--overwrite".into(),
            format!("{TAINT_KEY}={value}:NoSchedule"),
        ],
        None => vec![
            "kubectl".into(),
            "taint".into(),
            "node".into(),
            node.clone(),
            format!("{TAINT_KEY}:NoSchedule-"),
        ],
    };
    vec![label, taint]
}

/// Whether a failed command failed only because there was nothing to remove
/// (kubectl refuses to remove a taint that is not there); a node that is not
/// there (`nodes "x" not found`) is a real failure.
pub fn nothing_to_remove(error: &str) -> bool {
    error.contains("taint \"") && error.contains("not found") && !error.contains("nodes \"")
}

#[cfg(test)]
mod tests {
    use super::super::shown;
    use super::*;

    #[test]
    fn a_failed_node_is_labelled_and_tainted_a_passed_one_untainted() {
        let fail = KubeStep::Set {
            node: "gpu-7".into(),
            labels: vec![
                ("gpuctl.io/acceptance".into(), "fail".into()),
                ("gpuctl.io/acceptance-stage".into(), "stress".into()),
            ],
            taint: Some("stress".into()),
        };
        let c: Vec<String> = commands(&fail).iter().map(|c| shown(c)).collect();
        assert_eq!(
            c,
            [
                "kubectl label node gpu-7 --overwrite gpuctl.io/acceptance=fail gpuctl.io/acceptance-stage=stress",
                "kubectl taint node gpu-7 --overwrite gpuctl.io/acceptance-failed=stress:NoSchedule",
            ]
        );
        let pass = KubeStep::Set {
            node: "gpu-7".into(),
            labels: vec![("gpuctl.io/acceptance-stage".into(), String::new())],
            taint: None,
        };
        let c: Vec<String> = commands(&pass).iter().map(|c| shown(c)).collect();
        assert_eq!(
            c,
            [
                "kubectl label node gpu-7 --overwrite gpuctl.io/acceptance-stage-",
                "kubectl taint node gpu-7 gpuctl.io/acceptance-failed:NoSchedule-",
            ]
        );
        assert!(nothing_to_remove(
            r#"`kubectl taint …` failed (exit status: 1): error: taint "gpuctl.io/acceptance-failed:NoSchedule" not found"#
        ));
        assert!(!nothing_to_remove(
            r#"`kubectl taint …` failed (exit status: 1): Error from server (NotFound): nodes "gpu-9" not found"#
        ));
        assert!(commands(&KubeStep::Leave {
            node: "x".into(),
            why: "".into()
        })
        .is_empty());
    }
}

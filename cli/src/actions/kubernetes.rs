//! The Kubernetes effector of `gpuctl accept --kubernetes`: each
//! [`decide::KubeStep`] becomes one merge patch of the node of the same name,
//! sent to the API server with the `kube` client (the operator's kubeconfig,
//! or the pod's service account inside a cluster).
//!
//! A node's taints are one list in the API: a merge patch replaces it whole.
//! So the patch is computed from the node as read, keeping every taint but
//! gpuctl's own key, and it carries the node's `resourceVersion`: the API
//! server refuses it (409) if anyone changed the node in between, and the
//! step is read and patched again. Labels merge key by key; `null` removes
//! one. gpuctl touches only its own keys (`gpuctl.io/…`).
//! Not tested against a real API server here (none can run in CI); the
//! patches are unit-tested and documented in docs/operations.md.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{json, Map, Value};

use super::decide::{KubeStep, TAINT_KEY};

/// The taint effect gpuctl puts on a failed node: nothing new is scheduled
/// there; pods already running stay.
const EFFECT: &str = "NoSchedule";

/// How often a step is read and patched again when someone else changed the
/// node in between.
const ATTEMPTS: u32 = 3;

/// One API call (connect, read or patch), bounded so a server that does not
/// answer cannot hold `accept` up.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The merge patch of one step on `node` as read: gpuctl's labels (an empty
/// value removes the label), the whole taint list with gpuctl's own taint put
/// on or taken off and everyone else's kept, and the version it was computed
/// from. `None` for [`KubeStep::Leave`].
pub fn patch(step: &KubeStep, node: &Node) -> Option<Value> {
    let KubeStep::Set { labels, taint, .. } = step else {
        return None;
    };
    let labels: Map<String, Value> = labels
        .iter()
        .map(|(k, v)| {
            let v = if v.is_empty() {
                Value::Null
            } else {
                Value::String(v.clone())
            };
            (k.clone(), v)
        })
        .collect();
    let mut taints: Vec<Value> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| t.key != TAINT_KEY)
        .map(|t| serde_json::to_value(t).unwrap_or(Value::Null))
        .collect();
    if let Some(value) = taint {
        taints.push(json!({"key": TAINT_KEY, "value": value, "effect": EFFECT}));
    }
    Some(json!({
        "metadata": {
            "labels": labels,
            "resourceVersion": node.metadata.resource_version,
        },
        "spec": {"taints": taints},
    }))
}

/// What a step changes, as a person reads it (dry run and the line after
/// each patch).
pub fn describe(step: &KubeStep) -> String {
    let KubeStep::Set { labels, taint, .. } = step else {
        return String::new();
    };
    let labels: Vec<String> = labels
        .iter()
        .map(|(k, v)| {
            if v.is_empty() {
                format!("{k}-")
            } else {
                format!("{k}={v}")
            }
        })
        .collect();
    let taint = match taint {
        Some(v) => format!("taint {TAINT_KEY}={v}:{EFFECT}"),
        None => format!("untaint {TAINT_KEY}:{EFFECT}"),
    };
    format!("label {}; {taint}", labels.join(" "))
}

/// A client for the cluster the operator's kubeconfig (or the pod's service
/// account) points at.
pub async fn client() -> Result<kube::Client, String> {
    match tokio::time::timeout(CALL_TIMEOUT, kube::Client::try_default()).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(format!(
            "no Kubernetes API to talk to (kubeconfig via KUBECONFIG or ~/.kube/config, or in-cluster): {e}"
        )),
        Err(_) => Err(format!(
            "the Kubernetes client did not start within {}s",
            CALL_TIMEOUT.as_secs()
        )),
    }
}

/// Reads `node`, patches it, and reads again when the node changed in
/// between; an error names the call and what the API server said.
pub async fn apply(client: &kube::Client, step: &KubeStep) -> Result<(), String> {
    let KubeStep::Set { node: name, .. } = step else {
        return Ok(());
    };
    let nodes: Api<Node> = Api::all(client.clone());
    for attempt in 1..=ATTEMPTS {
        let node = bounded(nodes.get(name))
            .await
            .map_err(|e| format!("reading node {name} failed: {}", e.text))?;
        let Some(body) = patch(step, &node) else {
            return Ok(());
        };
        match bounded(nodes.patch(name, &PatchParams::default(), &Patch::Merge(&body))).await {
            Ok(_) => return Ok(()),
            // The node changed since it was read: read it again.
            Err(e) if e.code == Some(409) && attempt < ATTEMPTS => continue,
            Err(e) => return Err(format!("patching node {name} failed: {}", e.text)),
        }
    }
    Err(format!(
        "node {name} changed under every one of {ATTEMPTS} patches"
    ))
}

/// A failed API call: the API server's status code when it answered, and
/// what to tell the operator.
struct CallError {
    code: Option<u16>,
    text: String,
}

async fn bounded<T>(
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, CallError> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(kube::Error::Api(s))) => Err(CallError {
            code: Some(s.code),
            text: format!("{} {}: {}", s.code, s.reason, s.message),
        }),
        Ok(Err(e)) => Err(CallError {
            code: None,
            text: e.to_string(),
        }),
        Err(_) => Err(CallError {
            code: None,
            text: format!("no answer within {}s", CALL_TIMEOUT.as_secs()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(taints: Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "gpu-7", "resourceVersion": "41", "labels": {"zone": "a"}},
            "spec": {"taints": taints},
        }))
        .expect("a node")
    }

    #[test]
    fn a_failed_node_is_labelled_and_tainted_keeping_other_taints() {
        let fail = KubeStep::Set {
            node: "gpu-7".into(),
            labels: vec![
                ("gpuctl.io/acceptance".into(), "fail".into()),
                ("gpuctl.io/acceptance-stage".into(), "stress".into()),
            ],
            taint: Some("stress".into()),
        };
        let theirs = json!({"key": "maintenance", "value": "disk", "effect": "NoExecute"});
        let p = patch(&fail, &node(json!([theirs]))).expect("a patch");
        assert_eq!(
            p,
            json!({
                "metadata": {
                    "labels": {"gpuctl.io/acceptance": "fail", "gpuctl.io/acceptance-stage": "stress"},
                    "resourceVersion": "41",
                },
                "spec": {"taints": [
                    theirs,
                    {"key": TAINT_KEY, "value": "stress", "effect": "NoSchedule"},
                ]},
            })
        );
        assert_eq!(
            describe(&fail),
            "label gpuctl.io/acceptance=fail gpuctl.io/acceptance-stage=stress; taint gpuctl.io/acceptance-failed=stress:NoSchedule"
        );
    }

    #[test]
    fn a_passed_node_loses_only_gpuctls_taint_and_stage_label() {
        let pass = KubeStep::Set {
            node: "gpu-7".into(),
            labels: vec![
                ("gpuctl.io/acceptance".into(), "pass".into()),
                ("gpuctl.io/acceptance-stage".into(), String::new()),
            ],
            taint: None,
        };
        let theirs = json!({"key": "maintenance", "effect": "NoSchedule"});
        let ours = json!({"key": TAINT_KEY, "value": "nccl", "effect": "NoSchedule"});
        let p = patch(&pass, &node(json!([ours, theirs]))).expect("a patch");
        assert_eq!(p["spec"]["taints"], json!([theirs]));
        assert_eq!(
            p["metadata"]["labels"],
            json!({"gpuctl.io/acceptance": "pass", "gpuctl.io/acceptance-stage": null})
        );
        // A node with no taints at all gets an empty list, not a missing one.
        let p = patch(&pass, &node(Value::Null)).expect("a patch");
        assert_eq!(p["spec"]["taints"], json!([]));
        let leave = KubeStep::Leave {
            node: "x".into(),
            why: String::new(),
        };
        assert!(patch(&leave, &node(Value::Null)).is_none());
    }
}

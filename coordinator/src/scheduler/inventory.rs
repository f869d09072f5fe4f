//! What a node is, compared with what it said it was: a registration that
//! offers other GPUs (or another count of CPU ranks) than the node's last
//! one is a finding, not silently taken. A node under test is not trusted,
//! and a GPU swapped or gone since acceptance means the acceptance no
//! longer describes the node (issue 46).

use gpuctl_proto::pb::{Acceptance, Node, RegisterRequest, Verdict};

/// Names shown of the GPUs that went or came.
const SHOWN: usize = 4;

/// Why `req` describes another node than `before` did, if it does.
pub fn change(before: &Node, req: &RegisterRequest) -> Option<String> {
    // The first registration of this name: nothing to compare with.
    if before.gpus.is_empty() && before.facts.is_none() {
        return None;
    }
    let uuids = |g: &[gpuctl_proto::pb::GpuInfo]| {
        let mut v: Vec<String> = g.iter().map(|g| g.uuid.to_ascii_lowercase()).collect();
        v.sort();
        v
    };
    let (was, now) = (uuids(&before.gpus), uuids(&req.gpus));
    if was != now {
        let gone: Vec<&String> = was.iter().filter(|u| !now.contains(u)).collect();
        let new: Vec<&String> = now.iter().filter(|u| !was.contains(u)).collect();
        return Some(format!(
            "its GPUs changed since its last registration: {} → {} (gone: {}; new: {})",
            was.len(),
            now.len(),
            names(&gone),
            names(&new)
        ));
    }
    let ranks = |f: Option<&gpuctl_proto::pb::HostFacts>| f.map_or(0, |f| f.cpu_ranks);
    let (was, now) = (ranks(before.facts.as_ref()), ranks(req.facts.as_ref()));
    if before.gpus.is_empty() && was != now {
        return Some(format!(
            "its CPU ranks changed since its last registration: {was} → {now}"
        ));
    }
    None
}

fn names(uuids: &[&String]) -> String {
    if uuids.is_empty() {
        return "none".into();
    }
    gpuctl_core::listing::some(uuids, SHOWN, ", ")
}

/// The node's acceptance state once its inventory changed: a warning that
/// says what changed and asks for a new acceptance.
pub fn finding(node: &str, why: &str, now_ms: u64) -> Acceptance {
    Acceptance {
        node: node.to_string(),
        verdict: Verdict::Warn as i32,
        stage: "registration".into(),
        reason: format!(
            "{why}; its last acceptance no longer describes it: run `gpuctl accept --nodes {node}`"
        ),
        finished_unix_ms: now_ms,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb::{GpuInfo, HostFacts};

    fn gpus(ids: &[&str]) -> Vec<GpuInfo> {
        ids.iter()
            .map(|u| GpuInfo {
                uuid: u.to_string(),
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn a_gpu_swapped_or_added_is_named_and_the_same_gpus_are_not() {
        let before = Node {
            gpus: gpus(&["GPU-a", "GPU-b"]),
            ..Default::default()
        };
        let same = RegisterRequest {
            gpus: gpus(&["gpu-B", "GPU-a"]),
            ..Default::default()
        };
        assert_eq!(change(&before, &same), None);
        let swapped = RegisterRequest {
            gpus: gpus(&["GPU-a", "GPU-c"]),
            ..Default::default()
        };
        let why = change(&before, &swapped).unwrap();
        assert!(why.contains("2 → 2 (gone: gpu-b; new: gpu-c)"), "{why}");
        let many = RegisterRequest {
            gpus: gpus(
                &(0..64)
                    .map(|i| format!("GPU-{i}"))
                    .collect::<Vec<_>>()
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>(),
            ),
            ..Default::default()
        };
        let why = change(&before, &many).unwrap();
        assert!(why.contains("2 → 64"), "{why}");
        assert!(why.contains("and 60 more"), "{why}");
    }

    #[test]
    fn first_registrations_and_cpu_nodes() {
        let req = RegisterRequest {
            gpus: gpus(&["GPU-a"]),
            ..Default::default()
        };
        assert_eq!(change(&Node::default(), &req), None);
        let cpu = |n| HostFacts {
            cpu_ranks: n,
            ..Default::default()
        };
        let before = Node {
            facts: Some(cpu(2)),
            ..Default::default()
        };
        let more = RegisterRequest {
            facts: Some(cpu(64)),
            ..Default::default()
        };
        assert!(change(&before, &more).unwrap().contains("2 → 64"));
    }
}

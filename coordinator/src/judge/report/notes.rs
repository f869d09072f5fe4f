//! What the ranks say about the libraries they ran with: the NCCL version for
//! the report's header, and a note when ranks ran different libtorch
//! versions (their numbers then do not compare like for like).

use std::collections::BTreeMap;

use gpuctl_proto::pb::RankResult;

/// The first NCCL version any rank reported.
pub(super) fn nccl_version(results: &BTreeMap<u32, RankResult>) -> String {
    results
        .values()
        .map(|r| r.nccl_version.clone())
        .find(|v| !v.is_empty())
        .unwrap_or_default()
}

/// A note naming the libtorch versions when ranks differ.
pub(super) fn mixed_torch(results: &BTreeMap<u32, RankResult>) -> Option<String> {
    let mut torch: Vec<&str> = results
        .values()
        .map(|r| r.torch_version.as_str())
        .filter(|v| !v.is_empty())
        .collect();
    torch.sort();
    torch.dedup();
    (torch.len() > 1).then(|| {
        format!(
            "ranks ran different libtorch versions: {}",
            torch.join(", ")
        )
    })
}

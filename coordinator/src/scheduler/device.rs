//! A result's device facts come from the plan, never from the result: a
//! CPU rank once claimed `cuda:0`, "NVIDIA B200" and 999 TFLOP/s and passed,
//! since the plausibility cap and the floors read the device the result
//! named (issue 46). What the plan says of the rank replaces what the
//! result says; a result that names another kind of device, another GPU or
//! another node is refused, naming both.

use gpuctl_proto::pb::{RankPlacement, RankResult};

/// Sets `result`'s node, device, device name and GPU UUID to `planned`'s;
/// why not, when the result says it ran somewhere else.
///
/// The device label is compared by kind only (`cpu` or `cuda`): a worker
/// that sees one GPU (`CUDA_VISIBLE_DEVICES=N`) calls it `cuda:0`. The name
/// is not compared: CUDA and NVML may spell one model differently, and the
/// planned one (read by the agent through NVML) is what floors are keyed by.
pub fn from_plan(result: &mut RankResult, planned: &RankPlacement) -> Result<(), String> {
    let label = planned.device_label();
    let kind = |d: &str| if d.starts_with("cpu") { "cpu" } else { "cuda" };
    let who = format!("rank {} of {}", result.rank, result.job_id);
    if !result.node.is_empty() && result.node != planned.node {
        return Err(format!(
            "{who} is planned on node {}, its result says node {}: refused",
            planned.node, result.node
        ));
    }
    if !result.device.is_empty() && kind(&result.device) != kind(&label) {
        return Err(format!(
            "{who} is planned on {label} of node {}, its result says {}: refused",
            planned.node, result.device
        ));
    }
    let uuid = &planned.gpu_uuid;
    if !result.gpu_uuid.is_empty() && !result.gpu_uuid.eq_ignore_ascii_case(uuid) {
        let planned_uuid = if uuid.is_empty() { "no GPU" } else { uuid };
        return Err(format!(
            "{who} is planned on {planned_uuid} of node {}, its result says GPU {}: refused",
            planned.node, result.gpu_uuid
        ));
    }
    result.node = planned.node.clone();
    result.device = label;
    result.device_name = planned.device_name.clone();
    result.gpu_uuid = planned.gpu_uuid.clone();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu_rank() -> RankPlacement {
        RankPlacement {
            rank: 1,
            node: "a".into(),
            device_name: "Xeon".into(),
            ..Default::default()
        }
    }

    fn gpu_rank() -> RankPlacement {
        RankPlacement {
            rank: 3,
            node: "a".into(),
            gpu_index: Some(3),
            gpu_uuid: "GPU-abc".into(),
            device_name: "NVIDIA H200".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_cpu_rank_cannot_claim_a_gpu_and_its_name_comes_from_the_plan() {
        let mut r = RankResult {
            job_id: "j".into(),
            rank: 1,
            device: "cuda:0".into(),
            device_name: "NVIDIA B200".into(),
            ..Default::default()
        };
        let e = from_plan(&mut r, &cpu_rank()).unwrap_err();
        assert!(e.contains("planned on cpu of node a"), "{e}");
        assert!(e.contains("says cuda:0"), "{e}");

        // Only the name forged: replaced by the plan's.
        let mut r = RankResult {
            device: "cpu".into(),
            device_name: "NVIDIA B200".into(),
            ..Default::default()
        };
        from_plan(&mut r, &cpu_rank()).unwrap();
        assert_eq!((r.device.as_str(), r.device_name.as_str()), ("cpu", "Xeon"));
        assert_eq!(r.node, "a");
    }

    #[test]
    fn a_gpu_rank_keeps_the_planned_gpu_and_refuses_another() {
        // One visible GPU is cuda:0 to the worker; the UUID may differ in case.
        let mut r = RankResult {
            device: "cuda:0".into(),
            device_name: "NVIDIA H200 141GB".into(),
            gpu_uuid: "gpu-ABC".into(),
            ..Default::default()
        };
        from_plan(&mut r, &gpu_rank()).unwrap();
        assert_eq!(r.device, "cuda:3");
        assert_eq!(r.device_name, "NVIDIA H200");
        assert_eq!(r.gpu_uuid, "GPU-abc");

        let mut other = RankResult {
            gpu_uuid: "GPU-def".into(),
            ..Default::default()
        };
        assert!(from_plan(&mut other, &gpu_rank())
            .unwrap_err()
            .contains("says GPU GPU-def"));
        let mut elsewhere = RankResult {
            node: "c".into(),
            ..Default::default()
        };
        assert!(from_plan(&mut elsewhere, &gpu_rank())
            .unwrap_err()
            .contains("says node c"));
        // An empty result takes everything from the plan.
        let mut empty = RankResult::default();
        from_plan(&mut empty, &gpu_rank()).unwrap();
        assert_eq!(empty.device, "cuda:3");
    }
}

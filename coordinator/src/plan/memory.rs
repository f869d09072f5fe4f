//! Sizes a host cannot hold, refused at plan time: a stress matrix or an
//! nccl message that cannot fit in a GPU's memory (or, for CPU ranks, in the
//! host's memory shared by its ranks) would only fail minutes later with an
//! out-of-memory on every rank, or swap a CPU host to a halt.
//!
//! The figures are what the worker allocates, rounded up: they refuse what
//! certainly cannot fit, not what might be tight.

use std::collections::HashMap;

use gpuctl_proto::catalogue::typed::TypedParams;
use gpuctl_proto::pb::{JobSpec, Node, PreflightCheck, RankPlacement, Verdict};
use gpuctl_proto::units::format_bytes;

use super::check;

pub const MEMORY_CHECK: &str = "memory_fit";

/// A rank's memory: on its device (the GPU, or the host for a CPU rank) and on
/// the host besides (inputs built on the CPU before they are copied).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Need {
    device: u64,
    host: u64,
    what: String,
}

/// What one rank of `spec` allocates; `None` for workloads whose memory is
/// not a size the user picked (maxbatch searches). Training counts its
/// parameters' buffers only (activations hang on too much to guess), for the
/// model of the list that needs most.
fn need(spec: &JobSpec, gpu: bool) -> Option<Need> {
    let params = TypedParams::build(&spec.workload, &spec.params, gpu).ok()?;
    match params {
        TypedParams::Stress(p) => {
            let n2 = p.size.saturating_mul(p.size);
            let elem = match p.precision.as_str() {
                "fp64" => 8,
                "fp32" | "tf32" => 4,
                _ => 2,
            };
            // A, B, the first product, the product being checked: four
            // matrices of the chosen type, after two fp32 inputs on the CPU.
            Some(Need {
                device: n2.saturating_mul(4 * elem),
                host: n2.saturating_mul(8),
                what: "stress --size".into(),
            })
        }
        TypedParams::Nccl(p) => Some(Need {
            // A send and a receive buffer of max_bytes, and the expected
            // values the check builds (index tensors as wide as the data).
            device: p.max_bytes.saturating_mul(3),
            host: 0,
            what: "nccl --max-bytes".into(),
        }),
        TypedParams::Ddp(t) => train_need(&t, &spec.workload, false),
        TypedParams::Fsdp(t) => train_need(&t, &spec.workload, true),
        TypedParams::MaxBatch(_) => None,
    }
}

/// The flat buffers of the training loop per parameter, at least: compute
/// parameters and gradients in the compute type, and in ddp the fp32
/// momentum (fsdp shards it; its master copy may be the compute one).
fn train_need(
    t: &gpuctl_proto::catalogue::TrainParams,
    workload: &str,
    sharded: bool,
) -> Option<Need> {
    t.models
        .iter()
        .filter_map(|m| {
            let params = gpuctl_proto::catalogue::model_parameters(&m.model.model)?;
            let elem = if m.model.precision == "fp32" { 4 } else { 2 };
            let per_param = 2 * elem + if sharded { 0 } else { 4 };
            Some(Need {
                device: params.saturating_mul(per_param),
                host: 0,
                what: format!("{workload} --model {}", m.model.model),
            })
        })
        .max_by_key(|n| n.device)
}

/// A failed check for each node whose ranks cannot fit, with the numbers;
/// nothing for nodes that fit (the plan's check count stays the agents').
pub fn checks(spec: &JobSpec, nodes: &[&Node], ranks: &[RankPlacement]) -> Vec<PreflightCheck> {
    let mut out = Vec::new();
    let mut by_node: HashMap<&str, Vec<&RankPlacement>> = HashMap::new();
    for r in ranks {
        by_node.entry(r.node.as_str()).or_default().push(r);
    }
    // The spec's needs are the same on every node.
    let (gpu_need, cpu_need) = (need(spec, true), need(spec, false));
    for node in nodes {
        let Some(mine) = by_node.get(node.name.as_str()) else {
            continue;
        };
        let host_total = node.facts.as_ref().map_or(0, |f| f.memory_total_bytes);
        let gpu_ranks = mine.iter().filter(|r| r.gpu_index.is_some()).count() as u64;
        let cpu_ranks = mine.len() as u64 - gpu_ranks;
        let mut problems = Vec::new();
        let mut host_use = 0u64;
        if gpu_ranks > 0 {
            if let Some(n) = &gpu_need {
                host_use = host_use.saturating_add(n.host.saturating_mul(gpu_ranks));
                for r in mine.iter().filter(|r| r.gpu_index.is_some()) {
                    let total = node
                        .gpus
                        .iter()
                        .find(|g| Some(g.index) == r.gpu_index)
                        .map_or(0, |g| g.memory_total_bytes);
                    if total > 0 && n.device > total {
                        problems.push(format!(
                            "{} needs about {} on GPU {} ({}), which has {}",
                            n.what,
                            format_bytes(n.device),
                            r.gpu_index.unwrap_or_default(),
                            r.device_name,
                            format_bytes(total)
                        ));
                        break; // the GPUs of one node are alike; once is enough
                    }
                }
            }
        }
        let mut what = String::new();
        if cpu_ranks > 0 {
            if let Some(n) = &cpu_need {
                let per_rank = n.device.saturating_add(n.host);
                host_use = host_use.saturating_add(per_rank.saturating_mul(cpu_ranks));
                what = n.what.clone();
            }
        }
        if host_total > 0 && host_use > host_total {
            let what = if what.is_empty() {
                gpu_need
                    .as_ref()
                    .map_or_else(|| "the job".to_string(), |n| n.what.clone())
            } else {
                what
            };
            problems.push(format!(
                "{what} needs about {} of host memory for {} ranks, the host has {}",
                format_bytes(host_use),
                mine.len(),
                format_bytes(host_total)
            ));
        }
        if !problems.is_empty() {
            out.push(check(
                &node.name,
                MEMORY_CHECK,
                Verdict::Fail,
                problems.join("; "),
                "pick a smaller size (gpuctl submit ... --help lists the defaults per device)",
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb::{GpuInfo, HostFacts};

    fn node(name: &str, host_gib: u64, gpus: &[u64]) -> Node {
        Node {
            name: name.into(),
            facts: Some(HostFacts {
                memory_total_bytes: host_gib << 30,
                ..Default::default()
            }),
            gpus: gpus
                .iter()
                .enumerate()
                .map(|(i, gib)| GpuInfo {
                    index: i as u32,
                    name: "NVIDIA H200".into(),
                    memory_total_bytes: gib << 30,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn ranks(node: &str, n: u32, gpu: bool) -> Vec<RankPlacement> {
        (0..n)
            .map(|i| RankPlacement {
                rank: i,
                local_rank: i,
                node: node.into(),
                gpu_index: gpu.then_some(i),
                device_name: "NVIDIA H200".into(),
                ..Default::default()
            })
            .collect()
    }

    fn spec(workload: &str, params: &[(&str, &str)]) -> JobSpec {
        JobSpec {
            workload: workload.into(),
            params: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    fn verdicts(c: &[PreflightCheck]) -> Vec<Verdict> {
        c.iter().map(|c| c.verdict()).collect()
    }

    #[test]
    fn defaults_fit_and_what_cannot_fit_is_refused_with_numbers() {
        let cpu = node("cpu-a", 23, &[]);
        let r = ranks("cpu-a", 2, false);
        assert_eq!(verdicts(&checks(&spec("stress", &[]), &[&cpu], &r)), []);
        assert_eq!(verdicts(&checks(&spec("nccl", &[]), &[&cpu], &r)), []);
        let big = checks(&spec("nccl", &[("max_bytes", "1T")]), &[&cpu], &r);
        assert_eq!(verdicts(&big), [Verdict::Fail]);
        assert!(
            big[0].detail.contains("nccl --max-bytes"),
            "{}",
            big[0].detail
        );
        assert!(big[0].detail.contains("23 GiB"), "{}", big[0].detail);
        let huge = checks(&spec("stress", &[("size", "65536")]), &[&cpu], &r);
        assert_eq!(verdicts(&huge), [Verdict::Fail]);
        assert!(huge[0].detail.contains("2 ranks"), "{}", huge[0].detail);
    }

    #[test]
    fn gpu_ranks_are_held_to_their_gpu_memory() {
        let h200 = node("gpu-a", 2000, &[141, 141]);
        let r = ranks("gpu-a", 2, true);
        assert_eq!(
            verdicts(&checks(&spec("stress", &[("size", "16384")]), &[&h200], &r)),
            []
        );
        let c = checks(&spec("nccl", &[("max_bytes", "64G")]), &[&h200], &r);
        assert_eq!(verdicts(&c), [Verdict::Fail]);
        assert!(c[0].detail.contains("on GPU 0"), "{}", c[0].detail);
        // Training's parameters fit any GPU of today.
        assert_eq!(verdicts(&checks(&spec("ddp", &[]), &[&h200], &r)), []);
    }

    #[test]
    fn training_is_weighed_by_the_largest_model_of_its_list() {
        // resnet152 in fp32: 60M parameters × 12 bytes, about 689 MiB a rank.
        let small = node("cpu-a", 1, &[]);
        let r = ranks("cpu-a", 2, false);
        let ok = spec("ddp", &[("model", "cnn,mobilenet_v2")]);
        assert_eq!(verdicts(&checks(&ok, &[&small], &r)), []);
        let big = spec("ddp", &[("model", "cnn,resnet152,mobilenet_v2")]);
        let c = checks(&big, &[&small], &r);
        assert_eq!(verdicts(&c), [Verdict::Fail]);
        assert!(
            c[0].detail.contains("ddp --model resnet152"),
            "{}",
            c[0].detail
        );
        // fsdp keeps less a rank: the same list fits.
        let fsdp = spec("fsdp", &[("model", "cnn,resnet152,mobilenet_v2")]);
        assert_eq!(verdicts(&checks(&fsdp, &[&small], &r)), []);
    }
}

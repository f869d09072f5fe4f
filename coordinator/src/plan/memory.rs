//! Sizes a host cannot hold, refused at plan time: a stress matrix or an
//! nccl message that cannot fit in a GPU's memory (or, for CPU ranks, in the
//! host's memory shared by its ranks) would only fail minutes later with an
//! out-of-memory on every rank, or swap a CPU host to a halt.
//!
//! Training is weighed by its model's parameters (GPT's by `--gpt-size` and
//! `--seq-len`), sharded across the ranks for fsdp, and for GPT by its
//! activations at `--batch-size` too ([`train_need`]).
//!
//! The figures are what the worker allocates, rounded up: they refuse what
//! certainly cannot fit, not what might be tight.

use std::collections::HashMap;

use gpuctl_core::catalogue::typed::TypedParams;
use gpuctl_core::units::format_bytes;
use gpuctl_proto::pb::{JobSpec, Node, PreflightCheck, RankPlacement, Verdict};

use super::check;

pub const MEMORY_CHECK: &str = "memory_fit";

/// A rank's memory: on its device (the GPU, or the host for a CPU rank) and on
/// the host besides (inputs built on the CPU before they are copied).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Need {
    device: u64,
    host: u64,
    /// The flags that chose the size, as the user would type them.
    what: String,
    /// How to make it fit.
    fix: &'static str,
}

const FIX_SIZE: &str =
    "pick a smaller size (gpuctl submit ... --help lists the defaults per device)";
const FIX_TRAIN: &str = "pick a smaller --batch-size or --gpt-size, or shard with fsdp on more ranks (gpuctl submit ... --help lists the defaults per device)";

/// What one rank of `spec` allocates among `world` ranks; `None` for
/// workloads whose memory is not a size the user picked (maxbatch searches).
fn need(spec: &JobSpec, gpu: bool, world: u64) -> Option<Need> {
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
                fix: FIX_SIZE,
            })
        }
        TypedParams::Nccl(p) => Some(Need {
            // A send and a receive buffer of max_bytes, and the expected
            // values the check builds (index tensors as wide as the data).
            device: p.max_bytes.saturating_mul(3),
            host: 0,
            what: "nccl --max-bytes".into(),
            fix: FIX_SIZE,
        }),
        TypedParams::Ddp(t) => train_need(&t, &spec.workload, 1),
        TypedParams::Fsdp(t) => train_need(&t, &spec.workload, world.max(1)),
        TypedParams::MaxBatch(_) => None,
        TypedParams::P2p(p) => Some(Need {
            // The device buffer of the host copies, the pair buffer and
            // the check's mask; the host buffer, pinned from a first copy.
            device: p.bytes.saturating_mul(3),
            host: p.bytes.saturating_mul(2),
            what: "p2p --bytes".into(),
            fix: FIX_SIZE,
        }),
    }
}

/// A training rank's memory for the model of the list that needs most, among
/// `shards` ranks (1: ddp, every rank holds everything):
///
/// * the training state per parameter: compute parameters and gradients in
///   the compute type, the fp32 master (none apart from the compute copy in
///   fp32) and the fp32 momentum, divided by `shards`;
/// * fsdp: two of the largest unit gathered whole at once, parameters and
///   gradients in the compute type (the gather slots of one unit and the
///   next);
/// * GPT: activations, at least 34·b·T·d bytes a layer in 2-byte types
///   (Korthikanti et al., flash attention: no T² term), and the logits in the
///   compute type with their fp32 loss input and gradient (b·T·V each).
///
/// Other activations hang on too much to guess: this refuses what certainly
/// cannot fit, not what might be tight.
fn train_need(
    t: &gpuctl_core::catalogue::TrainParams,
    workload: &str,
    shards: u64,
) -> Option<Need> {
    t.models
        .iter()
        .filter_map(|m| {
            let p = &m.model;
            let params = p.parameters()?;
            let elem: u64 = if p.precision == "fp32" { 4 } else { 2 };
            let master = if elem == 4 { 0 } else { 4 };
            let state = params.saturating_mul(2 * elem + master + 4) / shards;
            let gathered = if shards > 1 {
                p.largest_unit_parameters()
                    .unwrap_or(0)
                    .saturating_mul(2 * 2 * elem)
            } else {
                0
            };
            let mut what = format!("{workload} --model {}", p.model);
            let mut activations = 0;
            if let Some(s) = (p.model == "gpt")
                .then(|| gpuctl_core::catalogue::gpt_shape(&p.gpt_size))
                .flatten()
            {
                let tokens = m.batch_size.saturating_mul(p.seq_len);
                let layers = tokens
                    .saturating_mul(34 * s.dim * s.layers)
                    .saturating_mul(elem / 2);
                let logits = tokens.saturating_mul(s.vocab).saturating_mul(elem + 8);
                activations = layers.saturating_add(logits);
                what = format!(
                    "{what} --gpt-size {} --seq-len {} --batch-size {}",
                    p.gpt_size, p.seq_len, m.batch_size
                );
            }
            Some(Need {
                device: state.saturating_add(gathered).saturating_add(activations),
                host: 0,
                what,
                fix: FIX_TRAIN,
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
    let world = ranks.len() as u64;
    let (gpu_need, cpu_need) = (need(spec, true, world), need(spec, false, world));
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
            // The spec's needs differ by device only in size: one fix.
            let fix = gpu_need
                .as_ref()
                .or(cpu_need.as_ref())
                .map_or(FIX_SIZE, |n| n.fix);
            out.push(check(
                &node.name,
                MEMORY_CHECK,
                Verdict::Fail,
                problems.join("; "),
                fix,
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
                    memory_total_bytes: gib << 30,
                    ..gpuctl_testkit::gpu::info(name, i as u32)
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

    #[test]
    fn gpt_is_weighed_by_its_size_and_fsdp_by_its_shard() {
        let gpus = |gib| node("gpu-a", 2000, &[gib, gib]);
        let two = ranks("gpu-a", 2, true);
        let one = ranks("gpu-a", 1, true);
        let gpt = |w: &str, size: &str| spec(w, &[("model", "gpt"), ("gpt_size", size)]);
        // The defaults fit an 80 GB GPU: ddp up to 350m, fsdp of 1.3b and
        // 2.7b on 2 GPUs (2.7b's ddp too, just).
        let h100 = gpus(80);
        for (w, size) in [
            ("ddp", "124m"),
            ("ddp", "350m"),
            ("fsdp", "1.3b"),
            ("fsdp", "2.7b"),
        ] {
            assert_eq!(
                verdicts(&checks(&gpt(w, size), &[&h100], &two)),
                [],
                "{w} {size}"
            );
        }
        // On 40 GB GPUs 2.7b's replicated state (2.65B × 12 bytes) and its
        // activations do not fit; sharded across two ranks they do.
        let a100 = gpus(40);
        let c = checks(&gpt("ddp", "2.7b"), &[&a100], &two);
        assert_eq!(verdicts(&c), [Verdict::Fail]);
        assert!(
            c[0].detail
                .contains("ddp --model gpt --gpt-size 2.7b --seq-len 1024 --batch-size 4"),
            "{}",
            c[0].detail
        );
        assert!(c[0].detail.contains("on GPU 0"), "{}", c[0].detail);
        assert!(
            c[0].fix.contains("--batch-size") && c[0].fix.contains("fsdp"),
            "{}",
            c[0].fix
        );
        assert_eq!(verdicts(&checks(&gpt("fsdp", "2.7b"), &[&a100], &two)), []);
        // One rank shards nothing.
        assert_eq!(
            verdicts(&checks(&gpt("fsdp", "2.7b"), &[&a100], &one)),
            [Verdict::Fail]
        );
        // The batch counts: 1.3b fits 80 GB at its default, not at 64 a rank.
        let big = spec(
            "fsdp",
            &[("model", "gpt"), ("gpt_size", "1.3b"), ("batch_size", "64")],
        );
        let c = checks(&big, &[&h100], &two);
        assert_eq!(verdicts(&c), [Verdict::Fail]);
        assert!(c[0].detail.contains("--batch-size 64"), "{}", c[0].detail);
        // Other workloads keep their own fix.
        let c = checks(&spec("nccl", &[("max_bytes", "64G")]), &[&a100], &two);
        assert!(c[0].fix.starts_with("pick a smaller size"), "{}", c[0].fix);
    }

    #[test]
    fn fsdp_counts_its_shard_and_two_gathered_units() {
        let t = |w: &str, size: &str, world| {
            need(
                &spec(
                    w,
                    &[
                        ("model", "gpt"),
                        ("gpt_size", size),
                        ("batch_size", "1"),
                        ("seq_len", "8"),
                    ],
                ),
                true,
                world,
            )
            .unwrap()
            .device
        };
        let n = gpuctl_core::catalogue::gpt_parameters("1.3b", 8).unwrap();
        // bf16: parameters and gradients (2 + 2), fp32 master and momentum (4 + 4).
        let activations = 8 * (34 * 2048 * 24) + 8 * 50304 * 10;
        assert_eq!(t("ddp", "1.3b", 4), n * 12 + activations);
        // 1.3b's root (embeddings) is its largest unit: two of them gathered,
        // parameters and gradients in bf16.
        let root = (50304 + 8) * 2048 + 2 * 2048;
        assert_eq!(
            t("fsdp", "1.3b", 4),
            n * 12 / 4 + 2 * root * 4 + activations
        );
    }
}

//! The rules between a job's parameters and what it runs on: the values a
//! workload cannot run with on any device ([`check_values`], at submit),
//! the node count a pattern needs ([`check_shape`], at submit when the
//! count is given), and what only the chosen nodes tell ([`check_placed`],
//! at plan time: ranks per node, GPU or CPU ranks and their defaults). Each
//! error names the flag and the fix, so that a request that cannot run is
//! refused before anything runs instead of failing healthy nodes (issue 47).

use std::collections::HashMap;

use crate::units::parse_bytes;

use super::{err, NcclPattern, SpecError, TypedParams};

/// The rules between a workload's parameters and the job's size: `--pattern
/// pairs` on one node, `--pattern bisect` or `search` on fewer than three.
/// Checked at submit with the count asked for, and again by the coordinator's
/// planner with the nodes chosen (`--nodes all`).
pub fn check_shape(
    workload: &str,
    params: &HashMap<String, String>,
    node_count: Option<u32>,
) -> Result<(), SpecError> {
    let pattern = params.get("pattern").and_then(|v| NcclPattern::parse(v));
    if let (Some(p), Some(n), "nccl") = (pattern, node_count, workload) {
        let (least, why) = p.min_nodes();
        if n < least {
            return Err(err("--pattern", why));
        }
    }
    Ok(())
}

/// Bytes in one element of an nccl `--dtype`.
fn dtype_bytes(dtype: &str) -> u64 {
    match dtype {
        "bfloat16" | "half" => 2,
        _ => 4,
    }
}

/// Values no rank of any device can run with, beyond each value's own
/// range: checked on the parameters a job gives (the defaults all run).
pub fn check_values(workload: &str, given: &HashMap<String, String>) -> Result<(), SpecError> {
    let get = |k: &str| given.get(k).map(|v| v.trim());
    let bytes = |k: &str| get(k).and_then(|v| parse_bytes(v).ok());
    match workload {
        "stress" if get("precision") == Some("fp8") => Err(err(
            "--precision",
            "fp8 is not supported by this worker yet; use bf16, fp16, tf32 or fp32",
        )),
        "p2p" => match bytes("bytes") {
            Some(b) if b < 4 => Err(err(
                "--bytes",
                format!("{b} bytes hold no 4-byte element; give 4 bytes or more"),
            )),
            _ => Ok(()),
        },
        "nccl" => {
            let dtype = get("dtype").unwrap_or("float");
            let es = dtype_bytes(dtype);
            match bytes("max_bytes") {
                Some(b) if b < es => Err(err(
                    "--max-bytes",
                    format!("{b} bytes hold no {dtype} element; give at least {es} bytes"),
                )),
                _ => Ok(()),
            }
        }
        _ => Ok(()),
    }
}

/// What a rank of a GPU (`gpu`) or a CPU cannot run of typed parameters.
pub fn check_device(params: &TypedParams, gpu: bool) -> Result<(), SpecError> {
    match params {
        TypedParams::Stress(p) if p.precision == "tf32" && !gpu => Err(err(
            "--precision",
            "tf32 needs a GPU; use fp32 or bf16 on CPU ranks",
        )),
        _ => Ok(()),
    }
}

/// What a plan puts where: every node with its ranks, in plan order, and
/// whether each runs GPU ranks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placed {
    /// (node, ranks on it, whether they are GPU ranks).
    pub nodes: Vec<(String, u32, bool)>,
}

impl Placed {
    /// The first node whose ranks are GPU ranks (`gpu`) or CPU ranks.
    fn first(&self, gpu: bool) -> Option<&str> {
        self.nodes
            .iter()
            .find(|(_, _, g)| *g == gpu)
            .map(|(n, _, _)| n.as_str())
    }
}

/// The rules only the chosen nodes tell, checked when a job is planned
/// (submit, `gpuctl plan`, and again when a waiting job starts on other
/// nodes): the node count ([`check_shape`]); for `--pattern pairs`,
/// `bisect` and `search`, as many ranks on every node (GPU i meets GPU i);
/// and every parameter with each device's defaults, as the ranks will read
/// them (`--min-bytes 32M` is fine on a GPU, whose largest size is 1G, and
/// not on a CPU rank, whose is 16M).
pub fn check_placed(
    workload: &str,
    params: &HashMap<String, String>,
    placed: &Placed,
) -> Result<(), SpecError> {
    check_shape(workload, params, Some(placed.nodes.len() as u32))?;
    let pattern = params.get("pattern").and_then(|v| NcclPattern::parse(v));
    if let (Some(p), "nccl") = (pattern, workload) {
        let mut counts = placed.nodes.iter().map(|(n, r, _)| (n, r));
        if let (Some((a, ra)), false) = (counts.next(), p == NcclPattern::All) {
            if let Some((b, rb)) = counts.find(|(_, r)| *r != ra) {
                return Err(err(
                    "--pattern",
                    format!(
                        "--pattern {} needs the same number of ranks on every node (GPU i meets GPU i): {a} has {ra}, {b} has {rb}; choose nodes alike (--selector gpus=N) or give --gpus-per-node",
                        p.name()
                    ),
                ));
            }
        }
    }
    for gpu in [true, false] {
        let Some(node) = placed.first(gpu) else {
            continue;
        };
        TypedParams::build(workload, params, gpu).map_err(|mut e| {
            let kind = if gpu { "GPU" } else { "CPU" };
            e.message = format!(
                "{} (on the {kind} ranks of {node}; defaults differ per device: `gpuctl submit {workload} --help`)",
                e.message
            );
            e
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn given(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn placed(nodes: &[(&str, u32, bool)]) -> Placed {
        Placed {
            nodes: nodes
                .iter()
                .map(|(n, r, g)| (n.to_string(), *r, *g))
                .collect(),
        }
    }

    #[test]
    fn values_no_device_runs_are_refused_naming_the_flag() {
        for (w, p, field, says) in [
            (
                "stress",
                ("precision", "fp8"),
                "--precision",
                "fp8 is not supported",
            ),
            ("p2p", ("bytes", "3"), "--bytes", "give 4 bytes or more"),
            (
                "nccl",
                ("max_bytes", "3"),
                "--max-bytes",
                "no float element",
            ),
        ] {
            let e = check_values(w, &given(&[p])).unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert!(e.message.contains(says), "{e}");
        }
        let half = given(&[("max_bytes", "2"), ("dtype", "half")]);
        assert!(check_values("nccl", &half).is_ok());
        for (w, p) in [
            ("stress", ("precision", "tf32")),
            ("p2p", ("bytes", "4")),
            ("nccl", ("max_bytes", "4")),
        ] {
            assert!(check_values(w, &given(&[p])).is_ok(), "{w} {p:?}");
        }
    }

    #[test]
    fn pairs_want_as_many_ranks_on_every_node() {
        let two = placed(&[("a", 2, false), ("b", 2, false), ("c", 2, false)]);
        let odd = placed(&[("a", 2, true), ("b", 4, true), ("c", 2, true)]);
        for pattern in ["pairs", "bisect", "search"] {
            let p = given(&[("pattern", pattern)]);
            assert!(check_placed("nccl", &p, &two).is_ok(), "{pattern}");
            let e = check_placed("nccl", &p, &odd).unwrap_err();
            assert_eq!(e.field, "--pattern");
            assert!(e.message.contains("a has 2, b has 4"), "{e}");
        }
        assert!(check_placed("nccl", &given(&[]), &odd).is_ok());
        // The node count `--nodes all` stood for.
        let e = check_placed(
            "nccl",
            &given(&[("pattern", "search")]),
            &placed(&[("a", 1, false), ("b", 1, false)]),
        )
        .unwrap_err();
        assert!(e.message.contains("needs 3 nodes"), "{e}");
    }

    #[test]
    fn each_device_is_checked_with_its_own_defaults() {
        let cpu = placed(&[("cpu-0", 2, false)]);
        let gpu = placed(&[("gpu-0", 8, true)]);
        // CPU ranks sweep up to 16M by default, GPUs up to 1G.
        let p = given(&[("min_bytes", "32M")]);
        assert!(check_placed("nccl", &p, &gpu).is_ok());
        let e = check_placed("nccl", &p, &cpu).unwrap_err();
        assert_eq!(e.field, "--min-bytes");
        assert!(e.message.contains("on the CPU ranks of cpu-0"), "{e}");
        let p = given(&[("precision", "tf32")]);
        assert!(check_placed("stress", &p, &gpu).is_ok());
        let e = check_placed("stress", &p, &cpu).unwrap_err();
        assert_eq!(e.field, "--precision");
        assert!(e.message.contains("tf32 needs a GPU"), "{e}");
    }
}

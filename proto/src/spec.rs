//! Job-spec rules: which workloads exist, which parameters each takes, node
//! selectors. The CLI checks a spec before sending it and the coordinator checks
//! it again before storing anything, both with this code, so a bad spec gets the
//! same clear error wherever it is caught.

use crate::pb::{JobSpec, Node};
use crate::units::{parse_bytes, parse_duration};

/// A problem with one field of a job spec, said so that the user can fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    pub field: String,
    pub message: String,
}

fn err(field: impl Into<String>, message: impl Into<String>) -> SpecError {
    SpecError {
        field: field.into(),
        message: message.into(),
    }
}

/// What values a workload parameter takes.
#[derive(Debug, Clone, Copy)]
pub enum ParamKind {
    /// A byte size such as `1M`.
    Bytes,
    /// A whole number in `[min, max]`.
    Int { min: u64, max: u64 },
    /// A real number in `[min, max]`.
    Float { min: f64, max: f64 },
    /// One of the listed words.
    Choice(&'static [&'static str]),
    /// A comma-separated list of the listed words (or `all`).
    List(&'static [&'static str]),
    /// `true` or `false`.
    Bool,
    /// A duration such as `1s`.
    Duration,
    /// GiB as a number (`20`), a size (`20G`), or a fraction of the GPU (`0.8`).
    Memory,
}

#[derive(Debug, Clone, Copy)]
pub struct ParamDef {
    pub name: &'static str,
    pub kind: ParamKind,
    pub help: &'static str,
}

#[derive(Debug, Clone, Copy)]
pub struct WorkloadDef {
    pub name: &'static str,
    pub help: &'static str,
    /// Runs for `--duration` (otherwise it runs until its work is done).
    pub timed: bool,
    pub params: &'static [ParamDef],
}

pub const COLLECTIVE_OPS: &[&str] = &[
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "alltoall",
    "sendrecv",
];
pub const MODELS: &[&str] = &[
    "resnet18",
    "resnet50",
    "resnet101",
    "resnet152",
    "cnn",
    "gpt",
];
const PRECISIONS_TRAIN: &[&str] = &["fp32", "fp16", "bf16"];
const PRECISIONS_GEMM: &[&str] = &["bf16", "fp16", "tf32", "fp32", "fp8"];
const DTYPES: &[&str] = &["float", "bfloat16", "half"];

const TRAIN_PARAMS: &[ParamDef] = &[
    ParamDef {
        name: "model",
        kind: ParamKind::Choice(MODELS),
        help: "model to train (default resnet50; cnn on CPU)",
    },
    ParamDef {
        name: "batch_size",
        kind: ParamKind::Int {
            min: 1,
            max: 1 << 20,
        },
        help: "batch per rank",
    },
    ParamDef {
        name: "precision",
        kind: ParamKind::Choice(PRECISIONS_TRAIN),
        help: "fp32, fp16 (loss scaling) or bf16",
    },
    ParamDef {
        name: "steps",
        kind: ParamKind::Int {
            min: 1,
            max: 1 << 30,
        },
        help: "timed steps",
    },
    ParamDef {
        name: "warmup_steps",
        kind: ParamKind::Int {
            min: 0,
            max: 1 << 20,
        },
        help: "untimed steps first",
    },
    ParamDef {
        name: "channels_last",
        kind: ParamKind::Bool,
        help: "channels_last layout for CNNs (default true on GPU)",
    },
    ParamDef {
        name: "bucket_bytes",
        kind: ParamKind::Bytes,
        help: "gradient bucket size (default 25M)",
    },
    ParamDef {
        name: "seq_len",
        kind: ParamKind::Int {
            min: 8,
            max: 1 << 20,
        },
        help: "tokens per sample for gpt",
    },
];

pub const WORKLOADS: &[WorkloadDef] = &[
    WorkloadDef {
        name: "stress",
        help: "GEMM loop for --duration with a bit-for-bit result check across ranks",
        timed: true,
        params: &[
            ParamDef {
                name: "size",
                kind: ParamKind::Int {
                    min: 16,
                    max: 65536,
                },
                help: "matrix side (default 8192 on GPU, 256 on CPU)",
            },
            ParamDef {
                name: "precision",
                kind: ParamKind::Choice(PRECISIONS_GEMM),
                help: "bf16, fp16, tf32, fp32 or fp8 (default bf16 on GPU, fp32 on CPU)",
            },
            ParamDef {
                name: "interval",
                kind: ParamKind::Duration,
                help: "TFLOP/s sampling interval (default 1s)",
            },
            ParamDef {
                name: "target_memory",
                kind: ParamKind::Memory,
                help: "GPU memory to fill first: GiB (20), size (20G) or fraction (0.8)",
            },
            ParamDef {
                name: "with_comm",
                kind: ParamKind::Bool,
                help: "keep an all_reduce running beside the GEMMs",
            },
            ParamDef {
                name: "check_every",
                kind: ParamKind::Int {
                    min: 1,
                    max: 1 << 30,
                },
                help: "compare the result digest every N products (default 10)",
            },
        ],
    },
    WorkloadDef {
        name: "nccl",
        help: "collective bandwidth, nccl-tests style (TCP ring backend on CPU)",
        timed: false,
        params: &[
            ParamDef {
                name: "ops",
                kind: ParamKind::List(COLLECTIVE_OPS),
                help: "collectives to run (default all)",
            },
            ParamDef {
                name: "min_bytes",
                kind: ParamKind::Bytes,
                help: "smallest size (default 1M)",
            },
            ParamDef {
                name: "max_bytes",
                kind: ParamKind::Bytes,
                help: "largest size (default 1G on GPU, 16M on CPU)",
            },
            ParamDef {
                name: "factor",
                kind: ParamKind::Int {
                    min: 2,
                    max: 1 << 20,
                },
                help: "size multiplier between steps (default 2)",
            },
            ParamDef {
                name: "dtype",
                kind: ParamKind::Choice(DTYPES),
                help: "float, bfloat16 or half",
            },
            ParamDef {
                name: "iters",
                kind: ParamKind::Int {
                    min: 1,
                    max: 1 << 20,
                },
                help: "timed iterations per size (default 20)",
            },
            ParamDef {
                name: "warmup",
                kind: ParamKind::Int {
                    min: 0,
                    max: 1 << 20,
                },
                help: "untimed iterations per size (default 5)",
            },
        ],
    },
    WorkloadDef {
        name: "ddp",
        help: "data-parallel training, gradients all-reduced in buckets",
        timed: false,
        params: TRAIN_PARAMS,
    },
    WorkloadDef {
        name: "fsdp",
        help: "sharded data-parallel training (flat parameters sharded)",
        timed: false,
        params: TRAIN_PARAMS,
    },
    WorkloadDef {
        name: "maxbatch",
        help: "largest batch per GPU before out-of-memory, with a safety margin",
        timed: false,
        params: &[
            ParamDef {
                name: "model",
                kind: ParamKind::Choice(MODELS),
                help: "model (default resnet50)",
            },
            ParamDef {
                name: "precision",
                kind: ParamKind::Choice(PRECISIONS_TRAIN),
                help: "fp32, fp16 or bf16",
            },
            ParamDef {
                name: "margin",
                kind: ParamKind::Float { min: 0.0, max: 0.9 },
                help: "safety margin (default 0.1)",
            },
            ParamDef {
                name: "start",
                kind: ParamKind::Int {
                    min: 1,
                    max: 1 << 20,
                },
                help: "first batch tried (default 8)",
            },
            ParamDef {
                name: "limit",
                kind: ParamKind::Int {
                    min: 1,
                    max: 1 << 24,
                },
                help: "largest batch tried (default 65536)",
            },
            ParamDef {
                name: "seq_len",
                kind: ParamKind::Int {
                    min: 8,
                    max: 1 << 20,
                },
                help: "tokens per sample for gpt",
            },
        ],
    },
];

pub fn workload(name: &str) -> Option<&'static WorkloadDef> {
    WORKLOADS.iter().find(|w| w.name == name)
}

pub fn workload_names() -> Vec<&'static str> {
    WORKLOADS.iter().map(|w| w.name).collect()
}

/// Default run time of timed workloads when none is given.
pub const DEFAULT_DURATION_MS: u64 = 60_000;

/// Checks a spec and fills the defaults the coordinator relies on. Returns the
/// spec to store; on error nothing should be stored or started.
pub fn normalize(spec: &JobSpec) -> Result<JobSpec, SpecError> {
    let mut spec = spec.clone();
    let def = workload(&spec.workload).ok_or_else(|| {
        err(
            "workload",
            format!(
                "unknown workload `{}`; choose one of {}",
                spec.workload,
                workload_names().join(", ")
            ),
        )
    })?;
    if !spec.all_nodes && spec.node_count == 0 {
        return Err(err(
            "--nodes",
            "0 is not a node count; give a number of nodes (1 or more) or `all`",
        ));
    }
    for s in &spec.selectors {
        parse_selector(s)?;
    }
    if def.timed && spec.duration_ms == 0 {
        spec.duration_ms = DEFAULT_DURATION_MS;
    }
    for (key, value) in &spec.params {
        let p = def.params.iter().find(|p| p.name == key).ok_or_else(|| {
            let known: Vec<_> = def.params.iter().map(|p| p.name).collect();
            err(
                format!("--param {key}"),
                format!(
                    "workload `{}` has no parameter `{key}`; it takes {}",
                    def.name,
                    known.join(", ")
                ),
            )
        })?;
        check_param(p, value).map_err(|m| err(format!("--{}", key.replace('_', "-")), m))?;
    }
    if let (Some(lo), Some(hi)) = (spec.params.get("min_bytes"), spec.params.get("max_bytes")) {
        let (lo, hi) = (parse_bytes(lo).unwrap_or(0), parse_bytes(hi).unwrap_or(0));
        if lo > hi {
            return Err(err(
                "--min-bytes",
                format!("min-bytes ({lo}) is larger than max-bytes ({hi}); swap them"),
            ));
        }
    }
    for key in spec.env.keys() {
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(err(
                "--env",
                format!("`{key}` is not an environment variable name; use K=V with K made of letters, digits and _"),
            ));
        }
    }
    Ok(spec)
}

fn check_param(p: &ParamDef, value: &str) -> Result<(), String> {
    let v = value.trim();
    match p.kind {
        ParamKind::Bytes => parse_bytes(v).and_then(|b| {
            if b == 0 {
                Err("a size of 0 bytes measures nothing; give at least 4".into())
            } else {
                Ok(())
            }
        }),
        ParamKind::Int { min, max } => match v.parse::<u64>() {
            Ok(n) if n >= min && n <= max => Ok(()),
            Ok(n) => Err(format!("{n} is out of range; give {min}..={max}")),
            Err(_) => Err(format!("`{v}` is not a whole number; give {min}..={max}")),
        },
        ParamKind::Float { min, max } => match v.parse::<f64>() {
            Ok(n) if n >= min && n <= max => Ok(()),
            _ => Err(format!("`{v}` is not a number in {min}..={max}")),
        },
        ParamKind::Choice(words) => {
            if words.contains(&v) {
                Ok(())
            } else {
                Err(format!("`{v}` is not one of {}", words.join(", ")))
            }
        }
        ParamKind::List(words) => {
            if v == "all" {
                return Ok(());
            }
            for item in v.split(',').map(str::trim) {
                if !words.contains(&item) {
                    return Err(format!(
                        "`{item}` is not one of {} (or `all`)",
                        words.join(", ")
                    ));
                }
            }
            Ok(())
        }
        ParamKind::Bool => match v {
            "true" | "false" => Ok(()),
            _ => Err(format!("`{v}` is not true or false")),
        },
        ParamKind::Duration => parse_duration(v).map(|_| ()),
        ParamKind::Memory => parse_memory(v).map(|_| ()),
    }
}

/// How much GPU memory to fill, as the user wrote it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MemoryTarget {
    Bytes(u64),
    Fraction(f64),
}

/// `20` means 20 GiB (the old scripts' habit), `20G` a size, `0.8` a fraction.
pub fn parse_memory(v: &str) -> Result<MemoryTarget, String> {
    if let Ok(x) = v.parse::<f64>() {
        if x <= 0.0 {
            return Err(format!("`{v}` must be positive"));
        }
        return Ok(if x <= 1.0 {
            MemoryTarget::Fraction(x)
        } else {
            MemoryTarget::Bytes((x * (1u64 << 30) as f64) as u64)
        });
    }
    parse_bytes(v).map(MemoryTarget::Bytes)
}

/// How a selector compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectorOp {
    Eq,
    Ne,
}

/// `key=value` or `key!=value`. Keys: any agent label, `gpu` (GPU model,
/// case-insensitive substring), `node` (node name), `gpus` (GPU count).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    pub key: String,
    pub op: SelectorOp,
    pub value: String,
}

pub fn parse_selector(text: &str) -> Result<Selector, SpecError> {
    let bad = || {
        err(
            "--selector",
            format!("`{text}` is not a selector; write key=value or key!=value, e.g. gpu=H200 or rack=a1"),
        )
    };
    let (key, op, value) = if let Some((k, v)) = text.split_once("!=") {
        (k, SelectorOp::Ne, v)
    } else if let Some((k, v)) = text.split_once('=') {
        (k, SelectorOp::Eq, v)
    } else {
        return Err(bad());
    };
    let (key, value) = (key.trim(), value.trim());
    let key_ok = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
    if !key_ok || value.is_empty() || value.contains('=') {
        return Err(bad());
    }
    Ok(Selector {
        key: key.to_string(),
        op,
        value: value.to_string(),
    })
}

impl Selector {
    pub fn matches(&self, node: &Node) -> bool {
        let hit = match self.key.as_str() {
            "gpu" => {
                let want = self.value.to_ascii_lowercase();
                !node.gpus.is_empty()
                    && node
                        .gpus
                        .iter()
                        .all(|g| g.name.to_ascii_lowercase().contains(&want))
            }
            "node" | "name" => node.name == self.value,
            "gpus" => node.gpus.len().to_string() == self.value,
            key => node
                .facts
                .as_ref()
                .and_then(|f| f.labels.get(key))
                .is_some_and(|v| *v == self.value),
        };
        match self.op {
            SelectorOp::Eq => hit,
            SelectorOp::Ne => !hit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(workload: &str) -> JobSpec {
        JobSpec {
            workload: workload.into(),
            node_count: 1,
            ..Default::default()
        }
    }

    #[test]
    fn unknown_workload_is_named() {
        let e = normalize(&spec("burn")).unwrap_err();
        assert_eq!(e.field, "workload");
        assert!(e.message.contains("`burn`") && e.message.contains("stress"));
    }

    #[test]
    fn zero_nodes_is_refused() {
        let mut s = spec("stress");
        s.node_count = 0;
        assert_eq!(normalize(&s).unwrap_err().field, "--nodes");
        s.all_nodes = true;
        assert!(normalize(&s).is_ok());
    }

    #[test]
    fn timed_workloads_get_a_duration() {
        assert_eq!(
            normalize(&spec("stress")).unwrap().duration_ms,
            DEFAULT_DURATION_MS
        );
        assert_eq!(normalize(&spec("nccl")).unwrap().duration_ms, 0);
    }

    #[test]
    fn params_are_checked_per_workload() {
        let mut s = spec("nccl");
        s.params.insert("ops".into(), "all_reduce,alltoall".into());
        s.params.insert("min_bytes".into(), "1K".into());
        s.params.insert("max_bytes".into(), "1M".into());
        assert!(normalize(&s).is_ok());
        s.params.insert("ops".into(), "all_reduce,bogus".into());
        assert!(normalize(&s).unwrap_err().message.contains("`bogus`"));
        s.params.insert("ops".into(), "all".into());
        s.params.insert("min_bytes".into(), "2M".into());
        assert_eq!(normalize(&s).unwrap_err().field, "--min-bytes");
        let mut s = spec("stress");
        s.params.insert("factor".into(), "2".into());
        assert!(normalize(&s)
            .unwrap_err()
            .message
            .contains("no parameter `factor`"));
    }

    #[test]
    fn selectors_parse_and_match() {
        assert!(parse_selector("gpu=H200").is_ok());
        assert_eq!(parse_selector("rack!=a1").unwrap().op, SelectorOp::Ne);
        for bad in ["gpu", "=x", "a=", "a==b", "a b=c"] {
            assert_eq!(
                parse_selector(bad).unwrap_err().field,
                "--selector",
                "{bad}"
            );
        }
        let mut node = Node {
            name: "n1".into(),
            ..Default::default()
        };
        node.facts = Some(Default::default());
        node.facts
            .as_mut()
            .unwrap()
            .labels
            .insert("rack".into(), "a1".into());
        node.gpus.push(crate::pb::GpuInfo {
            name: "NVIDIA H200".into(),
            ..Default::default()
        });
        assert!(parse_selector("gpu=h200").unwrap().matches(&node));
        assert!(parse_selector("rack=a1").unwrap().matches(&node));
        assert!(!parse_selector("rack!=a1").unwrap().matches(&node));
        assert!(!parse_selector("gpu=A100").unwrap().matches(&node));
    }

    #[test]
    fn memory_targets() {
        assert_eq!(parse_memory("0.8").unwrap(), MemoryTarget::Fraction(0.8));
        assert_eq!(parse_memory("20").unwrap(), MemoryTarget::Bytes(20 << 30));
        assert_eq!(parse_memory("1G").unwrap(), MemoryTarget::Bytes(1 << 30));
        assert!(parse_memory("-3").is_err());
    }
}

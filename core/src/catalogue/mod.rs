//! The catalogue of workload parameters: every parameter of every workload,
//! written once with its type, unit, default (per device where GPU and CPU
//! differ), allowed values and help. `spec::normalize` checks a job's
//! parameters with it, the CLI makes its flags from it, and the worker turns a
//! job's parameters into the typed structs of [`typed`] with it, so a rule or a
//! default lives in one place only.

pub mod shape;
pub mod sizes;
pub mod typed;

use std::time::Duration;

use crate::units::{parse_bytes, parse_duration};

pub use shape::{check_placed, check_shape, check_values, Placed};
pub use sizes::{
    default_batch, gpt_block_parameters, gpt_parameters, gpt_shape, model_label, model_parameters,
    model_variant, GptShape,
};
pub use typed::{
    judged_sizes, size_steps, MaxBatchParams, ModelParams, NcclParams, NcclPattern, P2pParams,
    StressParams, TrainModel, TrainParams, TypedParams, BUSBW_MIN_BYTES, JUDGED_RUNS,
};

/// A problem with one field of a job spec, said so that the user can fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    pub field: String,
    pub message: String,
}

pub(crate) fn err(field: impl Into<String>, message: impl Into<String>) -> SpecError {
    SpecError {
        field: field.into(),
        message: message.into(),
    }
}

/// What values a workload parameter takes.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// A byte size such as `1M` (powers of 1024), at least 1.
    Bytes,
    /// A whole number in `[min, max]`.
    Int { min: u64, max: u64 },
    /// A real number in `[min, max]`.
    Float { min: f64, max: f64 },
    /// One of the listed words.
    Choice(&'static [&'static str]),
    /// A comma-separated list of the listed words (or `all`).
    List(&'static [&'static str]),
    /// Listed words in the order given, each once, at most `max` (no `all`:
    /// the order means something, e.g. models run one after another).
    Sequence {
        words: &'static [&'static str],
        max: usize,
    },
    /// Whole numbers in `[min, max]`, comma-separated, each once, at most
    /// `max_len` (a sweep's settings, in the order given).
    IntList { min: u64, max: u64, max_len: usize },
    /// `true`/`false` (also `1`/`0`, `yes`/`no`).
    Bool,
    /// A duration such as `1s`.
    Duration,
    /// GiB as a number (`20`), a size (`20G`), or a fraction of the GPU (`0.8`).
    Memory,
}

/// A parameter's value when the job does not give one.
#[derive(Debug, Clone, Copy)]
pub enum DefaultValue {
    /// Unset: the workload does without (e.g. no memory to fill).
    None,
    /// The same on every device.
    Same(&'static str),
    /// Different on a GPU and on a CPU.
    PerDevice {
        gpu: &'static str,
        cpu: &'static str,
    },
    /// Depends on the model (and a GPT's size): [`default_batch`].
    ByModel,
}

impl DefaultValue {
    /// The default as text for a rank on a GPU (`gpu`) or a CPU.
    pub fn for_device(self, gpu: bool) -> Option<&'static str> {
        match self {
            DefaultValue::Same(v) => Some(v),
            DefaultValue::PerDevice { gpu: g, cpu: c } => Some(if gpu { g } else { c }),
            DefaultValue::None | DefaultValue::ByModel => None,
        }
    }

    fn describe(self) -> Option<String> {
        match self {
            DefaultValue::None => None,
            DefaultValue::Same(v) => Some(format!("default {v}")),
            DefaultValue::PerDevice { gpu, cpu } => {
                Some(format!("default {gpu} on GPU, {cpu} on CPU"))
            }
            DefaultValue::ByModel => Some("default depends on the model and --gpt-size".into()),
        }
    }
}

/// One parameter of one or more workloads.
#[derive(Debug, Clone, Copy)]
pub struct Param {
    pub name: &'static str,
    pub kind: Kind,
    /// What a number counts (empty for words and sizes, which carry their unit).
    pub unit: &'static str,
    pub default: DefaultValue,
    pub help: &'static str,
    pub workloads: &'static [&'static str],
}

impl Param {
    /// The CLI flag that sets it: `--min-bytes` for `min_bytes`.
    pub fn flag(&self) -> String {
        format!("--{}", self.name.replace('_', "-"))
    }

    /// What the flag's value is called in help: its unit, else its kind.
    pub fn value_name(&self) -> String {
        let name = match self.kind {
            _ if !self.unit.is_empty() => self.unit,
            Kind::Bytes => "size",
            Kind::Duration => "duration",
            Kind::Bool => "bool",
            Kind::Memory => "memory",
            Kind::Float { .. } | Kind::Int { .. } => "number",
            Kind::IntList { .. } => "numbers",
            Kind::Choice(_) | Kind::List(_) | Kind::Sequence { .. } => self.name,
        };
        name.to_ascii_uppercase()
    }
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
    "mobilenet_v2",
];
/// Models one ddp/fsdp job may train one after another (`--model a,b,c`).
pub const MAX_MODELS: usize = 8;
const PRECISIONS_TRAIN: &[&str] = &["fp32", "fp16", "bf16"];
/// GPT sizes (`toy` is the CPU default; `124m` is GPT-2 small).
pub const GPT_SIZES: &[&str] = &["toy", "124m", "350m", "1.3b", "2.7b"];
const PRECISIONS_GEMM: &[&str] = &["bf16", "fp16", "tf32", "fp32", "fp8"];
const DTYPES: &[&str] = &["float", "bfloat16", "half"];
/// `--pattern` of nccl: [`NcclPattern`]'s words.
pub const NCCL_PATTERNS: &[&str] = &["all", "pairs", "bisect", "search"];

const STRESS: &[&str] = &["stress"];
const NCCL: &[&str] = &["nccl"];
const TRAIN: &[&str] = &["ddp", "fsdp"];
const DDP: &[&str] = &["ddp"];
/// Settings of one loader sweep at most (`--loader-workers 0,2,4,8`).
pub const MAX_LOADER_SETTINGS: usize = 8;
const MODEL_USERS: &[&str] = &["ddp", "fsdp", "maxbatch"];
const MAXBATCH: &[&str] = &["maxbatch"];
const P2P: &[&str] = &["p2p"];

const fn p(
    name: &'static str,
    kind: Kind,
    unit: &'static str,
    default: DefaultValue,
    help: &'static str,
    workloads: &'static [&'static str],
) -> Param {
    Param {
        name,
        kind,
        unit,
        default,
        help,
        workloads,
    }
}

const fn int(min: u64, max: u64) -> Kind {
    Kind::Int { min, max }
}

const fn dev(gpu: &'static str, cpu: &'static str) -> DefaultValue {
    DefaultValue::PerDevice { gpu, cpu }
}

/// Every workload parameter. A name may appear twice when workloads give it
/// different values (`precision`); it is then one CLI flag.
#[rustfmt::skip]
pub const PARAMS: &[Param] = &[
    // stress
    p("size", int(16, 65536), "elements", dev("8192", "256"), "matrix side", STRESS),
    p("precision", Kind::Choice(PRECISIONS_GEMM), "", dev("bf16", "fp32"),
      "GEMM precision: bf16, fp16, tf32 (GPU only) or fp32 (fp8: refused, not supported yet)", STRESS),
    p("interval", Kind::Duration, "", DefaultValue::Same("1s"), "TFLOP/s sampling interval", STRESS),
    p("target_memory", Kind::Memory, "", DefaultValue::None,
      "GPU memory to fill first: GiB (20), size (20G) or fraction (0.8)", STRESS),
    p("with_comm", Kind::Bool, "", DefaultValue::Same("false"),
      "keep an all_reduce running beside the GEMMs (after a tenth of the run alone)", STRESS),
    p("check_every", int(1, 1 << 30), "products", DefaultValue::Same("10"),
      "compare the result digest every N products", STRESS),
    // nccl
    p("ops", Kind::List(COLLECTIVE_OPS), "", DefaultValue::Same("all"),
      "collectives, comma-separated, or `all`", NCCL),
    p("min_bytes", Kind::Bytes, "", DefaultValue::Same("1M"), "smallest message size", NCCL),
    p("max_bytes", Kind::Bytes, "", dev("1G", "16M"), "largest message size", NCCL),
    p("factor", int(2, 1 << 20), "", DefaultValue::Same("2"), "size multiplier between steps", NCCL),
    p("dtype", Kind::Choice(DTYPES), "", DefaultValue::Same("float"), "float, bfloat16 or half", NCCL),
    p("iters", int(1, 1 << 20), "iterations", DefaultValue::Same("20"), "timed iterations per size", NCCL),
    p("warmup", int(0, 1 << 20), "iterations", DefaultValue::Same("5"), "untimed iterations per size", NCCL),
    p("pattern", Kind::Choice(NCCL_PATTERNS), "", DefaultValue::Same("all"),
      "all: one collective over every rank; pairs: every pair of nodes in rounds; bisect: halves until the slow node is left; search: every slow node and link, each confirmed; bisect and search need 3 nodes or more (docs/workloads.md)", NCCL),
    p("slow_ratio", Kind::Float { min: 0.01, max: 1.0 }, "", DefaultValue::Same("0.8"),
      "bisect, search: a group below this share of the group it is compared with (search: of the upper quartile) is slow", NCCL),
    p("floor_gbps", Kind::Float { min: 0.0, max: 100_000.0 }, "GB/s", dev("1", "0.05"),
      "pairs, bisect, search: a link or group whose operation moves data slower than this (algbw) is cut short after two operations and recorded below the floor, a slow link not a hang; 0: no floor", NCCL),
    // ddp, fsdp, maxbatch
    p("model", Kind::Sequence { words: MODELS, max: MAX_MODELS }, "", dev("resnet50", "cnn"),
      "models, comma-separated, trained one after another and compared (resnet18, resnet50, resnet101, resnet152, cnn, gpt, mobilenet_v2)", TRAIN),
    p("model", Kind::Choice(MODELS), "", dev("resnet50", "cnn"),
      "model (resnet18, resnet50, resnet101, resnet152, cnn, gpt, mobilenet_v2)", MAXBATCH),
    p("precision", Kind::Choice(PRECISIONS_TRAIN), "", dev("bf16", "fp32"),
      "fp32, fp16 (loss scaling) or bf16", MODEL_USERS),
    p("seq_len", int(8, 1 << 20), "tokens", dev("1024", "32"), "tokens per sample for gpt", MODEL_USERS),
    p("gpt_size", Kind::Choice(GPT_SIZES), "", dev("124m", "toy"),
      "gpt size: toy, 124m, 350m, 1.3b or 2.7b (the model with --model gpt)", MODEL_USERS),
    p("batch_size", int(1, 1 << 20), "samples", DefaultValue::ByModel, "batch per rank", TRAIN),
    p("steps", int(1, 1 << 30), "steps", dev("30", "5"), "timed steps", TRAIN),
    p("warmup_steps", int(0, 1 << 20), "steps", dev("5", "2"), "untimed steps first", TRAIN),
    p("channels_last", Kind::Bool, "", dev("true", "false"), "channels_last layout for CNNs", TRAIN),
    p("bucket_bytes", Kind::Bytes, "", DefaultValue::Same("25M"), "gradient bucket size", TRAIN),
    p("loader_workers", Kind::IntList { min: 0, max: 64, max_len: MAX_LOADER_SETTINGS }, "workers", DefaultValue::None,
      "after training, sweep the input pipeline over these worker counts (0,2,4,8): batches made on the host (decode and augment of synthetic images), pinned and copied to the device; per setting samples/s, data wait, CPU use and GPU utilisation, each rank alone (docs/workloads.md)", DDP),
    p("loader_work", int(1, 1000), "passes", dev("2", "1"), "loader: augment passes per sample (the host work each sample costs)", DDP),
    p("loader_steps", int(1, 1 << 20), "steps", dev("50", "4"), "loader: timed steps per worker count", DDP),
    p("profile", Kind::Bool, "", DefaultValue::Same("false"),
      "after training, profile a few steps with libtorch's profiler (Kineto): top 10 operators by CPU time, CUDA time and memory per rank, and a Chrome trace per rank (`gpuctl profile JOB`)", TRAIN),
    p("profile_steps", int(1, 1000), "steps", dev("20", "3"), "profile: steps profiled", TRAIN),
    // maxbatch
    p("margin", Kind::Float { min: 0.0, max: 0.9 }, "", DefaultValue::Same("0.1"), "safety margin (0..0.9)", MAXBATCH),
    p("start", int(1, 1 << 20), "samples", DefaultValue::Same("8"), "first batch tried", MAXBATCH),
    p("limit", int(1, 1 << 24), "samples", dev("65536", "64"), "largest batch tried", MAXBATCH),
    // p2p
    p("bytes", Kind::Bytes, "", dev("256M", "16M"), "size of each copy", P2P),
    p("iters", int(1, 1 << 16), "iterations", DefaultValue::Same("10"), "timed copies per pass (two passes)", P2P),
    p("warmup", int(0, 1 << 16), "iterations", DefaultValue::Same("3"), "untimed copies first", P2P),
];

/// The parameters `workload` takes, in catalogue order.
pub fn params_of(workload: &str) -> impl Iterator<Item = &'static Param> + '_ {
    PARAMS
        .iter()
        .filter(move |p| p.workloads.contains(&workload))
}

/// The entry for `name` of `workload`, if it takes one.
pub fn param(workload: &str, name: &str) -> Option<&'static Param> {
    params_of(workload).find(|p| p.name == name)
}

/// The items of `it` in order, each once.
fn unique<T: PartialEq>(it: impl Iterator<Item = T>) -> Vec<T> {
    let mut v = Vec::new();
    for x in it {
        if !v.contains(&x) {
            v.push(x);
        }
    }
    v
}

/// Every parameter name once, in catalogue order: one CLI flag each.
pub fn names() -> Vec<&'static str> {
    unique(PARAMS.iter().map(|p| p.name))
}

/// The first entry of each name: what the flag shared by entries of one name
/// shows (value name, bool-ness; the help joins them all, [`flag_help`]).
pub fn flag_params() -> Vec<&'static Param> {
    names()
        .into_iter()
        .filter_map(|n| PARAMS.iter().find(|p| p.name == n))
        .collect()
}

/// Every workload that takes parameters, in catalogue order.
pub fn workloads() -> Vec<&'static str> {
    unique(PARAMS.iter().flat_map(|p| p.workloads.iter().copied()))
}

/// The help of the CLI flag for `name`: each entry's workloads, help and default.
pub fn flag_help(name: &str) -> String {
    PARAMS
        .iter()
        .filter(|p| p.name == name)
        .map(|p| {
            let default = p
                .default
                .describe()
                .map(|d| format!(" ({d})"))
                .unwrap_or_default();
            format!("{}: {}{default}", p.workloads.join("/"), p.help)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Whether the flag of `name` takes a bool (and so may stand alone: `--with-comm`).
pub fn is_bool(name: &str) -> bool {
    PARAMS
        .iter()
        .any(|p| p.name == name && matches!(p.kind, Kind::Bool))
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

/// The one boolean rule: true/false, 1/0, yes/no.
pub fn parse_bool(v: &str) -> Result<bool, String> {
    match v.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err(format!("`{v}` is not true or false")),
    }
}

/// A parameter's value, parsed.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Bytes(u64),
    Int(u64),
    Float(f64),
    Word(String),
    List(Vec<String>),
    Bool(bool),
    Duration(Duration),
    Memory(MemoryTarget),
}

/// Parses `text` as a value of `p`; the message says what is wrong, without the flag.
pub fn parse_value(p: &Param, text: &str) -> Result<Value, String> {
    let v = text.trim();
    match p.kind {
        Kind::Bytes => match parse_bytes(v)? {
            0 => Err("a size of 0 bytes measures nothing; give at least 4".into()),
            b => Ok(Value::Bytes(b)),
        },
        Kind::Int { min, max } => match v.parse::<u64>() {
            Ok(n) if n >= min && n <= max => Ok(Value::Int(n)),
            Ok(n) => Err(format!("{n} is out of range; give {min}..={max}")),
            Err(_) => Err(format!("`{v}` is not a whole number; give {min}..={max}")),
        },
        Kind::Float { min, max } => match v.parse::<f64>() {
            Ok(n) if n >= min && n <= max => Ok(Value::Float(n)),
            _ => Err(format!("`{v}` is not a number in {min}..={max}")),
        },
        Kind::Choice(words) => match words.iter().find(|w| **w == v) {
            Some(w) => Ok(Value::Word(w.to_string())),
            None => Err(format!("`{v}` is not one of {}", words.join(", "))),
        },
        Kind::List(words) => {
            if v == "all" {
                return Ok(Value::List(words.iter().map(|w| w.to_string()).collect()));
            }
            let mut items = Vec::new();
            for item in v.split(',').map(str::trim) {
                if !words.contains(&item) {
                    return Err(format!(
                        "`{item}` is not one of {} (or `all`)",
                        words.join(", ")
                    ));
                }
                items.push(item.to_string());
            }
            Ok(Value::List(items))
        }
        Kind::Sequence { words, max } => {
            let mut items: Vec<String> = Vec::new();
            for item in v.split(',').map(str::trim) {
                if !words.contains(&item) {
                    return Err(format!("`{item}` is not one of {}", words.join(", ")));
                }
                if items.iter().any(|i| i == item) {
                    return Err(format!("`{item}` is given twice; name each once"));
                }
                items.push(item.to_string());
            }
            if items.len() > max {
                return Err(format!(
                    "{} given; at most {max} run in one job (split the list over jobs)",
                    items.len()
                ));
            }
            Ok(Value::List(items))
        }
        Kind::IntList { min, max, max_len } => {
            let mut items: Vec<String> = Vec::new();
            for item in v.split(',').map(str::trim) {
                match item.parse::<u64>() {
                    Ok(n) if n >= min && n <= max => {}
                    _ => return Err(format!("`{item}` is not a whole number in {min}..={max}")),
                }
                if items.iter().any(|i| i == item) {
                    return Err(format!("`{item}` is given twice; name each once"));
                }
                items.push(item.to_string());
            }
            if items.len() > max_len {
                return Err(format!("{} given; at most {max_len}", items.len()));
            }
            Ok(Value::List(items))
        }
        Kind::Bool => parse_bool(v).map(Value::Bool),
        Kind::Duration => parse_duration(v).map(Value::Duration),
        Kind::Memory => parse_memory(v).map(Value::Memory),
    }
}

/// The entry for `key` of `workload`, or the error that names what it takes.
fn known(workload: &str, key: &str) -> Result<&'static Param, SpecError> {
    param(workload, key).ok_or_else(|| {
        let known: Vec<_> = params_of(workload).map(|p| p.name).collect();
        err(
            format!("--param {key}"),
            format!(
                "workload `{workload}` has no parameter `{key}`; it takes {}",
                known.join(", ")
            ),
        )
    })
}

/// Parses `text` as `p`'s value; the error names the flag.
fn parse_flag(p: &Param, text: &str) -> Result<Value, SpecError> {
    parse_value(p, text).map_err(|m| err(p.flag(), m))
}

/// The one cross-field rule: a sweep's smallest size is at most its largest.
fn check_sizes(min_bytes: u64, max_bytes: u64) -> Result<(), SpecError> {
    if min_bytes > max_bytes {
        return Err(err(
            "--min-bytes",
            format!("min-bytes ({min_bytes}) is larger than max-bytes ({max_bytes}); swap them"),
        ));
    }
    Ok(())
}

/// Checks the parameters a job gives (not the defaults: the device is not
/// known yet) and returns them with booleans written `true`/`false`.
pub fn check_given(
    workload: &str,
    given: &std::collections::HashMap<String, String>,
) -> Result<std::collections::HashMap<String, String>, SpecError> {
    let mut out = given.clone();
    let mut bytes = std::collections::HashMap::new();
    for (key, text) in given {
        let p = known(workload, key)?;
        match parse_flag(p, text)? {
            Value::Bool(b) => {
                out.insert(key.clone(), b.to_string());
            }
            Value::Bytes(b) => {
                bytes.insert(key.as_str(), b);
            }
            _ => {}
        }
    }
    // `--pattern pairs` and `bisect` measure at max_bytes only: min_bytes does not apply.
    let one_size = given
        .get("pattern")
        .and_then(|v| NcclPattern::parse(v))
        .is_some_and(NcclPattern::max_bytes_only);
    if let (Some(lo), Some(hi), false) = (bytes.get("min_bytes"), bytes.get("max_bytes"), one_size)
    {
        check_sizes(*lo, *hi)?;
    }
    check_values(workload, given)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_parses_on_both_devices() {
        for p in PARAMS {
            for gpu in [true, false] {
                if let Some(d) = p.default.for_device(gpu) {
                    parse_value(p, d).unwrap_or_else(|e| panic!("{} default {d}: {e}", p.name));
                }
            }
        }
    }

    #[test]
    fn a_name_is_one_kind_of_flag() {
        // Two entries of one name share a flag: they must agree on being a bool
        // and must not both serve one workload.
        for a in PARAMS {
            for b in PARAMS.iter().filter(|b| b.name == a.name) {
                assert_eq!(matches!(a.kind, Kind::Bool), matches!(b.kind, Kind::Bool));
                if !std::ptr::eq(a, b) {
                    assert!(
                        a.workloads.iter().all(|w| !b.workloads.contains(w)),
                        "{}",
                        a.name
                    );
                }
            }
        }
    }

    #[test]
    fn booleans_follow_one_rule() {
        for (t, want) in [
            ("true", true),
            ("1", true),
            ("YES", true),
            ("no", false),
            ("0", false),
        ] {
            assert_eq!(parse_bool(t).unwrap(), want, "{t}");
        }
        assert!(parse_bool("maybe").unwrap_err().contains("true or false"));
        let mut given = std::collections::HashMap::new();
        given.insert("with_comm".to_string(), "yes".to_string());
        assert_eq!(check_given("stress", &given).unwrap()["with_comm"], "true");
    }

    #[test]
    fn flag_help_says_the_default() {
        assert_eq!(
            flag_help("max_bytes"),
            "nccl: largest message size (default 1G on GPU, 16M on CPU)"
        );
        assert!(
            flag_help("precision").contains("stress: ")
                && flag_help("precision").contains("ddp/fsdp/maxbatch: ")
        );
    }

    #[test]
    fn pairs_need_two_nodes_when_the_count_is_known() {
        let mut given = std::collections::HashMap::new();
        given.insert("pattern".to_string(), "pairs".to_string());
        let e = check_shape("nccl", &given, Some(1)).unwrap_err();
        assert_eq!(e.field, "--pattern");
        assert!(e.message.contains("2 nodes or more"), "{e}");
        assert!(check_shape("nccl", &given, Some(2)).is_ok());
        assert!(check_shape("nccl", &given, None).is_ok());
        // Sizes: pairs measure at max_bytes only, so min_bytes above it is no error.
        given.insert("min_bytes".to_string(), "2M".to_string());
        given.insert("max_bytes".to_string(), "1M".to_string());
        assert!(check_given("nccl", &given).is_ok());
        given.remove("pattern");
        assert_eq!(
            check_given("nccl", &given).unwrap_err().field,
            "--min-bytes"
        );
        given.remove("min_bytes");
        given.insert("pattern".to_string(), "all".to_string());
        assert!(check_shape("nccl", &given, Some(1)).is_ok());
        assert!(check_shape("stress", &std::collections::HashMap::new(), Some(1)).is_ok());
    }

    #[test]
    fn bisect_needs_three_nodes_when_the_count_is_known() {
        let mut given = std::collections::HashMap::new();
        given.insert("pattern".to_string(), "bisect".to_string());
        for n in [1, 2] {
            let e = check_shape("nccl", &given, Some(n)).unwrap_err();
            assert_eq!(e.field, "--pattern");
            assert!(e.message.contains("3 nodes or more"), "{e}");
        }
        assert!(check_shape("nccl", &given, Some(3)).is_ok());
        assert!(check_shape("nccl", &given, None).is_ok());
        // One size, like pairs: min_bytes above max_bytes is no error.
        given.insert("min_bytes".to_string(), "2M".to_string());
        given.insert("max_bytes".to_string(), "1M".to_string());
        assert!(check_given("nccl", &given).is_ok());
        assert!(flag_help("pattern").contains("bisect"));
    }

    #[test]
    fn sequences_are_bounded() {
        const WORDS: &[&str] = &["a", "b", "c", "d", "e", "f", "g", "h", "i"];
        let p = p(
            "x",
            Kind::Sequence {
                words: WORDS,
                max: 8,
            },
            "",
            DefaultValue::None,
            "",
            &[],
        );
        assert_eq!(
            parse_value(&p, "c,a").unwrap(),
            Value::List(vec!["c".into(), "a".into()])
        );
        let e = parse_value(&p, &WORDS.join(",")).unwrap_err();
        assert!(e.contains("9 given; at most 8"), "{e}");
        assert!(parse_value(&p, "a,b,a").unwrap_err().contains("twice"));
        assert!(param("ddp", "model").is_some_and(|p| matches!(p.kind, Kind::Sequence { .. })));
        assert!(param("maxbatch", "model").is_some_and(|p| matches!(p.kind, Kind::Choice(_))));
    }

    #[test]
    fn memory_targets() {
        assert_eq!(parse_memory("0.8").unwrap(), MemoryTarget::Fraction(0.8));
        assert_eq!(parse_memory("20").unwrap(), MemoryTarget::Bytes(20 << 30));
        assert_eq!(parse_memory("1G").unwrap(), MemoryTarget::Bytes(1 << 30));
        assert!(parse_memory("-3").is_err());
    }
}

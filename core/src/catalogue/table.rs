//! The table itself: every workload parameter with its kind, unit, default
//! per device and help ([`PARAMS`]), the word lists its kinds draw from, and
//! the look-ups the CLI's flags and the checks make over it. Apart from the
//! parsing of values so that adding a parameter means editing this one table.

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
    /// `max_len` (a sweep's settings, in the order given); or the word
    /// [`AUTO`]: the rank chooses them from its host.
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
    /// Depends on the model (and a GPT's size): [`default_batch`](super::default_batch).
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
/// `--pattern` of nccl: [`NcclPattern`](super::NcclPattern)'s words.
pub const NCCL_PATTERNS: &[&str] = &["all", "pairs", "bisect", "search"];

const STRESS: &[&str] = &["stress"];
const NCCL: &[&str] = &["nccl"];
const TRAIN: &[&str] = &["ddp", "fsdp"];
const DDP: &[&str] = &["ddp"];
/// Settings of one loader sweep at most (`--loader-workers 0,2,4,8`).
pub const MAX_LOADER_SETTINGS: usize = 8;

/// A sweep's settings left to the rank: `--loader-workers auto` sweeps 0 and
/// the powers of two up to the cores the rank has on its host.
pub const AUTO: &str = "auto";
const MODEL_USERS: &[&str] = &["ddp", "fsdp", "maxbatch"];
const MAXBATCH: &[&str] = &["maxbatch"];
const P2P: &[&str] = &["p2p"];

pub(super) const fn p(
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
      "after training, sweep the input pipeline over these worker counts (0,2,4,8; auto: 0 and powers of two up to the rank's share of its host's cores): batches made on the host (decode and augment of synthetic images), pinned and copied to the device; per setting samples/s, data wait, CPU use and GPU utilisation, each rank alone (docs/workloads.md)", DDP),
    p("loader_work", int(1, 1000), "passes", dev("2", "1"), "loader: augment passes per sample (the host work each sample costs)", DDP),
    p("loader_cpu_us", int(0, 1_000_000), "us", DefaultValue::Same("0"),
      "loader: CPU time each sample costs at least, µs of its loader thread (0: the passes alone); set it to your own pipeline's, e.g. DataLoader's workers' CPU cores ÷ their samples/s (bench/loader.sh CALIBRATE=1)", DDP),
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

//! A job's parameters as typed structs, one per workload, with every default
//! filled in for the rank's device from the catalogue. The worker builds one
//! at start and its workloads read fields only.

use std::collections::HashMap;
use std::time::Duration;

use super::sizes::{
    default_batch, gpt_block_parameters, gpt_parameters, gpt_shape, model_parameters,
};
use super::{
    check_sizes, err, known, param, parse_flag, workloads, MemoryTarget, SpecError, Value,
};

/// `stress`: the GEMM loop.
#[derive(Debug, Clone, PartialEq)]
pub struct StressParams {
    pub size: u64,
    pub precision: String,
    pub interval: Duration,
    pub target_memory: Option<MemoryTarget>,
    pub with_comm: bool,
    pub check_every: u64,
}

/// `nccl`: the nccl-tests sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct NcclParams {
    pub ops: Vec<String>,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub factor: u64,
    pub dtype: String,
    pub iters: u64,
    pub warmup: u64,
    pub pattern: NcclPattern,
    /// Bisect: a group below this share of the one it is compared with is slow.
    pub slow_ratio: f64,
    /// Pairs, bisect, search: the slowest rate (algbw, GB/s) a measurement
    /// may run at before it is cut short as below the floor (0: no floor).
    pub floor_gbps: f64,
}

/// Which ranks measure together (`--pattern`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NcclPattern {
    /// nccl-tests' sweep: every collective over every rank of the job.
    All,
    /// Every pair of nodes, in the rounds of [`crate::pairs::round_robin`]: sendrecv
    /// and all_reduce at `max_bytes` between GPU i of one node and GPU i of the other.
    Pairs,
    /// A search for one slow node: all_reduce at `max_bytes` over the whole set,
    /// then over halves of the suspect set measured at the same time, until one
    /// node is left (the worker's `nccl::bisect`).
    Bisect,
    /// Every slow node and link, by adaptive group testing
    /// ([`crate::search`]), each confirmed with other partners.
    Search,
}

impl NcclPattern {
    /// What refuses `pairs` on fewer than two nodes (normalize, else the worker).
    pub const PAIRS_NEED_NODES: &'static str =
        "--pattern pairs needs 2 nodes or more; choose more nodes (--nodes, --selector) or use --pattern all";
    /// What refuses `bisect` on fewer than three nodes: with two, a slow pair
    /// cannot say which of its nodes is slow.
    pub const BISECT_NEED_NODES: &'static str =
        "--pattern bisect needs 3 nodes or more (with 2, nothing tells which of the two is slow); choose more nodes (--nodes, --selector) or use --pattern pairs";

    /// What refuses `search` on fewer than three nodes.
    pub const SEARCH_NEED_NODES: &'static str =
        "--pattern search needs 3 nodes or more (a suspect is confirmed with a node already cleared); choose more nodes (--nodes, --selector) or use --pattern pairs";

    /// The fewest nodes the pattern can run on, and what refuses fewer.
    pub fn min_nodes(self) -> (u32, &'static str) {
        match self {
            NcclPattern::All => (1, ""),
            NcclPattern::Pairs => (2, Self::PAIRS_NEED_NODES),
            NcclPattern::Bisect => (3, Self::BISECT_NEED_NODES),
            NcclPattern::Search => (3, Self::SEARCH_NEED_NODES),
        }
    }

    /// The pattern a suite's stage runs on `nodes` nodes: a search on two
    /// nodes has no third to confirm with, and measures their one link as
    /// pairs do (one home for that choice: the suite runner and the stage's
    /// node count both ask here).
    pub fn in_suite(self, nodes: u32) -> NcclPattern {
        match self {
            NcclPattern::Search if nodes < 3 => NcclPattern::Pairs,
            p => p,
        }
    }

    /// Whether the pattern measures at `max_bytes` only (`min_bytes` does not apply).
    pub fn max_bytes_only(self) -> bool {
        self != NcclPattern::All
    }

    /// The pattern named by a `--pattern` word.
    pub fn parse(word: &str) -> Option<NcclPattern> {
        match word.trim() {
            "all" => Some(NcclPattern::All),
            "pairs" => Some(NcclPattern::Pairs),
            "bisect" => Some(NcclPattern::Bisect),
            "search" => Some(NcclPattern::Search),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            NcclPattern::All => "all",
            NcclPattern::Pairs => "pairs",
            NcclPattern::Bisect => "bisect",
            NcclPattern::Search => "search",
        }
    }
}

/// The sizes of an nccl-tests sweep, in bytes: `min`, then times `factor`
/// up to `max`.
pub fn size_steps(min: u64, max: u64, factor: u64) -> Vec<u64> {
    let mut v = Vec::new();
    let mut s = min.max(1);
    while s <= max {
        v.push(s);
        s = match s.checked_mul(factor.max(2)) {
            Some(x) => x,
            None => break,
        };
    }
    v
}

/// Collective sizes from which bandwidth is judged (nccl-tests' large
/// messages); a sweep that stops below it is judged at its largest size.
pub const BUSBW_MIN_BYTES: u64 = 64 << 20;

/// Timed runs of `iters` at each judged size; the median run is the figure.
/// One run of 20 all_reduces at 64 MiB takes ~7 ms on 4 H100s, and one in
/// four such runs dipped to 0.77x of the others (docs/benchmarks.md,
/// 2026-11-26): a judged figure rests on more than one run.
pub const JUDGED_RUNS: usize = 3;

/// Which sizes of a sweep bandwidth is judged at: every size from
/// [`BUSBW_MIN_BYTES`] up, or the largest when the sweep stops below it.
pub fn judged_sizes(sizes: &[u64]) -> Vec<u64> {
    let large: Vec<u64> = sizes
        .iter()
        .copied()
        .filter(|b| *b >= BUSBW_MIN_BYTES)
        .collect();
    if !large.is_empty() {
        return large;
    }
    sizes.iter().copied().max().into_iter().collect()
}

impl NcclParams {
    /// The sizes this sweep measures.
    pub fn sizes(&self) -> Vec<u64> {
        size_steps(self.min_bytes, self.max_bytes, self.factor)
    }
}

/// What every training workload (ddp, fsdp, maxbatch) reads alike.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelParams {
    pub model: String,
    pub precision: String,
    pub seq_len: u64,
    /// One of `GPT_SIZES` (used by `gpt` only).
    pub gpt_size: String,
}

impl ModelParams {
    /// Trainable parameters, with GPT's size and sequence length; `None`
    /// where not known (`cnn`, too small to matter).
    pub fn parameters(&self) -> Option<u64> {
        match self.model.as_str() {
            "gpt" => gpt_parameters(&self.gpt_size, self.seq_len),
            other => model_parameters(other),
        }
    }

    /// The parameters of the largest unit fsdp gathers whole (GPT: a block,
    /// or the root of embeddings and final norm where that is larger);
    /// `None` for models whose units are not weighed.
    pub fn largest_unit_parameters(&self) -> Option<u64> {
        match self.model.as_str() {
            "gpt" => {
                let all = gpt_parameters(&self.gpt_size, self.seq_len)?;
                let block = gpt_block_parameters(&self.gpt_size)?;
                let layers = gpt_shape(&self.gpt_size)?.layers;
                Some(block.max(all - layers * block))
            }
            _ => None,
        }
    }
}

/// One model of a `ddp`/`fsdp` job and its batch per rank.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainModel {
    pub model: ModelParams,
    pub batch_size: u64,
}

/// `ddp` and `fsdp`.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainParams {
    /// The models in the order given (`--model a,b,c`), trained one after
    /// another in the same workers; at least one.
    pub models: Vec<TrainModel>,
    pub steps: u64,
    pub warmup_steps: u64,
    pub channels_last: bool,
    pub bucket_bytes: u64,
    /// `--loader-workers`: the loader sweep's worker counts in the order
    /// given (ddp; empty: no sweep).
    pub loader_workers: Vec<u32>,
    pub loader_work: u64,
    pub loader_steps: u64,
    /// `--profile`: steps to profile after training (0: none).
    pub profile_steps: u64,
}

/// `maxbatch`.
#[derive(Debug, Clone, PartialEq)]
pub struct MaxBatchParams {
    pub model: ModelParams,
    pub margin: f64,
    pub start: u64,
    pub limit: u64,
}

/// `p2p`: copies inside a node.
#[derive(Debug, Clone, PartialEq)]
pub struct P2pParams {
    pub bytes: u64,
    pub iters: u64,
    pub warmup: u64,
}

/// One workload's parameters, typed.
#[derive(Debug, Clone, PartialEq)]
pub enum TypedParams {
    Stress(StressParams),
    Nccl(NcclParams),
    Ddp(TrainParams),
    Fsdp(TrainParams),
    MaxBatch(MaxBatchParams),
    P2p(P2pParams),
}

impl TypedParams {
    /// Checks `given` against the catalogue and fills every default for a rank
    /// on a GPU (`gpu`) or a CPU. Errors name the flag, as `normalize`'s do.
    pub fn build(
        workload: &str,
        given: &HashMap<String, String>,
        gpu: bool,
    ) -> Result<Self, SpecError> {
        for key in given.keys() {
            known(workload, key)?;
        }
        super::check_values(workload, given)?;
        let r = Reader {
            workload,
            given,
            gpu,
        };
        let typed = match workload {
            "stress" => TypedParams::Stress(StressParams {
                size: r.get("size")?,
                precision: r.get("precision")?,
                interval: r.get("interval")?,
                target_memory: r.opt("target_memory")?,
                with_comm: r.get("with_comm")?,
                check_every: r.get("check_every")?,
            }),
            "nccl" => {
                let p = NcclParams {
                    ops: r.get("ops")?,
                    min_bytes: r.get("min_bytes")?,
                    max_bytes: r.get("max_bytes")?,
                    factor: r.get("factor")?,
                    dtype: r.get("dtype")?,
                    iters: r.get("iters")?,
                    warmup: r.get("warmup")?,
                    pattern: r.get("pattern")?,
                    slow_ratio: r.get("slow_ratio")?,
                    floor_gbps: r.get("floor_gbps")?,
                };
                // Pairs and bisect measure at max_bytes only: a small max_bytes
                // with the default min_bytes is no mistake there.
                if !p.pattern.max_bytes_only() {
                    check_sizes(p.min_bytes, p.max_bytes)?;
                }
                TypedParams::Nccl(p)
            }
            "ddp" => TypedParams::Ddp(r.train()?),
            "fsdp" => TypedParams::Fsdp(r.train()?),
            "maxbatch" => TypedParams::MaxBatch(MaxBatchParams {
                model: r.model()?,
                margin: r.get("margin")?,
                start: r.get("start")?,
                limit: r.get("limit")?,
            }),
            "p2p" => TypedParams::P2p(P2pParams {
                bytes: r.get("bytes")?,
                iters: r.get("iters")?,
                warmup: r.get("warmup")?,
            }),
            w => {
                return Err(err(
                    "workload",
                    format!(
                        "unknown workload `{w}`; this build knows {}",
                        workloads().join(", ")
                    ),
                ))
            }
        };
        super::shape::check_device(&typed, gpu)?;
        Ok(typed)
    }
}

/// Reads one workload's values: the job's, else the catalogue's default.
struct Reader<'a> {
    workload: &'a str,
    given: &'a HashMap<String, String>,
    gpu: bool,
}

/// A field's type, taken out of a parsed [`Value`] of the matching kind.
trait FromValue: Sized {
    fn from_value(v: Value) -> Option<Self>;
}

macro_rules! from_value {
    ($($t:ty => $($variant:ident)|+;)*) => {$(
        impl FromValue for $t {
            fn from_value(v: Value) -> Option<Self> {
                match v {
                    $(Value::$variant(x) => Some(x),)+
                    _ => None,
                }
            }
        }
    )*};
}

from_value! {
    u64 => Int | Bytes;
    f64 => Float;
    String => Word;
    Vec<String> => List;
    bool => Bool;
    Duration => Duration;
    MemoryTarget => Memory;
}

impl FromValue for NcclPattern {
    fn from_value(v: Value) -> Option<Self> {
        match v {
            Value::Word(w) => NcclPattern::parse(&w),
            _ => None,
        }
    }
}

impl Reader<'_> {
    /// The job's value of `name`, else the default for the device; `None`
    /// when neither is there.
    fn opt<T: FromValue>(&self, name: &str) -> Result<Option<T>, SpecError> {
        let p = param(self.workload, name)
            .unwrap_or_else(|| panic!("the catalogue has no `{name}` for `{}`", self.workload));
        let text = self
            .given
            .get(name)
            .map(String::as_str)
            .or(p.default.for_device(self.gpu));
        let Some(text) = text else { return Ok(None) };
        let v = parse_flag(p, text)?;
        Ok(Some(T::from_value(v).unwrap_or_else(|| {
            panic!("the catalogue kind of `{name}` does not match its field")
        })))
    }

    /// Like [`Reader::opt`] for a parameter the catalogue gives a default.
    fn get<T: FromValue>(&self, name: &str) -> Result<T, SpecError> {
        Ok(self.opt(name)?.unwrap_or_else(|| {
            panic!(
                "the catalogue gives `{name}` of `{}` no default",
                self.workload
            )
        }))
    }

    fn model(&self) -> Result<ModelParams, SpecError> {
        Ok(ModelParams {
            model: self.get("model")?,
            precision: self.get("precision")?,
            seq_len: self.get("seq_len")?,
            gpt_size: self.get("gpt_size")?,
        })
    }

    /// Every model of the list; without `--batch-size` each gets its own default.
    fn train(&self) -> Result<TrainParams, SpecError> {
        let names: Vec<String> = self.get("model")?;
        let (precision, seq_len): (String, u64) = (self.get("precision")?, self.get("seq_len")?);
        let gpt_size: String = self.get("gpt_size")?;
        let batch: Option<u64> = self.opt("batch_size")?;
        let models = names
            .into_iter()
            .map(|name| TrainModel {
                batch_size: batch.unwrap_or_else(|| default_batch(&name, &gpt_size, self.gpu)),
                model: ModelParams {
                    model: name,
                    precision: precision.clone(),
                    seq_len,
                    gpt_size: gpt_size.clone(),
                },
            })
            .collect();
        Ok(TrainParams {
            models,
            steps: self.get("steps")?,
            warmup_steps: self.get("warmup_steps")?,
            channels_last: self.get("channels_last")?,
            bucket_bytes: self.get("bucket_bytes")?,
            loader_workers: if self.workload == "ddp" {
                self.opt::<Vec<String>>("loader_workers")?
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|w| w.parse().ok())
                    .collect()
            } else {
                Vec::new()
            },
            loader_work: if self.workload == "ddp" {
                self.get("loader_work")?
            } else {
                0
            },
            loader_steps: if self.workload == "ddp" {
                self.get("loader_steps")?
            } else {
                0
            },
            profile_steps: if self.get::<bool>("profile")? {
                self.get("profile_steps")?
            } else {
                0
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(workload: &str, pairs: &[(&str, &str)], gpu: bool) -> Result<TypedParams, SpecError> {
        let given = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        TypedParams::build(workload, &given, gpu)
    }

    #[test]
    fn every_workload_builds_from_defaults_on_both_devices() {
        for w in ["stress", "nccl", "ddp", "fsdp", "maxbatch", "p2p"] {
            for gpu in [true, false] {
                build(w, &[], gpu).unwrap_or_else(|e| panic!("{w} gpu={gpu}: {e}"));
            }
        }
    }

    #[test]
    fn defaults_depend_on_the_device() {
        let TypedParams::Stress(s) = build("stress", &[], true).unwrap() else {
            panic!()
        };
        assert_eq!((s.size, s.precision.as_str()), (8192, "bf16"));
        assert_eq!(s.interval, Duration::from_secs(1));
        let TypedParams::Stress(s) = build("stress", &[], false).unwrap() else {
            panic!()
        };
        assert_eq!(
            (s.size, s.precision.as_str(), s.check_every),
            (256, "fp32", 10)
        );
        let TypedParams::Nccl(n) = build("nccl", &[], false).unwrap() else {
            panic!()
        };
        assert_eq!(
            (n.min_bytes, n.max_bytes, n.ops.len()),
            (1 << 20, 16 << 20, 7)
        );
        assert_eq!(n.pattern, NcclPattern::All);
        let TypedParams::Nccl(n) = build("nccl", &[("pattern", "pairs")], true).unwrap() else {
            panic!()
        };
        assert_eq!(n.pattern, NcclPattern::Pairs);
        let TypedParams::Nccl(n) = build("nccl", &[("pattern", "bisect")], true).unwrap() else {
            panic!()
        };
        assert_eq!(n.pattern, NcclPattern::Bisect);
        assert!(build("nccl", &[("pattern", "bisect"), ("max_bytes", "64K")], true).is_ok());
        // min_bytes does not apply to pairs: below it is fine there only.
        let small = [("pattern", "pairs"), ("max_bytes", "64K")];
        assert!(build("nccl", &small, true).is_ok());
        assert_eq!(
            build("nccl", &small[1..], true).unwrap_err().field,
            "--min-bytes"
        );
        assert_eq!(
            build("nccl", &[("pattern", "ring")], true)
                .unwrap_err()
                .field,
            "--pattern"
        );
        let TypedParams::Ddp(t) = build("ddp", &[], true).unwrap() else {
            panic!()
        };
        assert_eq!(t.models.len(), 1);
        assert_eq!(
            (
                t.models[0].model.model.as_str(),
                t.models[0].batch_size,
                t.steps
            ),
            ("resnet50", 256, 30)
        );
        assert!(t.channels_last);
        let TypedParams::Fsdp(t) = build("fsdp", &[("model", "gpt")], false).unwrap() else {
            panic!()
        };
        let m = &t.models[0];
        assert_eq!((m.batch_size, t.steps, m.model.seq_len), (4, 5, 32));
        let TypedParams::MaxBatch(m) = build("maxbatch", &[], false).unwrap() else {
            panic!()
        };
        assert_eq!((m.limit, m.start, m.margin), (64, 8, 0.1));
    }

    #[test]
    fn model_lists_keep_their_order_and_batches() {
        let TypedParams::Ddp(t) =
            build("ddp", &[("model", "cnn, resnet18,mobilenet_v2")], false).unwrap()
        else {
            panic!()
        };
        let got: Vec<(&str, u64)> = t
            .models
            .iter()
            .map(|m| (m.model.model.as_str(), m.batch_size))
            .collect();
        assert_eq!(got, [("cnn", 8), ("resnet18", 2), ("mobilenet_v2", 2)]);
        let TypedParams::Fsdp(t) =
            build("fsdp", &[("model", "cnn,gpt"), ("batch_size", "32")], true).unwrap()
        else {
            panic!()
        };
        assert!(t.models.iter().all(|m| m.batch_size == 32));
        assert_eq!(t.models[1].model.model, "gpt");
        for (list, why) in [
            ("cnn,nope", "`nope` is not one of"),
            ("cnn,cnn", "given twice"),
            ("cnn,", "`` is not one of"),
            ("all", "`all` is not one of"),
        ] {
            let e = build("ddp", &[("model", list)], true).unwrap_err();
            assert_eq!(e.field, "--model", "{e}");
            assert!(e.message.contains(why), "{list}: {e}");
        }
        let nine = [crate::catalogue::MODELS, &["resnet18", "cnn"]]
            .concat()
            .join(",");
        let e = build("ddp", &[("model", &nine)], true).unwrap_err();
        assert!(e.message.contains("given twice"), "{e}");
        // maxbatch keeps one model.
        assert_eq!(
            build("maxbatch", &[("model", "cnn,gpt")], true)
                .unwrap_err()
                .field,
            "--model"
        );
        assert!(build("maxbatch", &[("model", "mobilenet_v2")], true).is_ok());
    }

    #[test]
    fn gpt_is_weighed_and_batched_by_its_size() {
        let TypedParams::Fsdp(t) = build(
            "fsdp",
            &[("model", "gpt,resnet50"), ("gpt_size", "1.3b")],
            true,
        )
        .unwrap() else {
            panic!()
        };
        let (gpt, resnet) = (&t.models[0], &t.models[1]);
        assert_eq!((gpt.batch_size, gpt.model.seq_len), (8, 1024));
        let n = gpt.model.parameters().unwrap();
        assert!((1_300_000_000..1_330_000_000).contains(&n), "{n}");
        // 1.3b's root (embeddings of 51328 tokens and positions) outweighs a block.
        assert_eq!(
            gpt.model.largest_unit_parameters(),
            Some((50304 + 1024) * 2048 + 2 * 2048)
        );
        // The size is gpt's alone.
        assert_eq!(resnet.batch_size, 256);
        assert_eq!(resnet.model.parameters(), Some(25_557_032));
        assert_eq!(resnet.model.largest_unit_parameters(), None);
        let TypedParams::Ddp(t) = build("ddp", &[("model", "cnn,gpt")], false).unwrap() else {
            panic!()
        };
        assert_eq!(t.models[0].model.parameters(), None);
        assert_eq!(t.models[1].model.gpt_size, "toy");
        assert_eq!(t.models[1].model.parameters(), gpt_parameters("toy", 32));
        // The toy's blocks outweigh its root.
        assert_eq!(
            t.models[1].model.largest_unit_parameters(),
            Some(12 * 64 * 64 + 13 * 64)
        );
        assert_eq!(
            build("ddp", &[("model", "gpt"), ("gpt_size", "7b")], true)
                .unwrap_err()
                .field,
            "--gpt-size"
        );
    }

    #[test]
    fn errors_name_the_flag() {
        let e = build("nccl", &[("min_bytes", "32M")], false).unwrap_err();
        assert_eq!(e.field, "--min-bytes", "{e}");
        assert!(build("nccl", &[("min_bytes", "32M")], true).is_ok());
        assert_eq!(
            build("stress", &[("size", "8")], true).unwrap_err().field,
            "--size"
        );
        assert_eq!(
            build("stress", &[("factor", "2")], true).unwrap_err().field,
            "--param factor"
        );
        let TypedParams::Stress(s) = build("stress", &[("with_comm", "yes")], true).unwrap() else {
            panic!()
        };
        assert!(s.with_comm);
    }
}

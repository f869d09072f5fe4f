//! A job's parameters as typed structs, one per workload, with every default
//! filled in for the rank's device from the catalogue. The worker builds one
//! at start and its workloads read fields only. The reading of each value
//! (the job's, else the device's default) is [`reader`]'s, so that this file
//! is the structs a workload sees and the one place that fills them.

mod reader;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::time::Duration;

use super::sizes::{gpt_block_parameters, gpt_parameters, gpt_shape, model_parameters};
use super::{check_sizes, err, known, size_steps, workloads, MemoryTarget, NcclPattern, SpecError};
use reader::Reader;

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
    /// given (ddp; empty: no sweep, unless `loader_auto`).
    pub loader_workers: Vec<u32>,
    /// `--loader-workers auto`: the rank picks the counts from its host's cores.
    pub loader_auto: bool,
    pub loader_work: u64,
    /// `--loader-cpu-us`: CPU µs each sample costs at least (0: none).
    pub loader_cpu_us: u64,
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

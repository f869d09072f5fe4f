//! The catalogue of workload parameters: every parameter of every workload,
//! written once with its type, unit, default (per device where GPU and CPU
//! differ), allowed values and help. `spec::normalize` checks a job's
//! parameters with it, the CLI makes its flags from it, and the worker turns a
//! job's parameters into the typed structs of [`typed`] with it, so a rule or a
//! default lives in one place only.
//!
//! The table is `table`; the rule per kind of value and the check of a
//! job's given parameters, `parse`; nccl's patterns and sweep sizes, which
//! lean on nothing else here, `nccl`; the rules against the nodes, [`shape`];
//! model sizes, [`sizes`]. Everything is re-exported here, so that callers
//! name `catalogue::…` and not the file an item lives in.

mod nccl;
mod parse;
pub mod shape;
pub mod sizes;
mod table;
#[cfg(test)]
mod tests;
pub mod typed;

pub use nccl::{judged_sizes, size_steps, NcclPattern, BUSBW_MIN_BYTES, JUDGED_RUNS};
pub use parse::{check_given, parse_bool, parse_memory, parse_value, MemoryTarget, Value};
use parse::{check_sizes, known, parse_flag};
pub use shape::{check_placed, check_shape, check_values, Placed};
pub use sizes::{
    default_batch, gpt_block_parameters, gpt_parameters, gpt_shape, model_label, model_parameters,
    model_variant, GptShape,
};
pub use table::{
    flag_help, flag_params, is_bool, names, param, params_of, workloads, DefaultValue, Kind, Param,
    AUTO, COLLECTIVE_OPS, GPT_SIZES, MAX_LOADER_SETTINGS, MAX_MODELS, MODELS, NCCL_PATTERNS,
    PARAMS,
};
pub use typed::{
    MaxBatchParams, ModelParams, NcclParams, P2pParams, StressParams, TrainModel, TrainParams,
    TypedParams,
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

//! Reading one workload's values for its typed struct: the job's text, else
//! the catalogue's default for the rank's device, parsed by the parameter's
//! kind and taken out as the field's type. Apart from the structs because
//! it is the one place a missing default or a kind that does not match its
//! field is a bug in the catalogue (it panics), not the user's error.

use std::collections::HashMap;
use std::time::Duration;

use super::{ModelParams, TrainModel, TrainParams};
use crate::catalogue::sizes::default_batch;
use crate::catalogue::{param, parse_flag, MemoryTarget, NcclPattern, SpecError, Value};

/// Reads one workload's values: the job's, else the catalogue's default.
pub(super) struct Reader<'a> {
    pub(super) workload: &'a str,
    pub(super) given: &'a HashMap<String, String>,
    pub(super) gpu: bool,
}

/// A field's type, taken out of a parsed [`Value`] of the matching kind.
pub(super) trait FromValue: Sized {
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
    pub(super) fn opt<T: FromValue>(&self, name: &str) -> Result<Option<T>, SpecError> {
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
    pub(super) fn get<T: FromValue>(&self, name: &str) -> Result<T, SpecError> {
        Ok(self.opt(name)?.unwrap_or_else(|| {
            panic!(
                "the catalogue gives `{name}` of `{}` no default",
                self.workload
            )
        }))
    }

    pub(super) fn model(&self) -> Result<ModelParams, SpecError> {
        Ok(ModelParams {
            model: self.get("model")?,
            precision: self.get("precision")?,
            seq_len: self.get("seq_len")?,
            gpt_size: self.get("gpt_size")?,
        })
    }

    /// Every model of the list; without `--batch-size` each gets its own default.
    pub(super) fn train(&self) -> Result<TrainParams, SpecError> {
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
        let loader_workers: Vec<String> = if self.workload == "ddp" {
            self.opt::<Vec<String>>("loader_workers")?
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        Ok(TrainParams {
            models,
            steps: self.get("steps")?,
            warmup_steps: self.get("warmup_steps")?,
            channels_last: self.get("channels_last")?,
            bucket_bytes: self.get("bucket_bytes")?,
            loader_workers: loader_workers
                .iter()
                .filter_map(|w| w.parse().ok())
                .collect(),
            loader_auto: loader_workers.iter().any(|w| w == crate::catalogue::AUTO),
            loader_work: if self.workload == "ddp" {
                self.get("loader_work")?
            } else {
                0
            },
            loader_cpu_us: if self.workload == "ddp" {
                self.get("loader_cpu_us")?
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

//! A parameter's text made a value: the one rule per kind (sizes, numbers
//! in range, word lists, booleans, memory targets), and the check of the
//! parameters a job gives at submit. Apart from the table because these
//! rules are shared by every entry of it, and the typed structs read values
//! through them too.

use std::collections::HashMap;
use std::time::Duration;

use super::{check_values, err, param, params_of, Kind, NcclPattern, Param, SpecError};
use crate::units::{parse_bytes, parse_duration};

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
        Kind::IntList { .. } if v.trim() == super::AUTO => {
            Ok(Value::List(vec![super::AUTO.into()]))
        }
        Kind::IntList { min, max, max_len } => {
            let mut items: Vec<String> = Vec::new();
            for item in v.split(',').map(str::trim) {
                match item.parse::<u64>() {
                    Ok(n) if n >= min && n <= max => {}
                    _ => {
                        return Err(format!(
                            "`{item}` is not a whole number in {min}..={max} (or give `auto` alone)"
                        ))
                    }
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
pub(super) fn known(workload: &str, key: &str) -> Result<&'static Param, SpecError> {
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
pub(super) fn parse_flag(p: &Param, text: &str) -> Result<Value, SpecError> {
    parse_value(p, text).map_err(|m| err(p.flag(), m))
}

/// The one cross-field rule: a sweep's smallest size is at most its largest.
pub(super) fn check_sizes(min_bytes: u64, max_bytes: u64) -> Result<(), SpecError> {
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
    given: &HashMap<String, String>,
) -> Result<HashMap<String, String>, SpecError> {
    let mut out = given.clone();
    let mut bytes = HashMap::new();
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

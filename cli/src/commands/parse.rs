//! Flag values the verbs share: `--nodes`, durations, `K=V` pairs and the
//! `--rules` file. Each error names the flag to fix.

use gpuctl_core::limits::MAX_RULES_BYTES;
use gpuctl_core::units;

use crate::error::{usage, UsageError};

/// The text of a `--rules` file, bounded; the coordinator parses it.
pub(crate) fn read_rules(path: &std::path::Path) -> Result<String, UsageError> {
    let meta = std::fs::metadata(path)
        .map_err(|e| usage(format!("--rules: cannot read {}: {e}", path.display())))?;
    if meta.len() > MAX_RULES_BYTES as u64 {
        return Err(usage(format!(
            "--rules: {} is {} bytes; a rules file may hold at most {MAX_RULES_BYTES}",
            path.display(),
            meta.len()
        )));
    }
    std::fs::read_to_string(path)
        .map_err(|e| usage(format!("--rules: cannot read {}: {e}", path.display())))
}

/// `K=V` → (K, V); `flag` names the flag in the error.
pub(crate) fn split_kv<'a>(
    flag: &str,
    text: &'a str,
    example: &str,
) -> Result<(&'a str, &'a str), UsageError> {
    match text.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim(), v)),
        _ => Err(usage(format!(
            "{flag}: `{text}` is not KEY=VALUE; write it like {flag} {example}"
        ))),
    }
}

pub(crate) fn parse_nodes(text: &str) -> Result<(u32, bool), UsageError> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("all") {
        return Ok((0, true));
    }
    let bad = |why: &str| {
        usage(format!(
            "--nodes: `{t}` {why}; give a number of nodes (1 or more) or `all`"
        ))
    };
    match t.parse::<i64>() {
        Ok(n) if n <= 0 => Err(bad("is not a node count")),
        Ok(n) => u32::try_from(n)
            .map(|n| (n, false))
            .map_err(|_| bad("is too large")),
        Err(_) => Err(bad("is not a number")),
    }
}

/// A duration flag outside the job spec (`watch --interval`, `local up --node-timeout`).
pub fn parse_interval(flag: &str, text: &str) -> Result<std::time::Duration, UsageError> {
    units::parse_duration(text).map_err(|m| usage(format!("{flag}: {m}")))
}

pub(crate) fn parse_duration_flag(flag: &str, text: &str) -> Result<u64, UsageError> {
    units::parse_duration(text)
        .map(|d| d.as_millis() as u64)
        .map_err(|m| usage(format!("{flag}: {m}")))
}

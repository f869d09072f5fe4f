//! Reading a suite file: the TOML as written ([`SuiteFile`]), and every
//! check that turns it into a [`Suite`] whose stages a worker can run. Kept
//! apart from the suite's types so that each rule sits beside the message
//! that names the field and the fix.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;

use super::{Stage, Suite, MAX_NAME, MAX_STAGES, MIN_TIMED_MS, PREFLIGHT};
use crate::catalogue::{err, SpecError, TypedParams};
use crate::limits::{MAX_DURATION_MS, MAX_SUITE_BYTES, MAX_TEXT};
use crate::spec::{workload, workload_names};
use crate::units::{format_duration_ms, parse_duration};

/// The file as written; [`SuiteFile::check`] makes a [`Suite`] of it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SuiteFile {
    name: String,
    #[serde(default)]
    about: String,
    duration: Option<String>,
    #[serde(default, rename = "stage")]
    stages: Vec<StageFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StageFile {
    name: String,
    workload: String,
    duration: Option<String>,
    estimate: Option<String>,
    #[serde(default)]
    params: BTreeMap<String, toml::Value>,
    #[serde(default)]
    gpu_params: BTreeMap<String, toml::Value>,
}

fn check_name(field: &str, name: &str, what: &str) -> Result<(), SpecError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if !ok {
        return Err(err(
            field,
            format!("`{name}` is not a {what} name; use 1 to {MAX_NAME} letters, digits, `-`, `_` and `.`"),
        ));
    }
    Ok(())
}

fn parse_ms(field: &str, text: &str) -> Result<u64, SpecError> {
    let ms = parse_duration(text).map_err(|m| err(field, m))?.as_millis();
    if ms > u128::from(MAX_DURATION_MS) {
        return Err(err(
            field,
            format!(
                "`{text}` is longer than {}; give a week or less",
                format_duration_ms(MAX_DURATION_MS)
            ),
        ));
    }
    Ok(ms as u64)
}

/// A table's values as the text `gpuctl submit --<param>` takes, keys written
/// with `_` (`max-bytes` is `max_bytes`).
fn scalars(
    field: &str,
    table: BTreeMap<String, toml::Value>,
) -> Result<BTreeMap<String, String>, SpecError> {
    let mut out = BTreeMap::new();
    for (key, value) in table {
        let key = key.replace('-', "_");
        let text = match value {
            toml::Value::String(s) => s,
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            other => {
                return Err(err(
                    format!("{field}.{key}"),
                    format!(
                        "a {} is no parameter value; give a string, number or true/false, as `gpuctl submit --{}` takes it",
                        other.type_str(),
                        key.replace('_', "-")
                    ),
                ))
            }
        };
        if out.insert(key.clone(), text).is_some() {
            return Err(err(
                format!("{field}.{key}"),
                "given twice (with `-` and with `_`); keep one",
            ));
        }
    }
    Ok(out)
}

impl StageFile {
    fn check(self) -> Result<Stage, SpecError> {
        let at = |f: &str| format!("stage `{}` {f}", self.name);
        let timed = if self.workload == PREFLIGHT {
            None
        } else {
            let def = workload(&self.workload).ok_or_else(|| {
                err(
                    at("workload"),
                    format!(
                        "unknown workload `{}`; choose {PREFLIGHT} or one of {}",
                        self.workload,
                        workload_names().join(", ")
                    ),
                )
            })?;
            Some(def.timed)
        };
        let params = scalars(&at("params"), self.params)?;
        let gpu_params = scalars(&at("gpu_params"), self.gpu_params)?;
        let estimate_ms = match (&self.estimate, timed) {
            (Some(_), Some(true)) => {
                return Err(err(
                    at("estimate"),
                    "a timed stage takes its duration; remove estimate",
                ))
            }
            (Some(e), _) => Some(parse_ms(&at("estimate"), e)?),
            (None, _) => None,
        };
        let (duration_ms, rest) = match (timed, self.duration.as_deref()) {
            (Some(true), None) => {
                return Err(err(
                    at("duration"),
                    format!(
                        "{} runs for a time; give one, e.g. duration = \"5m\", or \"rest\" for what is left of the suite's duration",
                        self.workload
                    ),
                ))
            }
            (Some(true), Some("rest")) => (None, true),
            (Some(true), Some(d)) => {
                let ms = parse_ms(&at("duration"), d)?;
                if ms < MIN_TIMED_MS {
                    return Err(err(at("duration"), format!("`{d}` is under a second; give 1s or more")));
                }
                (Some(ms), false)
            }
            (_, Some(_)) => {
                return Err(err(
                    at("duration"),
                    format!(
                        "{} runs until its work is done; remove duration (estimate = \"2m\" says how long it takes, for progress)",
                        self.workload
                    ),
                ))
            }
            (_, None) => (None, false),
        };
        if timed.is_none() && !(params.is_empty() && gpu_params.is_empty()) {
            return Err(err(
                at("params"),
                "the preflight stage judges each node's preflight checks and takes no parameters; remove them",
            ));
        }
        if timed.is_some() {
            // What a worker will build on either device: every value, and the
            // defaults they meet (a CPU's 16M max_bytes against a min_bytes).
            let cpu: HashMap<String, String> = params.clone().into_iter().collect();
            TypedParams::build(&self.workload, &cpu, false)
                .map_err(|e| in_table(&self.name, "params", e))?;
            let mut gpu = cpu;
            gpu.extend(gpu_params.clone());
            TypedParams::build(&self.workload, &gpu, true).map_err(|e| {
                let table = if gpu_params.contains_key(&key_of(&e.field)) {
                    "gpu_params"
                } else {
                    "params"
                };
                in_table(&self.name, table, e)
            })?;
        }
        Ok(Stage {
            name: self.name,
            workload: self.workload,
            duration_ms,
            rest,
            estimate_ms,
            params,
            gpu_params,
        })
    }
}

/// The parameter a catalogue error names by its flag (`--max-bytes`, `--param x`).
fn key_of(field: &str) -> String {
    field
        .trim_start_matches("--param ")
        .trim_start_matches("--")
        .replace('-', "_")
}

/// A catalogue error, named by where the suite file sets the value.
fn in_table(stage: &str, table: &str, e: SpecError) -> SpecError {
    err(
        format!("stage `{stage}` {table}.{}", key_of(&e.field)),
        e.message,
    )
}

impl SuiteFile {
    fn check(self) -> Result<Suite, SpecError> {
        check_name("name", &self.name, "suite")?;
        if self.about.len() > MAX_TEXT {
            return Err(err(
                "about",
                format!("{} bytes; at most {MAX_TEXT}", self.about.len()),
            ));
        }
        if self.stages.is_empty() {
            return Err(err(
                "stage",
                "a suite has no stages; add one or more [[stage]] tables",
            ));
        }
        if self.stages.len() > MAX_STAGES {
            return Err(err(
                "stage",
                format!(
                    "{} stages; at most {MAX_STAGES} (split the suite in two)",
                    self.stages.len()
                ),
            ));
        }
        let mut names: Vec<&str> = Vec::new();
        for (i, s) in self.stages.iter().enumerate() {
            check_name(&format!("stage {} name", i + 1), &s.name, "stage")?;
            if names.contains(&s.name.as_str()) {
                return Err(err(
                    format!("stage {} name", i + 1),
                    format!("`{}` names two stages; give each its own name", s.name),
                ));
            }
            names.push(&s.name);
        }
        let stages = self
            .stages
            .into_iter()
            .map(StageFile::check)
            .collect::<Result<Vec<_>, _>>()?;
        let rests: Vec<String> = stages
            .iter()
            .filter(|s| s.rest)
            .map(|s| s.name.clone())
            .collect();
        if let [first, second, ..] = &rests[..] {
            return Err(err(
                format!("stage `{second}` duration"),
                format!(
                    "stage `{first}` already takes the rest; one stage at most does, give this one a duration"
                ),
            ));
        }
        let mut suite = Suite {
            name: self.name,
            about: self.about,
            duration_ms: 0,
            stages,
        };
        suite.duration_ms = match (&self.duration, rests.first()) {
            (Some(d), _) => parse_ms("duration", d)?,
            (None, Some(r)) => {
                return Err(err(
                    "duration",
                    format!(
                        "stage `{r}` takes the rest of the suite's duration; give the suite one, e.g. duration = \"2h\" at the top"
                    ),
                ))
            }
            (None, None) => suite.estimate_ms(None),
        };
        suite.rest_ms(suite.duration_ms, "duration")?;
        Ok(suite)
    }
}

impl Suite {
    /// Reads and checks a suite file; every error names the field and the fix.
    pub fn parse(text: &str) -> Result<Suite, SpecError> {
        if text.len() > MAX_SUITE_BYTES {
            return Err(err(
                "suite",
                format!(
                    "{} bytes; a suite file is at most {} KiB",
                    text.len(),
                    MAX_SUITE_BYTES / 1024
                ),
            ));
        }
        let file: SuiteFile = toml::from_str(text).map_err(|e| {
            err(
                "suite",
                format!(
                    "not a suite file (docs/acceptance.md): {}",
                    e.to_string().trim_end()
                ),
            )
        })?;
        file.check()
    }
}

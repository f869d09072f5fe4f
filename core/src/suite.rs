//! Acceptance suites: a level (`quick`, `standard`, `burn-in`) or a user's file
//! is a list of stages, each a catalogue workload with its parameters (or the
//! nodes' preflight checks), run one after another on the same nodes. This
//! module reads and checks a suite file (TOML, docs/acceptance.md), turns its
//! stages into the job specs the coordinator submits, and says how long the
//! suite should take. It runs nothing itself.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;

use crate::catalogue::{err, NcclPattern, SpecError, TypedParams};
pub use crate::limits::MAX_SUITE_BYTES;
use crate::limits::{MAX_DURATION_MS, MAX_TEXT};
use crate::pb::JobSpec;
use crate::spec::{normalize, workload, workload_names};
use crate::units::{format_duration_ms, parse_duration};

/// The shipped levels, in order of length.
pub const LEVELS: &[&str] = &["quick", "standard", "burn-in"];

const BUILTIN: &[(&str, &str)] = &[
    ("quick", include_str!("../suites/quick.toml")),
    ("standard", include_str!("../suites/standard.toml")),
    ("burn-in", include_str!("../suites/burn-in.toml")),
];

/// The stage "workload" that runs no job: it judges each node's latest
/// preflight checks.
pub const PREFLIGHT: &str = "preflight";
/// Stages in one suite: each is a job, and a suite is read by people.
pub const MAX_STAGES: usize = 32;
/// A suite's or a stage's name.
pub const MAX_NAME: usize = 64;
/// The shortest timed stage: below a second a stress run measures nothing
/// (and 0 would mean the catalogue's default).
pub const MIN_TIMED_MS: u64 = 1_000;

/// What every job stage is expected to spend besides its work: workers
/// starting, CUDA contexts and NCCL communicators, the report.
pub const JOB_START_MS: u64 = 10_000;
/// A preflight stage without `estimate`: it reads checks the agents have.
pub const PREFLIGHT_MS: u64 = 5_000;
/// An untimed job stage without `estimate`.
pub const UNTIMED_MS: u64 = 60_000;

/// A checked suite.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suite {
    pub name: String,
    pub about: String,
    /// The nominal time; for a suite with a `rest` stage, the default total
    /// that `--duration` overrides. Without `duration` in the file: the
    /// estimate ([`Suite::estimate_ms`]).
    pub duration_ms: u64,
    pub stages: Vec<Stage>,
}

/// One stage: a workload run on the nodes still in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    /// Unique within the suite.
    pub name: String,
    /// A catalogue workload, or [`PREFLIGHT`].
    pub workload: String,
    /// A timed workload's run time (None for `rest` and untimed stages).
    pub duration_ms: Option<u64>,
    /// Runs for what is left of the suite's total (one stage at most).
    pub rest: bool,
    /// How long an untimed stage takes, for progress (`estimate` in the file).
    pub estimate_ms: Option<u64>,
    /// Parameters as `gpuctl submit` takes them, for every device.
    pub params: BTreeMap<String, String>,
    /// Laid over `params` when the suite runs on GPU nodes: sizes a CPU rank
    /// cannot run (a CPU keeps the catalogue's per-device default).
    pub gpu_params: BTreeMap<String, String>,
}

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

impl Stage {
    pub fn is_preflight(&self) -> bool {
        self.workload == PREFLIGHT
    }

    /// The fewest nodes the stage can run on (`pattern = "pairs"` and
    /// `"search"`: 2, `"bisect"`: 3, else 1): with fewer still in, the
    /// coordinator skips it.
    pub fn min_nodes(&self, gpu: bool) -> u32 {
        let pattern = gpu
            .then(|| self.gpu_params.get("pattern"))
            .flatten()
            .or(self.params.get("pattern"));
        pattern
            .and_then(|p| NcclPattern::parse(p))
            .map_or(1, |p| p.in_suite(2).min_nodes().0)
    }

    /// The expected time of any stage but the `rest` one, whose share
    /// depends on the total: a timed stage's duration, an untimed one's
    /// estimate ([`UNTIMED_MS`] without one), each job [`JOB_START_MS`] more;
    /// preflight its estimate or [`PREFLIGHT_MS`].
    fn fixed_estimate_ms(&self) -> u64 {
        if self.is_preflight() {
            return self.estimate_ms.unwrap_or(PREFLIGHT_MS);
        }
        JOB_START_MS + self.duration_ms.or(self.estimate_ms).unwrap_or(UNTIMED_MS)
    }
}

impl Suite {
    /// A shipped level: `quick`, `standard` or `burn-in`.
    pub fn builtin(level: &str) -> Result<Suite, SpecError> {
        let text = Self::builtin_text(level).ok_or_else(|| {
            err(
                "--level",
                format!(
                    "unknown level `{level}`; choose {} (or give your own with --suite FILE)",
                    LEVELS.join(", ")
                ),
            )
        })?;
        Suite::parse(text)
    }

    /// A shipped level's file, to show or to start one's own from.
    pub fn builtin_text(level: &str) -> Option<&'static str> {
        BUILTIN.iter().find(|(l, _)| *l == level).map(|(_, t)| *t)
    }

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

    fn has_rest(&self) -> bool {
        self.stages.iter().any(|s| s.rest)
    }

    /// The `rest` stage's run time out of `total`: what the other stages are
    /// expected to take ([`Stage::fixed_estimate_ms`]) and its own start are
    /// taken off, so that the whole suite takes about `total`. None without
    /// a `rest` stage; an error (named `field`) when less than a second is left.
    fn rest_ms(&self, total: u64, field: &str) -> Result<Option<u64>, SpecError> {
        let Some(rest) = self.stages.iter().find(|s| s.rest) else {
            return Ok(None);
        };
        let others: u64 = self
            .stages
            .iter()
            .filter(|s| !s.rest)
            .map(Stage::fixed_estimate_ms)
            .sum();
        let needed = others + JOB_START_MS + MIN_TIMED_MS;
        if total < needed {
            return Err(err(
                field,
                format!(
                    "{} leaves nothing for stage `{}`: the other stages take about {} and its own job {} to start; give at least {}",
                    format_duration_ms(total),
                    rest.name,
                    format_duration_ms(others),
                    format_duration_ms(JOB_START_MS),
                    format_duration_ms(needed)
                ),
            ));
        }
        Ok(Some(total - others - JOB_START_MS))
    }

    /// Each stage's expected time, in order (see [`Stage::fixed_estimate_ms`];
    /// the `rest` stage its share of `total_ms`, else of the suite's
    /// duration, 0 when nothing is left). `total_ms` means nothing to a suite
    /// without a `rest` stage.
    pub fn stage_estimates_ms(&self, total_ms: Option<u64>) -> Vec<u64> {
        let total = total_ms.unwrap_or(self.duration_ms);
        let rest = self.rest_ms(total, "").ok().flatten().unwrap_or(0);
        self.stages
            .iter()
            .map(|s| {
                if s.rest {
                    JOB_START_MS + rest
                } else {
                    s.fixed_estimate_ms()
                }
            })
            .collect()
    }

    /// The suite's expected wall time, for progress' "time left": the sum of
    /// [`Suite::stage_estimates_ms`] (with a `rest` stage, `total_ms` or the
    /// suite's duration).
    pub fn estimate_ms(&self, total_ms: Option<u64>) -> u64 {
        self.stage_estimates_ms(total_ms).iter().sum()
    }

    /// The job each stage submits, in order (None for preflight), checked
    /// with [`normalize`] as the coordinator checks a submitted job: on all
    /// nodes (the coordinator narrows them to those still in), named
    /// `suite/stage`. `total_ms` (`--duration`) sets the `rest` stage's time;
    /// `gpu` lays `gpu_params` over `params`.
    pub fn job_specs(
        &self,
        total_ms: Option<u64>,
        gpu: bool,
    ) -> Result<Vec<(String, Option<JobSpec>)>, SpecError> {
        if let (Some(t), false) = (total_ms, self.has_rest()) {
            return Err(err(
                "--duration",
                format!(
                    "suite `{}` has no stage that takes the rest of the time, so {} would change nothing; leave --duration out (burn-in takes it)",
                    self.name,
                    format_duration_ms(t)
                ),
            ));
        }
        let total = total_ms.unwrap_or(self.duration_ms);
        if total > MAX_DURATION_MS {
            return Err(err(
                "--duration",
                format!(
                    "{} is longer than {}; give a week or less",
                    format_duration_ms(total),
                    format_duration_ms(MAX_DURATION_MS)
                ),
            ));
        }
        let rest = self.rest_ms(total, "--duration")?;
        self.stages
            .iter()
            .map(|s| {
                if s.is_preflight() {
                    return Ok((s.name.clone(), None));
                }
                let mut params: HashMap<String, String> = s.params.clone().into_iter().collect();
                if gpu {
                    params.extend(s.gpu_params.clone());
                }
                let spec = JobSpec {
                    workload: s.workload.clone(),
                    all_nodes: true,
                    duration_ms: if s.rest {
                        rest.unwrap_or(0)
                    } else {
                        s.duration_ms.unwrap_or(0)
                    },
                    params,
                    name: format!("{}/{}", self.name, s.name),
                    ..Default::default()
                };
                let spec = normalize(&spec)
                    .map_err(|e| err(format!("stage `{}` {}", s.name, e.field), e.message))?;
                Ok((s.name.clone(), Some(spec)))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue::{NcclParams, StressParams};

    /// A suite of one stage: `stage` is the body of its `[[stage]]` table.
    fn one(stage: &str) -> Result<Suite, SpecError> {
        Suite::parse(&format!("name = \"t\"\n[[stage]]\n{stage}\n"))
    }

    fn refused(text: &str) -> SpecError {
        Suite::parse(text).expect_err(text)
    }

    /// What a worker builds from a spec on that device.
    fn typed(spec: &JobSpec, gpu: bool) -> TypedParams {
        TypedParams::build(&spec.workload, &spec.params, gpu)
            .unwrap_or_else(|e| panic!("{} gpu={gpu}: {e}", spec.name))
    }

    #[test]
    fn the_levels_parse_and_take_about_their_time() {
        for level in LEVELS {
            let s = Suite::builtin(level).unwrap_or_else(|e| panic!("{level}: {e}"));
            assert_eq!(s.name, *level);
            assert!(s.stages[0].is_preflight(), "{level}");
            let (est, nominal) = (s.estimate_ms(None), s.duration_ms);
            assert!(
                est.abs_diff(nominal) <= nominal / 3,
                "{level}: estimate {est} ms, stated {nominal} ms"
            );
        }
        let quick = Suite::builtin("quick").unwrap();
        assert_eq!(quick.duration_ms, 120_000);
        let names: Vec<&str> = quick.stages.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["preflight", "stress", "all_reduce", "links", "p2p"]);
        let standard = Suite::builtin("standard").unwrap();
        assert_eq!(standard.duration_ms, 15 * 60_000);
        assert_eq!(standard.stages.len(), 6);
    }

    #[test]
    fn burn_in_is_standard_then_memory_for_the_rest() {
        let standard = Suite::builtin("standard").unwrap();
        let burn = Suite::builtin("burn-in").unwrap();
        assert_eq!(burn.duration_ms, 2 * 3_600_000);
        let (last, first) = burn.stages.split_last().unwrap();
        assert_eq!(
            first,
            &standard.stages[..],
            "burn-in repeats standard's stages"
        );
        assert!(last.rest && last.workload == "stress");
        assert_eq!(burn.estimate_ms(None), burn.duration_ms);
        let specs = burn.job_specs(None, true).unwrap();
        let memory = specs.last().unwrap().1.as_ref().unwrap();
        let TypedParams::Stress(StressParams { target_memory, .. }) = typed(memory, true) else {
            panic!()
        };
        assert_eq!(
            target_memory,
            Some(crate::catalogue::MemoryTarget::Fraction(0.9))
        );
    }

    #[test]
    fn every_level_gives_specs_a_worker_runs_on_either_device() {
        for level in LEVELS {
            let s = Suite::builtin(level).unwrap();
            for gpu in [false, true] {
                let specs = s.job_specs(None, gpu).unwrap();
                assert_eq!(specs.len(), s.stages.len());
                for ((name, spec), stage) in specs.iter().zip(&s.stages) {
                    assert_eq!(name, &stage.name);
                    match spec {
                        None => assert!(stage.is_preflight()),
                        Some(spec) => {
                            assert!(spec.all_nodes);
                            assert_eq!(normalize(spec).as_ref(), Ok(spec), "already normal");
                            typed(spec, gpu);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn quick_runs_cpu_sizes_on_a_cpu_and_gpu_sizes_on_a_gpu() {
        let quick = Suite::builtin("quick").unwrap();
        let cpu = quick.job_specs(None, false).unwrap();
        let gpu = quick.job_specs(None, true).unwrap();
        assert!(
            cpu[0].1.is_none() && gpu[0].1.is_none(),
            "preflight runs no job"
        );
        let stress = cpu[1].1.as_ref().unwrap();
        assert_eq!(
            (stress.workload.as_str(), stress.duration_ms),
            ("stress", 30_000)
        );
        assert_eq!(stress.name, "quick/stress");
        let TypedParams::Stress(s) = typed(stress, false) else {
            panic!()
        };
        assert_eq!(s.size, 256, "a CPU rank's own size");
        let TypedParams::Stress(s) = typed(gpu[1].1.as_ref().unwrap(), true) else {
            panic!()
        };
        assert_eq!(s.size, 8192);
        for (specs, on_gpu, max) in [(&cpu, false, 16u64 << 20), (&gpu, true, 256 << 20)] {
            let TypedParams::Nccl(NcclParams { ops, max_bytes, .. }) =
                typed(specs[2].1.as_ref().unwrap(), on_gpu)
            else {
                panic!()
            };
            assert_eq!((ops, max_bytes), (vec!["all_reduce".to_string()], max));
            let TypedParams::Nccl(p) = typed(specs[3].1.as_ref().unwrap(), on_gpu) else {
                panic!()
            };
            assert_eq!((p.pattern, p.max_bytes), (NcclPattern::Search, max));
            assert_eq!(p.slow_ratio, if on_gpu { 0.8 } else { 0.5 });
        }
        // Two nodes measure their link as pairs.
        assert_eq!(quick.stages[3].min_nodes(true), 2, "links");
        assert_eq!(quick.stages[1].min_nodes(false), 1);
    }

    #[test]
    fn rest_is_what_the_other_stages_leave() {
        let burn = Suite::builtin("burn-in").unwrap();
        let others: u64 = burn.stage_estimates_ms(None)[..burn.stages.len() - 1]
            .iter()
            .sum();
        // preflight 5 s; stress 5 m; nccl 2 m; links 1 m; ddp 2 m; maxbatch 1.5 m; five job starts.
        assert_eq!(
            others,
            5_000 + (300 + 120 + 60 + 120 + 90) * 1_000 + 5 * JOB_START_MS
        );
        let three_h = 3 * 3_600_000;
        let specs = burn.job_specs(Some(three_h), true).unwrap();
        let memory = specs.last().unwrap().1.as_ref().unwrap();
        assert_eq!(memory.duration_ms, three_h - others - JOB_START_MS);
        assert_eq!(burn.estimate_ms(Some(three_h)), three_h);
        assert_eq!(
            specs[1].1.as_ref().unwrap().duration_ms,
            300_000,
            "others keep theirs"
        );
        let e = burn.job_specs(Some(10 * 60_000), true).unwrap_err();
        assert_eq!(e.field, "--duration");
        assert!(
            e.message
                .contains("10m 00s leaves nothing for stage `memory`")
                && e.message.contains("about 12m 25s and its own job 10.0s")
                && e.message.contains("at least 12m 36s"),
            "{e}"
        );
        let e = burn.job_specs(Some(8 * 86_400_000), true).unwrap_err();
        assert!(e.message.contains("a week or less"), "{e}");
        // A suite without a rest stage has no use for a total.
        let quick = Suite::builtin("quick").unwrap();
        let e = quick.job_specs(Some(three_h), false).unwrap_err();
        assert_eq!(e.field, "--duration");
        assert!(e.message.contains("leave --duration out"), "{e}");
        assert_eq!(quick.estimate_ms(Some(three_h)), quick.estimate_ms(None));
        // The file's own duration must leave something too.
        let e = refused(
            "name = \"t\"\nduration = \"20s\"\n[[stage]]\nname = \"a\"\nworkload = \"stress\"\nduration = \"30s\"\n\
             [[stage]]\nname = \"b\"\nworkload = \"stress\"\nduration = \"rest\"\n",
        );
        assert_eq!(e.field, "duration");
        assert!(
            e.message.contains("20.0s leaves nothing for stage `b`"),
            "{e}"
        );
    }

    #[test]
    fn a_users_file_replaces_a_level() {
        let text = r#"
            name = "quick-ib"
            about = "quick with pairs at 1 GiB on one rail"
            [[stage]]
            name = "stress"
            workload = "stress"
            duration = "10s"
            params = { with-comm = "yes", check_every = 5 }
            gpu_params = { size = 16384 }
            [[stage]]
            name = "pairs"
            workload = "nccl"
            params = { pattern = "pairs", max_bytes = "1G", slow_ratio = 0.7 }
        "#;
        let s = Suite::parse(text).unwrap();
        let stress = &s.stages[0];
        assert_eq!(stress.params["with_comm"], "yes");
        assert_eq!(stress.params["check_every"], "5");
        assert_eq!(stress.gpu_params["size"], "16384");
        assert_eq!(s.stages[1].params["slow_ratio"], "0.7");
        // No duration given: the estimate, 10 s + 60 s and two job starts.
        assert_eq!(s.duration_ms, 10_000 + 60_000 + 2 * JOB_START_MS);
        let specs = s.job_specs(None, true).unwrap();
        let spec = specs[0].1.as_ref().unwrap();
        assert_eq!(spec.params["with_comm"], "true", "normalized");
        let TypedParams::Stress(p) = typed(spec, true) else {
            panic!()
        };
        assert_eq!((p.size, p.check_every, p.with_comm), (16384, 5, true));
        let TypedParams::Stress(p) = typed(
            s.job_specs(None, false).unwrap()[0].1.as_ref().unwrap(),
            false,
        ) else {
            panic!()
        };
        assert_eq!(p.size, 256, "gpu_params stay off a CPU");
    }

    #[test]
    fn the_examples_in_the_docs_parse() {
        let doc = include_str!("../../docs/acceptance.md");
        let blocks: Vec<&str> = doc
            .split("```toml\n")
            .skip(1)
            .map(|b| b.split("```").next().unwrap())
            .collect();
        assert_eq!(blocks.len(), 2);
        for b in blocks {
            Suite::parse(b).unwrap_or_else(|e| panic!("{e}\n{b}"));
        }
    }

    #[test]
    fn unknown_levels_name_the_three() {
        let e = Suite::builtin("thorough").unwrap_err();
        assert_eq!(e.field, "--level");
        assert!(
            e.message.contains("`thorough`") && e.message.contains("quick, standard, burn-in"),
            "{e}"
        );
        assert!(Suite::builtin_text("burn-in")
            .unwrap()
            .contains("target_memory"));
    }

    #[test]
    fn bad_stages_are_refused_with_the_field_and_the_fix() {
        let cases: &[(&str, &str, &str)] = &[
            ("name = \"a\"\nworkload = \"burn\"", "stage `a` workload", "choose preflight or one of stress"),
            ("name = \"a\"\nworkload = \"stress\"", "stage `a` duration", "e.g. duration = \"5m\""),
            ("name = \"a\"\nworkload = \"stress\"\nduration = \"soon\"", "stage `a` duration", "`soon` is not a duration"),
            ("name = \"a\"\nworkload = \"stress\"\nduration = \"500ms\"", "stage `a` duration", "give 1s or more"),
            ("name = \"a\"\nworkload = \"stress\"\nduration = \"8d\"", "stage `a` duration", "a week or less"),
            ("name = \"a\"\nworkload = \"nccl\"\nduration = \"1m\"", "stage `a` duration", "remove duration"),
            ("name = \"a\"\nworkload = \"stress\"\nduration = \"1m\"\nestimate = \"2m\"", "stage `a` estimate", "remove estimate"),
            ("name = \"a\"\nworkload = \"stress\"\nduration = \"1m\"\nparams = { factor = 2 }", "stage `a` params.factor", "has no parameter `factor`; it takes size"),
            ("name = \"a\"\nworkload = \"stress\"\nduration = \"1m\"\nparams = { size = 8 }", "stage `a` params.size", "give 16..=65536"),
            ("name = \"a\"\nworkload = \"stress\"\nduration = \"1m\"\ngpu_params = { precision = \"fp64\" }", "stage `a` gpu_params.precision", "not one of bf16"),
            ("name = \"a\"\nworkload = \"stress\"\nduration = \"1m\"\nparams = { size = [1] }", "stage `a` params.size", "give a string, number or true/false"),
            ("name = \"a\"\nworkload = \"stress\"\nduration = \"1m\"\nparams = { with_comm = 1, with-comm = 0 }", "stage `a` params.with_comm", "given twice"),
            // A CPU's default max_bytes (16M) is below this min_bytes.
            ("name = \"a\"\nworkload = \"nccl\"\nparams = { min_bytes = \"64M\" }", "stage `a` params.min_bytes", "swap them"),
            ("name = \"a\"\nworkload = \"preflight\"\nparams = { size = 1 }", "stage `a` params", "takes no parameters"),
            ("name = \"a\"\nworkload = \"stress\"\nduration = \"rest\"", "duration", "give the suite one, e.g. duration = \"2h\""),
            ("name = \"a b\"\nworkload = \"preflight\"", "stage 1 name", "letters, digits"),
            ("name = \"a\"\nworkload = \"preflight\"\nsize = 3", "suite", "unknown field `size`"),
        ];
        for (stage, field, fix) in cases {
            let e = one(stage).expect_err(stage);
            assert_eq!(&e.field, field, "{stage}: {e}");
            assert!(e.message.contains(fix), "{stage}: {e}");
        }
    }

    #[test]
    fn bad_suites_are_refused_with_the_field_and_the_fix() {
        let stage = |name: &str, duration: &str| {
            format!(
                "[[stage]]\nname = \"{name}\"\nworkload = \"stress\"\nduration = \"{duration}\"\n"
            )
        };
        let head = "name = \"t\"\nduration = \"1h\"\n";
        let e = refused(&format!(
            "{head}{}{}",
            stage("a", "rest"),
            stage("b", "rest")
        ));
        assert_eq!(e.field, "stage `b` duration");
        assert!(
            e.message.contains("stage `a` already takes the rest"),
            "{e}"
        );
        let e = refused(&format!("{head}{}{}", stage("a", "1m"), stage("a", "2m")));
        assert_eq!(e.field, "stage 2 name");
        assert!(e.message.contains("`a` names two stages"), "{e}");
        let many: String = (0..=MAX_STAGES)
            .map(|i| stage(&format!("s{i}"), "1s"))
            .collect();
        let e = refused(&format!("{head}{many}"));
        assert_eq!(e.field, "stage");
        assert!(e.message.contains("33 stages; at most 32"), "{e}");
        let e = refused(head);
        assert!(e.message.contains("add one or more [[stage]]"), "{e}");
        let big = format!(
            "{head}# {}\n{}",
            "x".repeat(MAX_SUITE_BYTES),
            stage("a", "1m")
        );
        let e = refused(&big);
        assert_eq!(e.field, "suite");
        assert!(e.message.contains("at most 64 KiB"), "{e}");
        let e = refused(&format!("name = \"\"\n{}", stage("a", "1m")));
        assert_eq!(e.field, "name");
        let e = refused("name = \"t\"\n[[stage]]\nname = \"a\"\n");
        assert_eq!(e.field, "suite");
        assert!(e.message.contains("missing field `workload`"), "{e}");
        // Exactly 32 stages are fine.
        let many: String = (0..MAX_STAGES)
            .map(|i| stage(&format!("s{i}"), "1s"))
            .collect();
        assert_eq!(
            Suite::parse(&format!("{head}{many}")).unwrap().stages.len(),
            32
        );
    }
}

//! Performance rules: the ratios each metric is judged by and the floors per
//! GPU model. The built-in set is `coordinator/rules/performance.toml`;
//! `gpuctl-coordinator --rules FILE` and `gpuctl submit --rules FILE` lay
//! files of the same form over it. Unknown keys are errors, so a typo cannot
//! silently fall back to a default.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context};
use serde::Deserialize;

use crate::judge::metric::Metric;

/// The built-in rules, shipped with the binary.
pub const BUILTIN: &str = include_str!("../../../../rules/performance.toml");

/// Largest rules text accepted from a job spec or a suite.
pub use gpuctl_core::limits::MAX_RULES_BYTES;

/// How one metric is judged against the fleet and a baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricRule {
    pub fail: f64,
    pub warn: f64,
    /// Compare ranks with the median of their device class.
    pub fleet: bool,
    /// Ratios against a baseline; the fleet ratios when left out.
    pub baseline_fail: Option<f64>,
    pub baseline_warn: Option<f64>,
    /// Fleet ratios for CPU ranks; the fleet ratios when left out. CPU
    /// ranks share cores with each other and with whatever else the host
    /// runs (a local fleet puts 8 ranks on 2 cores), so a healthy one lands
    /// at ~0.85x of the others now and then, which a GPU does not.
    pub cpu_fail: Option<f64>,
    pub cpu_warn: Option<f64>,
}

impl Default for MetricRule {
    fn default() -> Self {
        MetricRule {
            fail: 0.90,
            warn: 0.95,
            fleet: true,
            baseline_fail: None,
            baseline_warn: None,
            cpu_fail: None,
            cpu_warn: None,
        }
    }
}

impl MetricRule {
    pub fn baseline_fail(&self) -> f64 {
        self.baseline_fail.unwrap_or(self.fail)
    }

    pub fn baseline_warn(&self) -> f64 {
        self.baseline_warn.unwrap_or(self.warn)
    }

    /// (fail, warn) against the fleet for a CPU rank (`cpu`) or a GPU one.
    pub fn fleet_ratios(&self, cpu: bool) -> (f64, f64) {
        if cpu {
            (
                self.cpu_fail.unwrap_or(self.fail),
                self.cpu_warn.unwrap_or(self.warn),
            )
        } else {
            (self.fail, self.warn)
        }
    }
}

/// A figure a GPU model must reach.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Floor {
    /// GPU model as NVML names it (`NVIDIA H200`), compared without regard to case.
    pub gpu: String,
    pub metric: String,
    pub key: String,
    pub fail: f64,
    #[serde(default)]
    pub warn: Option<f64>,
    /// Only for jobs on one node (a link inside the host).
    #[serde(default)]
    pub single_node: bool,
    /// Where the value comes from and when it was measured.
    #[serde(default)]
    pub source: String,
}

impl Floor {
    /// Whether this floor is for a GPU of `model` in a job on one node or
    /// not. The judge (`floors.rs`) and a certificate's figures
    /// (`cert/issue.rs`) both ask it, with [`Floor::lone_link`], so the two
    /// cannot choose different floors.
    pub fn fits(&self, model: &str, single_node: bool) -> bool {
        self.gpu.eq_ignore_ascii_case(model) && (!self.single_node || single_node)
    }

    /// One rank moves nothing over a link: nccl-tests' bus bandwidth is 0
    /// by its formula (2(n-1)/n), and a healthy one-GPU host failed on it.
    pub fn lone_link(metric: Metric, ranks: usize) -> bool {
        metric == Metric::Busbw && ranks < 2
    }
}

/// A `[metrics.NAME]` table: the keys it names replace the current ones.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct MetricFile {
    fail: Option<f64>,
    warn: Option<f64>,
    fleet: Option<bool>,
    baseline_fail: Option<f64>,
    baseline_warn: Option<f64>,
    cpu_fail: Option<f64>,
    cpu_warn: Option<f64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct FleetFile {
    min_ranks: Option<usize>,
    min_intervals: Option<u32>,
    drift: Option<f64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct LinksFile {
    slow: Option<f64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct P2pFile {
    slow: Option<f64>,
    cpu_slow: Option<f64>,
    direction: Option<f64>,
    cpu_direction: Option<f64>,
}

/// One rules file as written: everything optional, laid over what is there.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RulesFile {
    fleet: FleetFile,
    links: LinksFile,
    p2p: P2pFile,
    metrics: BTreeMap<String, MetricFile>,
    floors: Vec<Floor>,
    builtin_floors: Option<bool>,
}

/// The rules a job is judged by.
#[derive(Debug, Clone, PartialEq)]
pub struct PerfRules {
    pub fleet_min_ranks: usize,
    /// Stress ranks with fewer sampling intervals are not compared.
    pub fleet_min_intervals: u32,
    /// A link below this share of the job's median link is slow.
    pub link_slow_ratio: f64,
    /// `p2p`: a GPU pair below this share of the job's upper-quartile pair
    /// is slow (GPU ranks, and CPU ranks').
    pub p2p: crate::judge::checks::p2p::Ratios,
    /// `gpuctl fleet`: a node's last figure under this share of the median of
    /// its previous runs is flagged as drift.
    pub drift_tolerance: f64,
    pub metrics: BTreeMap<Metric, MetricRule>,
    pub floors: Vec<Floor>,
}

impl Default for PerfRules {
    /// The built-in rules.
    fn default() -> Self {
        PerfRules::bare()
            .overlay(BUILTIN)
            .expect("the built-in performance rules parse")
    }
}

impl PerfRules {
    fn bare() -> PerfRules {
        PerfRules {
            fleet_min_ranks: 3,
            fleet_min_intervals: 5,
            link_slow_ratio: 0.8,
            p2p: crate::judge::checks::p2p::Ratios {
                slow: 0.8,
                cpu_slow: 0.3,
                direction: 0.6,
                cpu_direction: 0.0,
            },
            drift_tolerance: 0.9,
            metrics: Metric::ALL
                .into_iter()
                .map(|m| {
                    let rule = MetricRule {
                        fleet: m.per_rank(),
                        ..Default::default()
                    };
                    (m, rule)
                })
                .collect(),
            floors: Vec::new(),
        }
    }

    /// The rule of one metric.
    pub fn metric(&self, m: Metric) -> &MetricRule {
        &self.metrics[&m]
    }

    /// Reads a rules file over the built-in rules.
    pub fn load(path: &Path) -> anyhow::Result<PerfRules> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read --rules {}", path.display()))?;
        PerfRules::default()
            .overlay(&text)
            .with_context(|| format!("--rules {}", path.display()))
    }

    /// These rules with a TOML text laid over them.
    pub fn overlay(&self, text: &str) -> anyhow::Result<PerfRules> {
        if text.len() > MAX_RULES_BYTES {
            bail!(
                "rules of {} bytes; at most {MAX_RULES_BYTES} are accepted",
                text.len()
            );
        }
        let file: RulesFile = toml::from_str(text).context("not valid performance rules TOML")?;
        let mut out = self.clone();
        if let Some(n) = file.fleet.min_ranks {
            if n < 2 {
                bail!("fleet.min_ranks = {n}: a median needs 2 ranks or more (3 is the default)");
            }
            out.fleet_min_ranks = n;
        }
        if let Some(n) = file.fleet.min_intervals {
            out.fleet_min_intervals = n;
        }
        if let Some(d) = file.fleet.drift {
            if !(d > 0.0 && d <= 1.0) {
                bail!("[fleet] drift = {d}: a ratio between 0 and 1 (0.9 flags a node 10 % under its own history)");
            }
            out.drift_tolerance = d;
        }
        if let Some(s) = file.links.slow {
            if !(s > 0.0 && s <= 1.0) {
                bail!("[links] slow = {s}: a ratio between 0 and 1 (0.8 means 80 % of the median link)");
            }
            out.link_slow_ratio = s;
        }
        for (field, v, into) in [
            ("slow", file.p2p.slow, &mut out.p2p.slow),
            ("cpu_slow", file.p2p.cpu_slow, &mut out.p2p.cpu_slow),
        ] {
            if let Some(s) = v {
                if !(s > 0.0 && s <= 1.0) {
                    bail!("[p2p] {field} = {s}: a ratio between 0 and 1 (0.8 means 80 % of the job's upper-quartile pair)");
                }
                *into = s;
            }
        }
        for (field, v, into) in [
            ("direction", file.p2p.direction, &mut out.p2p.direction),
            (
                "cpu_direction",
                file.p2p.cpu_direction,
                &mut out.p2p.cpu_direction,
            ),
        ] {
            if let Some(s) = v {
                if !(0.0..=1.0).contains(&s) {
                    bail!("[p2p] {field} = {s}: a ratio between 0 and 1 (0.6: a direction under 60 % of its reverse is slow; 0: not compared)");
                }
                *into = s;
            }
        }
        for (name, over) in file.metrics {
            let Some(m) = Metric::from_name(&name) else {
                bail!(
                    "[metrics.{name}]: unknown metric; the metrics are {}",
                    names()
                );
            };
            let mut rule = out.metrics[&m].clone();
            rule.fail = over.fail.unwrap_or(rule.fail);
            rule.warn = over.warn.unwrap_or(rule.warn);
            rule.fleet = over.fleet.unwrap_or(rule.fleet);
            rule.baseline_fail = over.baseline_fail.or(rule.baseline_fail);
            rule.baseline_warn = over.baseline_warn.or(rule.baseline_warn);
            rule.cpu_fail = over.cpu_fail.or(rule.cpu_fail);
            rule.cpu_warn = over.cpu_warn.or(rule.cpu_warn);
            check_ratios(&name, &rule)?;
            if rule.fleet && !m.per_rank() {
                bail!("[metrics.{name}] fleet = true: {name} is made by all ranks together, so ranks cannot be compared with each other");
            }
            out.metrics.insert(m, rule);
        }
        if file.builtin_floors == Some(false) {
            out.floors.clear();
        }
        for (i, f) in file.floors.into_iter().enumerate() {
            check_floor(i, &f)?;
            out.floors.push(f);
        }
        Ok(out)
    }
}

fn names() -> String {
    Metric::ALL
        .iter()
        .map(|m| m.name())
        .collect::<Vec<_>>()
        .join(", ")
}

fn check_ratios(name: &str, r: &MetricRule) -> anyhow::Result<()> {
    for (field, fail, warn) in [
        ("fail/warn", Some(r.fail), Some(r.warn)),
        (
            "baseline_fail/baseline_warn",
            r.baseline_fail,
            r.baseline_warn,
        ),
        ("cpu_fail/cpu_warn", r.cpu_fail, r.cpu_warn),
    ] {
        for v in [fail, warn].into_iter().flatten() {
            if !(v > 0.0 && v <= 1.0) {
                bail!("[metrics.{name}] {field} = {v}: a ratio between 0 and 1 (0.9 means 90 % of the reference)");
            }
        }
        if let (Some(f), Some(w)) = (fail, warn) {
            if f > w {
                bail!("[metrics.{name}] {field}: fail ({f}) is above warn ({w}); fail must be the lower ratio");
            }
        }
    }
    Ok(())
}

fn check_floor(i: usize, f: &Floor) -> anyhow::Result<()> {
    let at = format!("[[floors]] #{} ({} {})", i + 1, f.gpu, f.metric);
    let Some(m) = Metric::from_name(&f.metric) else {
        bail!(
            "{at}: unknown metric `{}`; the metrics are {}",
            f.metric,
            names()
        );
    };
    if f.gpu.trim().is_empty() || f.key.trim().is_empty() {
        bail!("{at}: `gpu` and `key` must not be empty");
    }
    if !(f.fail.is_finite() && f.fail > 0.0) {
        bail!("{at}: fail = {}: a positive figure", f.fail);
    }
    if let Some(w) = f.warn {
        let ordered = if m.higher_is_better() {
            w >= f.fail
        } else {
            w <= f.fail
        };
        if !ordered {
            bail!(
                "{at}: warn = {w} lies beyond fail = {}; warn is the milder limit",
                f.fail
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_rules_parse_with_sources() {
        let r = PerfRules::default();
        assert_eq!(r.fleet_min_ranks, 3);
        assert!(!r.floors.is_empty());
        assert!(r.floors.iter().all(|f| !f.source.is_empty()));
        assert!(r.metric(Metric::StressTflops).fleet);
        assert!(!r.metric(Metric::Busbw).fleet);
    }

    #[test]
    fn overlay_adds_floors_and_replaces_metrics() {
        let base = PerfRules::default();
        let r = base
            .overlay(
                r#"
[metrics.stress_tflops]
fail = 0.5
warn = 0.6
[[floors]]
gpu = "Intel Xeon"
metric = "stress_tflops"
key = "fp32 256"
fail = 1000.0
"#,
            )
            .unwrap();
        assert_eq!(r.metric(Metric::StressTflops).fail, 0.5);
        assert_eq!(r.floors.len(), base.floors.len() + 1);
        let r = base.overlay("builtin_floors = false").unwrap();
        assert!(r.floors.is_empty());
    }

    #[test]
    fn bad_rules_name_the_key() {
        let base = PerfRules::default();
        for (text, want) in [
            ("[metrics.tflops]\nfail = 0.9", "unknown metric"),
            (
                "[metrics.stress_tflops]\nfail = 0.99\nwarn = 0.9",
                "fail (0.99) is above warn",
            ),
            (
                "[metrics.stress_tflops]\nfail = 9",
                "a ratio between 0 and 1",
            ),
            ("[metrics.busbw]\nfleet = true", "all ranks together"),
            ("[fleet]\nmin_ranks = 1", "min_ranks"),
            (
                "[[floors]]\ngpu = \"x\"\nmetric = \"busbw\"\nkey = \"k\"\nfail = -1.0",
                "positive",
            ),
            ("bogus = 1", "unknown field"),
        ] {
            let e = format!("{:#}", base.overlay(text).unwrap_err());
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}

//! The planner's side of a suite: how long each stage and the whole suite
//! are expected to take (progress' "time left", and the share a `rest`
//! stage gets of `--duration`), and the job specs the coordinator submits
//! stage by stage. Apart from parsing because it is arithmetic on a
//! checked suite, and the coordinator and the CLI both lean on it.

use std::collections::HashMap;

use super::{Stage, Suite, JOB_START_MS, MIN_TIMED_MS, PREFLIGHT_MS, UNTIMED_MS};
use crate::catalogue::{err, SpecError};
use crate::limits::MAX_DURATION_MS;
use crate::spec::normalize;
use crate::units::format_duration_ms;
use gpuctl_proto::pb::JobSpec;

impl Stage {
    /// The expected time of any stage but the `rest` one, whose share
    /// depends on the total: a timed stage's duration, an untimed one's
    /// estimate ([`UNTIMED_MS`] without one), each job [`JOB_START_MS`] more;
    /// preflight its estimate or [`PREFLIGHT_MS`].
    pub(super) fn fixed_estimate_ms(&self) -> u64 {
        if self.is_preflight() {
            return self.estimate_ms.unwrap_or(PREFLIGHT_MS);
        }
        JOB_START_MS + self.duration_ms.or(self.estimate_ms).unwrap_or(UNTIMED_MS)
    }
}

impl Suite {
    fn has_rest(&self) -> bool {
        self.stages.iter().any(|s| s.rest)
    }

    /// The `rest` stage's run time out of `total`: what the other stages are
    /// expected to take ([`Stage::fixed_estimate_ms`]) and its own start are
    /// taken off, so that the whole suite takes about `total`. None without
    /// a `rest` stage; an error (named `field`) when less than a second is left.
    pub(super) fn rest_ms(&self, total: u64, field: &str) -> Result<Option<u64>, SpecError> {
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

//! Baselines: a finished job's figures kept under a name (`gpuctl baseline
//! save`), read back, listed and deleted. They live in the store beside the
//! jobs; a job submitted with `--baseline NAME` copies the baseline as it is
//! then (see the scheduler's submit).

use gpuctl_proto::pb::{Baseline, JobState, Verdict};

use crate::error::CoordinatorError;
use crate::judge::figures;
use crate::scheduler::{Query, SchedulerHandle};
use crate::store::StateStore;

/// Longest baseline name.
const MAX_NAME: usize = 64;

fn check_name(name: &str) -> Result<&str, CoordinatorError> {
    let name = name.trim();
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok {
        Ok(name)
    } else {
        Err(CoordinatorError::InvalidField {
            field: "--name".into(),
            message: format!(
                "`{name}` is not a baseline name; use 1 to {MAX_NAME} letters, digits, `-`, `_` or `.`"
            ),
        })
    }
}

fn store_err(doing: &str) -> impl FnOnce(crate::store::StoreError) -> CoordinatorError + '_ {
    move |e| CoordinatorError::store(doing, e)
}

/// Keeps a finished job's figures under `name`.
pub async fn save(
    sched: &SchedulerHandle,
    store: &StateStore,
    job_id: String,
    name: &str,
    replace: bool,
) -> Result<Baseline, CoordinatorError> {
    let name = check_name(name)?.to_string();
    let report = sched
        .ask(|reply| Query::GetReport {
            job_id: job_id.clone(),
            reply,
        })
        .await??;
    let refuse = |why: String| Err(CoordinatorError::Refused(why));
    if report.state() != JobState::Succeeded {
        return refuse(format!(
            "job {job_id} is {}; a baseline is saved from a job that succeeded",
            report.state().label()
        ));
    }
    if report.verdict() == Verdict::Fail {
        return refuse(format!(
            "job {job_id} failed its verdict ({}); a baseline from it would make failures the norm",
            report.reason
        ));
    }
    let judged = figures::of_report(&report);
    let figures = figures::baseline_figures(&judged.ranks, &judged.job);
    if figures.is_empty() {
        return refuse(format!(
            "job {job_id} ({}) produced no figures to keep",
            report.workload
        ));
    }
    if !replace
        && store
            .baseline(&name)
            .await
            .map_err(store_err("could not read baselines"))?
            .is_some()
    {
        return refuse(format!(
            "a baseline `{name}` exists; pass --replace to overwrite it or choose another name"
        ));
    }
    let b = Baseline {
        name,
        job_id,
        workload: report.workload.clone(),
        created_unix_ms: sched.clock().now_ms(),
        figures,
    };
    store
        .put_baseline(&b)
        .await
        .map_err(store_err("could not store the baseline"))?;
    Ok(b)
}

pub async fn get(store: &StateStore, name: &str) -> Result<Baseline, CoordinatorError> {
    let name = check_name(name)?;
    store
        .baseline(name)
        .await
        .map_err(store_err("could not read the baseline"))?
        .ok_or_else(|| CoordinatorError::BaselineNotFound(name.to_string()))
}

pub async fn list(store: &StateStore) -> Result<Vec<Baseline>, CoordinatorError> {
    store
        .baselines()
        .await
        .map_err(store_err("could not read baselines"))
}

/// Deletes a baseline and returns what it held. Jobs that were judged
/// against it keep their copy.
pub async fn delete(store: &StateStore, name: &str) -> Result<Baseline, CoordinatorError> {
    let b = get(store, name).await?;
    store
        .delete_baseline(&b.name)
        .await
        .map_err(store_err("could not delete the baseline"))?;
    Ok(b)
}

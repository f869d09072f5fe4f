//! `WorkerService`: rendezvous straight from the shared map (it may wait), and
//! progress and results through the scheduler (they change job state). Every
//! call must carry a secret of the job attempt it names; writes for a rank
//! (results, progress, rendezvous keys) that rank's own secret. Every
//! rendezvous key has one writer, named by the key
//! (`gpuctl_core::rendezvous_keys`); a rank writing another's key, or a key
//! that names no writer, is refused, logged and counted.

use std::time::Duration;

use gpuctl_proto::pb::worker_service_server::WorkerService;
use gpuctl_proto::pb::{
    rank_result::Detail, Ack, RankProgress, RankProgressReport, RankResult, RendezvousGetRequest,
    RendezvousGetResponse, RendezvousPutRequest,
};
use tonic::{Request, Response, Status};

use gpuctl_core::rendezvous_keys;

use super::auth::Security;
use crate::refusals::Refused;
use crate::rendezvous::{Lookup, Put, Rendezvous};
use crate::scheduler::{RankEvent, SchedulerHandle};

pub struct WorkerSvc {
    sched: SchedulerHandle,
    rdv: Rendezvous,
    security: Security,
}

impl WorkerSvc {
    pub fn new(sched: SchedulerHandle, rdv: Rendezvous, security: Security) -> Self {
        WorkerSvc {
            sched,
            rdv,
            security,
        }
    }
}

/// Models of one result (`train` and `more_train`), as `--model` allows.
pub const MAX_MODELS: usize = gpuctl_core::catalogue::MAX_MODELS;
/// Phase marks of one rank's timeline.
pub const MAX_PHASES: usize = 1024;
/// Step times of one model.
pub const MAX_STEP_TIMES: usize = 4096;
/// One phase's text.
pub const MAX_PHASE_TEXT: usize = 256;

/// Clips what a result carries beyond the bounds our workers keep (a worker
/// of another build, or a forged one, must not make the store and every
/// report that reads it grow without end). The rank's verdict does not hang on
/// these lists, so the result is kept, clipped; the names of the fields that
/// were clipped come back for the log.
pub fn bound_result(r: &mut RankResult) -> Vec<&'static str> {
    let mut clipped = Vec::new();
    // The first model is `train`; more_train holds the others.
    if r.more_train.len() > MAX_MODELS - 1 {
        r.more_train.truncate(MAX_MODELS - 1);
        clipped.push("more_train");
    }
    let first = match &mut r.detail {
        Some(Detail::Train(t)) => Some(t),
        _ => None,
    };
    for t in first.into_iter().chain(r.more_train.iter_mut()) {
        if t.step_ms.len() > MAX_STEP_TIMES {
            t.step_ms.truncate(MAX_STEP_TIMES);
            clipped.push("step_ms");
        }
    }
    if r.phases.len() > MAX_PHASES {
        // Keep the start and the end of the timeline.
        let last = r.phases.pop();
        r.phases.truncate(MAX_PHASES - 1);
        r.phases.extend(last);
        clipped.push("phases");
    }
    let mut long = false;
    for m in &mut r.phases {
        long |= clip_text(&mut m.phase);
    }
    if long {
        clipped.push("phases.phase");
    }
    clipped.dedup();
    clipped
}

/// Cuts `text` to [`MAX_PHASE_TEXT`] bytes at a character boundary; whether
/// it was longer.
fn clip_text(text: &mut String) -> bool {
    if text.len() <= MAX_PHASE_TEXT {
        return false;
    }
    let mut end = MAX_PHASE_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    true
}

/// A progress report's texts are kept with the job and shown in every view
/// of it: each is clipped as a phase is.
pub fn bound_progress(p: &mut RankProgress) {
    for t in [&mut p.phase, &mut p.message, &mut p.waiting_for] {
        clip_text(t);
    }
}

fn ack((ok, message): (bool, String)) -> Response<Ack> {
    Response::new(Ack {
        ok,
        message,
        next_report_ms: 0,
    })
}

#[tonic::async_trait]
impl WorkerService for WorkerSvc {
    async fn rendezvous_put(
        &self,
        req: Request<RendezvousPutRequest>,
    ) -> Result<Response<Ack>, Status> {
        let m = req.get_ref();
        gpuctl_core::limits::rendezvous(&m.key, &m.value)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let owner = rendezvous_keys::writer(&m.key);
        let checked = self
            .security
            .check_worker(&req, &m.job_id, m.attempt, owner);
        let refused = match (owner, checked) {
            (Some(_), Ok(_)) => None,
            (None, Err(denied)) => return Err(denied),
            (None, Ok(writer)) => Some((
                writer,
                format!(
                    "refused: rendezvous key `{}` names no writer (`…@RANK`, `tcp/addr/RANK`, `barrier/NAME/RANK`), so no rank may write it; rank {writer} tried",
                    m.key
                ),
            )),
            // Only a rank of this job attempt writing another's key is
            // counted: a call without such a secret is from no rank at all.
            (Some(owner), Err(denied)) => {
                let writer = self
                    .security
                    .check_worker(&req, &m.job_id, m.attempt, None)
                    .map_err(|_| denied)?;
                Some((
                    writer,
                    format!(
                        "refused, not from rank {owner}'s worker: rendezvous key `{}` is rank {owner}'s to write; rank {writer} may not",
                        m.key
                    ),
                ))
            }
        };
        if let Some((writer, why)) = refused {
            let why = super::clip(format!("{why} ({} attempt {})", m.job_id, m.attempt));
            self.sched.refusals().refuse(
                Refused::Rendezvous,
                &format!("rank {writer} of {}", m.job_id),
                &why,
            );
            return Err(Status::permission_denied(why));
        }
        let r = req.into_inner();
        match self.rdv.put(&r.job_id, r.attempt, &r.key, r.value) {
            Put::Stored => Ok(ack((true, String::new()))),
            Put::NotRunning => Ok(ack((
                false,
                super::clip(format!(
                    "job {} attempt {} is not running",
                    r.job_id, r.attempt
                )),
            ))),
        }
    }

    async fn rendezvous_get(
        &self,
        req: Request<RendezvousGetRequest>,
    ) -> Result<Response<RendezvousGetResponse>, Status> {
        let m = req.get_ref();
        self.security
            .check_worker(&req, &m.job_id, m.attempt, None)?;
        let r = req.into_inner();
        let timeout = Duration::from_millis(r.timeout_ms as u64);
        let resp = match self.rdv.get(&r.job_id, r.attempt, &r.key, timeout).await {
            Lookup::Found(value) => RendezvousGetResponse {
                found: true,
                value,
                job_over: false,
            },
            Lookup::Missing => RendezvousGetResponse::default(),
            Lookup::Over => RendezvousGetResponse {
                found: false,
                value: vec![],
                job_over: true,
            },
        };
        Ok(Response::new(resp))
    }

    async fn report_progress(
        &self,
        req: Request<RankProgressReport>,
    ) -> Result<Response<Ack>, Status> {
        let m = req.get_ref();
        let rank = m.progress.as_ref().map(|p| p.rank).unwrap_or_default();
        self.security
            .check_worker(&req, &m.job_id, m.attempt, Some(rank))?;
        let mut report = req.into_inner();
        if let Some(p) = &mut report.progress {
            bound_progress(p);
        }
        let arrived_ms = self.sched.clock().now_ms();
        Ok(Response::new(
            self.sched
                .ask(|reply| RankEvent::WorkerProgress {
                    report,
                    arrived_ms,
                    reply,
                })
                .await?,
        ))
    }

    async fn report_result(&self, req: Request<RankResult>) -> Result<Response<Ack>, Status> {
        let m = req.get_ref();
        self.security
            .check_worker(&req, &m.job_id, m.attempt, Some(m.rank))?;
        // Dated from the gate, where it may have waited behind thousands.
        let waited = (req.extensions().get::<super::gate::Arrived>())
            .map_or(0, |a| a.0.elapsed().as_millis() as u64);
        let arrived_ms = self.sched.clock().now_ms().saturating_sub(waited);
        let mut result = req.into_inner();
        let clipped = bound_result(&mut result);
        if !clipped.is_empty() {
            tracing::warn!(
                job = %result.job_id,
                rank = result.rank,
                "the result's {} went past their bounds (more_train {}, phases {}, step_ms {} per model, {} bytes of phase text) and were clipped",
                clipped.join(", "),
                MAX_MODELS - 1,
                MAX_PHASES,
                MAX_STEP_TIMES,
                MAX_PHASE_TEXT
            );
        }
        Ok(ack(self
            .sched
            .ask(|reply| RankEvent::WorkerResult {
                result,
                arrived_ms,
                reply,
            })
            .await?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb::{PhaseMark, TrainResult};

    fn mark(phase: &str, unix_ms: u64) -> PhaseMark {
        PhaseMark {
            phase: phase.into(),
            unix_ms,
            iterations: unix_ms,
            ..Default::default()
        }
    }

    #[test]
    fn results_past_the_bounds_are_clipped_keeping_the_ends() {
        let train = |n| TrainResult {
            step_ms: vec![1.0; n],
            ..Default::default()
        };
        let mut r = RankResult {
            detail: Some(Detail::Train(train(MAX_STEP_TIMES + 1))),
            more_train: (0..12).map(|_| train(3)).collect(),
            phases: (0..2000).map(|i| mark("train", i)).collect(),
            ..Default::default()
        };
        r.phases[0].phase = "é".repeat(200);
        let clipped = bound_result(&mut r);
        assert_eq!(clipped, ["more_train", "step_ms", "phases", "phases.phase"]);
        assert_eq!(r.more_train.len(), MAX_MODELS - 1);
        let Some(Detail::Train(t)) = &r.detail else {
            panic!()
        };
        assert_eq!(t.step_ms.len(), MAX_STEP_TIMES);
        assert_eq!(r.phases.len(), MAX_PHASES);
        assert_eq!(r.phases.last().unwrap().unix_ms, 1999);
        assert_eq!(r.phases[0].phase.len(), MAX_PHASE_TEXT);
        // What our workers send passes untouched.
        let mut ok = RankResult {
            detail: Some(Detail::Train(train(30))),
            more_train: vec![train(30)],
            phases: vec![mark("starting", 1), mark("train step", 2)],
            ..Default::default()
        };
        let before = ok.clone();
        assert!(bound_result(&mut ok).is_empty());
        assert_eq!(ok, before);
    }
}

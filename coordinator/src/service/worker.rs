//! `WorkerService`: rendezvous straight from the shared map (it may wait), and
//! progress and results through the scheduler (they change job state). Every
//! call must carry a secret of the job attempt it names; writes for a rank
//! (results, progress, a rank's rendezvous keys) that rank's own secret.

use std::time::Duration;

use gpuctl_proto::pb::worker_service_server::WorkerService;
use gpuctl_proto::pb::{
    Ack, RankProgressReport, RankResult, RendezvousGetRequest, RendezvousGetResponse,
    RendezvousPutRequest,
};
use tonic::{Request, Response, Status};

use super::auth::{key_rank, Security};
use crate::rendezvous::{Lookup, Rendezvous};
use crate::scheduler::{Event, SchedulerHandle};

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

fn ack((ok, message): (bool, String)) -> Response<Ack> {
    Response::new(Ack { ok, message })
}

#[tonic::async_trait]
impl WorkerService for WorkerSvc {
    async fn rendezvous_put(
        &self,
        req: Request<RendezvousPutRequest>,
    ) -> Result<Response<Ack>, Status> {
        let m = req.get_ref();
        gpuctl_proto::limits::rendezvous(&m.key, &m.value)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        self.security
            .check_worker(&req, &m.job_id, m.attempt, key_rank(&m.key))?;
        let r = req.into_inner();
        let ok = self.rdv.put(&r.job_id, r.attempt, &r.key, r.value);
        let message = if ok {
            String::new()
        } else {
            super::clip(format!(
                "job {} attempt {} is not running",
                r.job_id, r.attempt
            ))
        };
        Ok(ack((ok, message)))
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
        let report = req.into_inner();
        Ok(ack(self
            .sched
            .ask(|reply| Event::WorkerProgress { report, reply })
            .await?))
    }

    async fn report_result(&self, req: Request<RankResult>) -> Result<Response<Ack>, Status> {
        let m = req.get_ref();
        self.security
            .check_worker(&req, &m.job_id, m.attempt, Some(m.rank))?;
        let result = req.into_inner();
        Ok(ack(self
            .sched
            .ask(|reply| Event::WorkerResult { result, reply })
            .await?))
    }
}

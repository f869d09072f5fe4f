//! `JobService`: what the CLI calls. Logs are read from the store directly,
//! traces from the agents (`trace`); everything else is answered by the
//! scheduler. With `--tokens`, reads need
//! the `read` role and changes (submit, cancel, baselines, removing a node)
//! the `operate` role.

use gpuctl_proto::pb::job_service_server::JobService;
use gpuctl_proto::pb::GetTraceRequest;
use gpuctl_proto::pb::{
    Baseline, CancelJobRequest, GetBaselineRequest, GetFleetRequest, GetFleetResponse,
    GetJobRequest, GetLogsRequest, GetLogsResponse, GetReportRequest, GetSuiteRequest,
    GetTelemetryRequest, GetTelemetryResponse, GetTimelineRequest, Job, ListBaselinesRequest,
    ListBaselinesResponse, ListJobsRequest, ListJobsResponse, ListNodesRequest, ListNodesResponse,
    Node, PackedReport, Plan, PlanRequest, RemoveNodeRequest, Report, SaveBaselineRequest,
    SubmitRequest, SubmitSuiteRequest, Suite, Timeline,
};
use gpuctl_proto::pb::{
    CertKey, CertResponse, GetCertKeyRequest, GetCertRequest, ListCertsRequest, ListCertsResponse,
    ListRevokedRequest, ListRevokedResponse, Revocation, RevokeCertRequest,
};
use tonic::{Request, Response, Status};

use std::sync::Arc;

use super::auth::{Role, Security};
use super::baseline;
use super::cert;
use super::trace::{self, Fetches, TraceStream};
use crate::cert::Authority;
use crate::error::CoordinatorError;
use crate::fleet_view::FleetView;
use crate::scheduler::{AgentEvent, JobEvent, Query, SchedulerHandle, SuiteEvent};
use crate::store::StateStore;

pub struct JobSvc {
    sched: SchedulerHandle,
    store: StateStore,
    /// `gpuctl fleet`'s answer, kept built (shared with `/metrics`).
    fleet: FleetView,
    security: Security,
    /// `GetTrace`'s requests to agents (shared with `AgentSvc`, which
    /// receives the answers).
    fetches: Fetches,
    /// Signs acceptance certificates; its public key is `GetCertKey`'s.
    certs: Arc<Authority>,
}

impl JobSvc {
    pub fn new(
        sched: SchedulerHandle,
        store: StateStore,
        fleet: FleetView,
        security: Security,
        fetches: Fetches,
        certs: Arc<Authority>,
    ) -> Self {
        JobSvc {
            sched,
            store,
            fleet,
            security,
            fetches,
            certs,
        }
    }

    /// The report `req` asks for, shared, made ready to send by `ready` on
    /// a blocking thread: tens of thousands of ranks can outgrow one gRPC
    /// message, and cutting or encoding such a report takes a while.
    async fn report_as<T: Send + 'static>(
        &self,
        req: Request<GetReportRequest>,
        ready: fn(Arc<Report>, usize) -> T,
    ) -> Result<T, Status> {
        self.security.allow(&req, Role::Read)?;
        let job_id = req.into_inner().job_id;
        let report = self
            .sched
            .ask(|reply| Query::GetReport { job_id, reply })
            .await??;
        tokio::task::spawn_blocking(move || ready(report, gpuctl_core::server::MAX_MESSAGE_BYTES))
            .await
            .map_err(|e| Status::internal(format!("making the report ready to send: {e}")))
    }
}

#[tonic::async_trait]
impl JobService for JobSvc {
    async fn submit(&self, req: Request<SubmitRequest>) -> Result<Response<Job>, Status> {
        self.security.allow(&req, Role::Operate)?;
        let spec = req.into_inner().spec.unwrap_or_default();
        Ok(Response::new(
            self.sched
                .ask(|reply| JobEvent::Submit { spec, reply })
                .await??,
        ))
    }

    async fn plan_job(&self, req: Request<PlanRequest>) -> Result<Response<Plan>, Status> {
        self.security.allow(&req, Role::Read)?;
        let PlanRequest { spec, max_ranks } = req.into_inner();
        let spec = spec.unwrap_or_default();
        Ok(Response::new(
            self.sched
                .ask(|reply| Query::Plan {
                    spec,
                    max_ranks,
                    reply,
                })
                .await??,
        ))
    }

    async fn get_job(&self, req: Request<GetJobRequest>) -> Result<Response<Job>, Status> {
        self.security.allow(&req, Role::Read)?;
        let GetJobRequest { job_id, max_ranks } = req.into_inner();
        Ok(Response::new(self.sched.get_job(job_id, max_ranks).await?))
    }

    async fn list_jobs(
        &self,
        req: Request<ListJobsRequest>,
    ) -> Result<Response<ListJobsResponse>, Status> {
        self.security.allow(&req, Role::Read)?;
        let limit = req.into_inner().limit;
        let jobs = self.sched.list_jobs(limit).await?;
        Ok(Response::new(ListJobsResponse { jobs }))
    }

    async fn cancel_job(&self, req: Request<CancelJobRequest>) -> Result<Response<Job>, Status> {
        self.security.allow(&req, Role::Operate)?;
        let CancelJobRequest { job_id, reason } = req.into_inner();
        Ok(Response::new(
            self.sched
                .ask(|reply| JobEvent::Cancel {
                    job_id,
                    reason,
                    reply,
                })
                .await??,
        ))
    }

    type GetTraceStream = TraceStream;

    async fn get_trace(
        &self,
        req: Request<GetTraceRequest>,
    ) -> Result<Response<TraceStream>, Status> {
        self.security.allow(&req, Role::Read)?;
        let stream = trace::get_trace(&self.sched, &self.fetches, req.into_inner()).await?;
        Ok(Response::new(stream))
    }

    async fn get_report(&self, req: Request<GetReportRequest>) -> Result<Response<Report>, Status> {
        let report = self.report_as(req, crate::judge::thin::to_send).await?;
        Ok(Response::new(report))
    }

    async fn get_report_packed(
        &self,
        req: Request<GetReportRequest>,
    ) -> Result<Response<PackedReport>, Status> {
        let report = self.report_as(req, crate::judge::thin::packed).await?;
        Ok(Response::new(PackedReport { report }))
    }

    async fn get_logs(
        &self,
        req: Request<GetLogsRequest>,
    ) -> Result<Response<GetLogsResponse>, Status> {
        self.security.allow(&req, Role::Read)?;
        let r = req.into_inner();
        let job_id = r.job_id.clone();
        // Unknown jobs get the same not-found as everywhere else.
        let settled = self
            .sched
            .ask(|reply| Query::LogsSettled { job_id, reply })
            .await??;
        let settled = match settled {
            // Asked before the read: the lines read after it are the last.
            Some(stored) => stored.await.is_ok(),
            None => false,
        };
        let rank = r.has_rank.then_some(r.rank);
        let mut lines =
            self.store.logs(&r.job_id, rank).await.map_err(|e| {
                CoordinatorError::store(format!("reading the logs of {}", r.job_id), e)
            })?;
        if r.tail > 0 && lines.len() > r.tail as usize {
            lines.drain(..lines.len() - r.tail as usize);
        }
        Ok(Response::new(GetLogsResponse { lines, settled }))
    }

    async fn get_telemetry(
        &self,
        req: Request<GetTelemetryRequest>,
    ) -> Result<Response<GetTelemetryResponse>, Status> {
        self.security.allow(&req, Role::Read)?;
        let job_id = req.into_inner().job_id;
        let latest = self
            .sched
            .ask(|reply| Query::GetTelemetry { job_id, reply })
            .await??;
        Ok(Response::new(GetTelemetryResponse { latest }))
    }

    async fn get_timeline(
        &self,
        req: Request<GetTimelineRequest>,
    ) -> Result<Response<Timeline>, Status> {
        self.security.allow(&req, Role::Read)?;
        let job_id = req.into_inner().job_id;
        let id = job_id.clone();
        self.sched
            .ask(|reply| Query::GetJob {
                job_id: id,
                max_ranks: 1,
                reply,
            })
            .await??;
        // What the store holds: a running job's latest seconds arrive with
        // the scheduler's next telemetry flush.
        let series = self.store.telemetry(&job_id).await.map_err(|e| {
            CoordinatorError::store(format!("reading the telemetry of {job_id}"), e)
        })?;
        Ok(Response::new(Timeline {
            job_id,
            gpus: series.iter().map(|s| s.timeline()).collect(),
        }))
    }

    async fn list_nodes(
        &self,
        req: Request<ListNodesRequest>,
    ) -> Result<Response<ListNodesResponse>, Status> {
        self.security.allow(&req, Role::Read)?;
        Ok(Response::new(
            self.sched.list_nodes(req.into_inner()).await?,
        ))
    }

    async fn save_baseline(
        &self,
        req: Request<SaveBaselineRequest>,
    ) -> Result<Response<Baseline>, Status> {
        self.security.allow(&req, Role::Operate)?;
        let r = req.into_inner();
        let b = baseline::save(&self.sched, &self.store, r.job_id, &r.name, r.replace).await?;
        Ok(Response::new(b))
    }

    async fn get_baseline(
        &self,
        req: Request<GetBaselineRequest>,
    ) -> Result<Response<Baseline>, Status> {
        self.security.allow(&req, Role::Read)?;
        Ok(Response::new(
            baseline::get(&self.store, &req.into_inner().name).await?,
        ))
    }

    async fn list_baselines(
        &self,
        req: Request<ListBaselinesRequest>,
    ) -> Result<Response<ListBaselinesResponse>, Status> {
        self.security.allow(&req, Role::Read)?;
        let baselines = baseline::list(&self.store).await?;
        Ok(Response::new(ListBaselinesResponse { baselines }))
    }

    async fn delete_baseline(
        &self,
        req: Request<GetBaselineRequest>,
    ) -> Result<Response<Baseline>, Status> {
        self.security.allow(&req, Role::Operate)?;
        Ok(Response::new(
            baseline::delete(&self.store, &req.into_inner().name).await?,
        ))
    }

    async fn get_fleet(
        &self,
        req: Request<GetFleetRequest>,
    ) -> Result<Response<GetFleetResponse>, Status> {
        self.security.allow(&req, Role::Read)?;
        Ok(Response::new(self.fleet.page(req.into_inner()).await?))
    }

    async fn submit_suite(
        &self,
        req: Request<SubmitSuiteRequest>,
    ) -> Result<Response<Suite>, Status> {
        self.security.allow(&req, Role::Operate)?;
        let req = req.into_inner();
        // Here, before the scheduler: the suite and each stage's job keep
        // a copy of the rules (30 MiB of them grew the store by 500 MB).
        gpuctl_core::limits::suite(&req).map_err(CoordinatorError::from)?;
        Ok(Response::new(
            self.sched
                .ask(|reply| SuiteEvent::SubmitSuite { req, reply })
                .await??,
        ))
    }

    async fn get_suite(&self, req: Request<GetSuiteRequest>) -> Result<Response<Suite>, Status> {
        self.security.allow(&req, Role::Read)?;
        let id = req.into_inner().suite_id;
        Ok(Response::new(
            self.sched
                .ask(|reply| Query::GetSuite { id, reply })
                .await??,
        ))
    }

    async fn cancel_suite(&self, req: Request<GetSuiteRequest>) -> Result<Response<Suite>, Status> {
        self.security.allow(&req, Role::Operate)?;
        let id = req.into_inner().suite_id;
        Ok(Response::new(
            self.sched
                .ask(|reply| SuiteEvent::CancelSuite { id, reply })
                .await??,
        ))
    }

    async fn get_cert_key(
        &self,
        req: Request<GetCertKeyRequest>,
    ) -> Result<Response<CertKey>, Status> {
        self.security.allow(&req, Role::Read)?;
        Ok(Response::new(cert::key(&self.certs)))
    }

    async fn get_cert(
        &self,
        req: Request<GetCertRequest>,
    ) -> Result<Response<CertResponse>, Status> {
        self.security.allow(&req, Role::Read)?;
        let req = req.into_inner();
        Ok(Response::new(
            cert::get(&self.store, &self.sched, req).await?,
        ))
    }

    async fn list_certs(
        &self,
        req: Request<ListCertsRequest>,
    ) -> Result<Response<ListCertsResponse>, Status> {
        self.security.allow(&req, Role::Read)?;
        let certs = cert::list(&self.store).await?;
        Ok(Response::new(ListCertsResponse { certs }))
    }

    async fn revoke_cert(
        &self,
        req: Request<RevokeCertRequest>,
    ) -> Result<Response<Revocation>, Status> {
        self.security.allow(&req, Role::Operate)?;
        let now = self.sched.clock().now_ms();
        let req = req.into_inner();
        Ok(Response::new(cert::revoke(&self.store, req, now).await?))
    }

    async fn list_revoked(
        &self,
        req: Request<ListRevokedRequest>,
    ) -> Result<Response<ListRevokedResponse>, Status> {
        self.security.allow(&req, Role::Read)?;
        Ok(Response::new(cert::revoked(&self.store).await?))
    }

    async fn remove_node(&self, req: Request<RemoveNodeRequest>) -> Result<Response<Node>, Status> {
        self.security.allow(&req, Role::Operate)?;
        let name = req.into_inner().name.trim().to_string();
        let node = self
            .sched
            .ask(|reply| AgentEvent::RemoveNode { name, reply })
            .await??;
        Ok(Response::new(node))
    }
}

//! The coordinator connection: one `JobService` client and a method per RPC that
//! turns gRPC failures into sentences a user can act on ("cannot reach
//! coordinator at ...", the coordinator's own refusal text). Every call
//! carries `GPUCTL_TOKEN` as a bearer token; `https://` URLs use the TLS files
//! of `--tls-ca/--tls-cert/--tls-key` (or `GPUCTL_TLS_*`).

use std::path::PathBuf;

mod cert;

use anyhow::{anyhow, Result};
use gpuctl_core::client::Channel;
use gpuctl_core::leader;
use gpuctl_proto::pb::{self, job_service_client::JobServiceClient};
use tonic::{Code, Status};

use crate::error::UsageError;

/// Same ceiling as the servers (`gpuctl_core::server`): big fleets make big reports.
const MAX_MESSAGE_BYTES: usize = gpuctl_core::server::MAX_MESSAGE_BYTES;

pub struct Coordinator {
    /// Every `--coordinator` URL, for finding the leader again after a failover.
    urls: Vec<String>,
    /// The one that led when last asked.
    url: String,
    inner: JobServiceClient<Channel>,
}

fn unreachable(url: &str, why: &str) -> anyhow::Error {
    anyhow!(
        "cannot reach coordinator at {url}: {why} (start one with `gpuctl local up` or set --coordinator)"
    )
}

fn client(channel: Channel) -> JobServiceClient<Channel> {
    JobServiceClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

/// Whether a failed call may go to another URL: a read after any
/// UNAVAILABLE; a change (submit, cancel, ...) only after a standby's
/// refusal, which did nothing: a call that broke mid-way may have been done.
fn may_retry(status: &Status, reads: bool) -> bool {
    status.code() == Code::Unavailable && (reads || leader::leader_of(status).is_some())
}

/// Connects to the leader among `urls`, or says why none answered, naming each URL.
async fn find(urls: &[String]) -> Result<(String, Channel)> {
    match leader::find_leader(urls, |u| with_token(gpuctl_core::client::builder(u))).await {
        Ok(channel) => Ok((channel.url().to_string(), channel)),
        Err(e) if e.all_bad_urls() => Err(UsageError(format!("--coordinator: {e}")).into()),
        Err(e) if e.tried.len() == 1 => Err(unreachable(&e.tried[0].0, &e.tried[0].1)),
        Err(e) => Err(unreachable(&e.urls(), &e.to_string())),
    }
}

/// Where the CLI's token comes from; never a flag (it would show in `ps`).
pub const TOKEN_ENV: &str = "GPUCTL_TOKEN";

/// The TLS files of every connection of this run, from the global flags
/// (`--tls-ca`, `--tls-cert`, `--tls-key`); an empty path is none.
pub fn set_tls(ca: &Option<PathBuf>, cert: &Option<PathBuf>, key: &Option<PathBuf>) {
    let nonempty = |p: &Option<PathBuf>| p.clone().filter(|p| !p.as_os_str().is_empty());
    gpuctl_core::client::set_tls(gpuctl_core::client::TlsFiles {
        ca: nonempty(ca),
        cert: nonempty(cert),
        key: nonempty(key),
    });
}

/// `GPUCTL_TOKEN` as an `authorization` header, when set.
fn with_token(builder: gpuctl_core::client::Builder) -> gpuctl_core::client::Builder {
    match std::env::var(TOKEN_ENV) {
        Ok(t) if !t.trim().is_empty() => builder.header(
            gpuctl_core::auth::AUTHORIZATION,
            format!("Bearer {}", t.trim()),
        ),
        _ => builder,
    }
}

impl Coordinator {
    /// Connects eagerly to the coordinator that leads among `urls` (one URL
    /// or several, comma-separated: a standby's answer names the leader), so
    /// that a missing coordinator is reported once, up front. Every call
    /// then gets proto's request timeout (30 s): a coordinator that accepts
    /// and never answers is reported, not waited on forever.
    pub async fn connect(urls: &str) -> Result<Self> {
        let list = leader::split_urls(urls);
        if list.is_empty() {
            return Err(UsageError(format!(
                "--coordinator: `{urls}` names no URL; write it like http://127.0.0.1:7070[,http://other:7070]"
            ))
            .into());
        }
        if let Some(bad) = list
            .iter()
            .find(|u| !(u.starts_with("http://") || u.starts_with("https://")))
        {
            return Err(UsageError(format!(
                "--coordinator: `{bad}` is not a URL; write it like http://127.0.0.1:7070"
            ))
            .into());
        }
        let (url, channel) = find(&list).await?;
        Ok(Coordinator {
            urls: list,
            url,
            inner: client(channel),
        })
    }

    /// Runs `call` on the leader; when it fails so that another URL may
    /// answer ([`may_retry`]), finds the leader again (the one a standby
    /// named first) and runs it once more there.
    pub(crate) async fn call<T, F, Fut>(
        &mut self,
        reads: bool,
        mut call: F,
    ) -> std::result::Result<T, Status>
    where
        F: FnMut(JobServiceClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, Status>>,
    {
        let status = match call(self.inner.clone()).await {
            Ok(r) => return Ok(r.into_inner()),
            Err(s)
                if may_retry(&s, reads)
                    && self.urls.len() + usize::from(leader::leader_of(&s).is_some()) > 1 =>
            {
                s
            }
            Err(s) => return Err(s),
        };
        let mut urls = self.urls.clone();
        if let Some(l) = leader::leader_of(&status) {
            urls.retain(|u| *u != l);
            urls.insert(0, l);
        }
        let Ok((url, channel)) = find(&urls).await else {
            return Err(status);
        };
        tracing::info!(from = %self.url, to = %url, "the coordinator changed: {}", status.message());
        self.url = url;
        self.inner = client(channel);
        call(self.inner.clone()).await.map(|r| r.into_inner())
    }

    /// A rank's trace, piece by piece (`GetTrace`). Not retried on another
    /// URL: a stream cut mid-way is the caller's to report. Several may run
    /// at once on the one connection.
    pub async fn trace(
        &self,
        req: pb::GetTraceRequest,
    ) -> std::result::Result<tonic::Streaming<pb::TraceChunk>, Status> {
        self.inner
            .clone()
            .get_trace(req)
            .await
            .map(|r| r.into_inner())
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub(crate) fn status(&self, what: &str, s: Status) -> anyhow::Error {
        status_error(&self.url, what, s)
    }

    pub async fn submit(&mut self, spec: pb::JobSpec) -> Result<pb::Job> {
        let req = pb::SubmitRequest { spec: Some(spec) };
        self.call(false, move |mut c| {
            let req = req.clone();
            async move { c.submit(req).await }
        })
        .await
        .map_err(|s| self.status("submit", s))
    }

    /// The dry run of `spec`; `max_ranks` > 0 bounds a big plan's answer
    /// (`PlanRequest.max_ranks`).
    pub async fn plan(&mut self, spec: pb::JobSpec, max_ranks: u32) -> Result<pb::Plan> {
        let req = pb::PlanRequest {
            spec: Some(spec),
            max_ranks,
        };
        self.call(true, move |mut c| {
            let req = req.clone();
            async move { c.plan_job(req).await }
        })
        .await
        .map_err(|s| self.status("plan", s))
    }

    /// A job; `max_ranks` > 0 bounds a big one to the ranks furthest behind
    /// (`GetJobRequest.max_ranks`; views use `gpuctl_proto::VIEW_RANKS`).
    pub async fn job(&mut self, id: &str, max_ranks: u32) -> Result<pb::Job> {
        let req = pb::GetJobRequest {
            job_id: id.into(),
            max_ranks,
        };
        self.call(true, move |mut c| {
            let req = req.clone();
            async move { c.get_job(req).await }
        })
        .await
        .map_err(|s| self.status("get job", s))
    }

    pub async fn jobs(&mut self, limit: u32) -> Result<Vec<pb::Job>> {
        let req = pb::ListJobsRequest { limit };
        self.call(true, move |mut c| async move { c.list_jobs(req).await })
            .await
            .map(|r| r.jobs)
            .map_err(|s| self.status("list jobs", s))
    }

    pub async fn cancel(&mut self, id: &str, reason: &str) -> Result<pb::Job> {
        let req = pb::CancelJobRequest {
            job_id: id.into(),
            reason: reason.into(),
        };
        self.call(false, move |mut c| {
            let req = req.clone();
            async move { c.cancel_job(req).await }
        })
        .await
        .map_err(|s| self.status("cancel", s))
    }

    /// The latest telemetry batch of every node of a running job.
    pub async fn telemetry(&mut self, id: &str) -> Result<Vec<pb::TelemetryBatch>> {
        let req = pb::GetTelemetryRequest { job_id: id.into() };
        self.call(true, move |mut c| {
            let req = req.clone();
            async move { c.get_telemetry(req).await }
        })
        .await
        .map(|r| r.latest)
        .map_err(|s| self.status("telemetry", s))
    }

    /// The job's stored telemetry series per GPU.
    pub async fn timeline(&mut self, id: &str) -> Result<pb::Timeline> {
        let req = pb::GetTimelineRequest { job_id: id.into() };
        self.call(true, move |mut c| {
            let req = req.clone();
            async move { c.get_timeline(req).await }
        })
        .await
        .map_err(|s| self.status("timeline", s))
    }

    /// The raw status is kept for callers that wait for a report to appear.
    /// Asked encoded (`GetReportPacked`: the coordinator does not copy the
    /// report for it); of a coordinator older than that, plainly.
    pub async fn report_raw(&mut self, id: &str) -> std::result::Result<pb::Report, Status> {
        let req = pb::GetReportRequest { job_id: id.into() };
        let ask = req.clone();
        let packed = self
            .call(true, move |mut c| {
                let req = ask.clone();
                async move { c.get_report_packed(req).await }
            })
            .await;
        match packed {
            Ok(p) => p
                .unpack()
                .map_err(|e| Status::internal(format!("the coordinator's report: {e}"))),
            Err(s) if s.code() == tonic::Code::Unimplemented => {
                self.call(true, move |mut c| {
                    let req = req.clone();
                    async move { c.get_report(req).await }
                })
                .await
            }
            Err(s) => Err(s),
        }
    }

    pub async fn report(&mut self, id: &str) -> Result<pb::Report> {
        self.report_raw(id)
            .await
            .map_err(|s| self.status("report", s))
    }

    pub async fn submit_suite(&mut self, req: pb::SubmitSuiteRequest) -> Result<pb::Suite> {
        self.call(false, move |mut c| {
            let req = req.clone();
            async move { c.submit_suite(req).await }
        })
        .await
        .map_err(|s| self.status("accept", s))
    }

    pub async fn suite(&mut self, id: &str) -> Result<pb::Suite> {
        let req = pb::GetSuiteRequest {
            suite_id: id.into(),
        };
        self.call(true, move |mut c| {
            let req = req.clone();
            async move { c.get_suite(req).await }
        })
        .await
        .map_err(|s| self.status("get suite", s))
    }

    pub async fn cancel_suite(&mut self, id: &str) -> Result<pb::Suite> {
        let req = pb::GetSuiteRequest {
            suite_id: id.into(),
        };
        self.call(false, move |mut c| {
            let req = req.clone();
            async move { c.cancel_suite(req).await }
        })
        .await
        .map_err(|s| self.status("cancel suite", s))
    }

    /// The fleet's rows page after page (see [`Coordinator::nodes`]); the
    /// runs and links come with the first. `flagged_drift`: each row's
    /// drift only where flagged, all a table shows.
    pub async fn fleet(
        &mut self,
        since_unix_ms: u64,
        node: &str,
        flagged_drift: bool,
    ) -> Result<pb::GetFleetResponse> {
        let mut all = pb::GetFleetResponse::default();
        let mut after = String::new();
        loop {
            let req = pb::GetFleetRequest {
                since_unix_ms,
                node: node.to_string(),
                page_bytes: PAGE_BYTES,
                after: after.clone(),
                // No table or JSON of `gpuctl fleet` shows a node's GPUs.
                brief: true,
                // Rows the coordinator encoded once, not for each call.
                packed: true,
                flagged_drift,
            };
            let mut page = self
                .call(true, move |mut c| {
                    let req = req.clone();
                    async move { c.get_fleet(req).await }
                })
                .await
                .map_err(|s| self.status("fleet", s))?;
            page.unpack()
                .map_err(|e| anyhow::anyhow!("the coordinator's fleet page is unreadable: {e}"))?;
            // The first page's rows taken as they are (16,384 rows are 5 MB).
            if all.rows.is_empty() {
                std::mem::swap(&mut all.rows, &mut page.rows);
            }
            all.rows.append(&mut page.rows);
            all.runs.append(&mut page.runs);
            all.links.append(&mut page.links);
            if !moves_on(&after, &page.next_after) {
                return Ok(all);
            }
            after = page.next_after;
        }
    }

    pub async fn save_baseline(
        &mut self,
        job: &str,
        name: &str,
        replace: bool,
    ) -> Result<pb::Baseline> {
        let req = pb::SaveBaselineRequest {
            job_id: job.to_string(),
            name: name.to_string(),
            replace,
        };
        self.call(false, move |mut c| {
            let req = req.clone();
            async move { c.save_baseline(req).await }
        })
        .await
        .map_err(|s| self.status("baseline save", s))
    }

    pub async fn get_baseline(&mut self, name: &str) -> Result<pb::Baseline> {
        let req = pb::GetBaselineRequest {
            name: name.to_string(),
        };
        self.call(true, move |mut c| {
            let req = req.clone();
            async move { c.get_baseline(req).await }
        })
        .await
        .map_err(|s| self.status("baseline show", s))
    }

    pub async fn list_baselines(&mut self) -> Result<Vec<pb::Baseline>> {
        let req = pb::ListBaselinesRequest {};
        self.call(
            true,
            move |mut c| async move { c.list_baselines(req).await },
        )
        .await
        .map(|r| r.baselines)
        .map_err(|s| self.status("baseline list", s))
    }

    pub async fn delete_baseline(&mut self, name: &str) -> Result<pb::Baseline> {
        let req = pb::GetBaselineRequest {
            name: name.to_string(),
        };
        self.call(false, move |mut c| {
            let req = req.clone();
            async move { c.delete_baseline(req).await }
        })
        .await
        .map_err(|s| self.status("baseline delete", s))
    }

    pub async fn logs(
        &mut self,
        id: &str,
        rank: Option<u32>,
        tail: u32,
    ) -> Result<pb::GetLogsResponse> {
        let req = pb::GetLogsRequest {
            job_id: id.into(),
            has_rank: rank.is_some(),
            rank: rank.unwrap_or(0),
            tail,
        };
        self.call(true, move |mut c| {
            let req = req.clone();
            async move { c.get_logs(req).await }
        })
        .await
        .map_err(|s| self.status("logs", s))
    }

    pub async fn remove_node(&mut self, name: &str) -> Result<pb::Node> {
        let req = pb::RemoveNodeRequest {
            name: name.to_string(),
        };
        self.call(false, move |mut c| {
            let req = req.clone();
            async move { c.remove_node(req).await }
        })
        .await
        .map_err(|s| self.status("nodes remove", s))
    }

    /// Every node with all it reported, page after page: a fleet of any
    /// size outgrows one answer (20 nodes at the old 4 MiB bound did).
    pub async fn nodes(&mut self) -> Result<Vec<pb::Node>> {
        let mut nodes = Vec::new();
        let mut after = String::new();
        loop {
            let req = pb::ListNodesRequest {
                brief: false,
                page_bytes: PAGE_BYTES,
                after: after.clone(),
            };
            let mut page = self.list_nodes(req).await?;
            nodes.append(&mut page.nodes);
            if !moves_on(&after, &page.next_after) {
                return Ok(nodes);
            }
            after = page.next_after;
        }
    }

    /// Only what a table of nodes shows (`ListNodesRequest.brief`).
    pub async fn node_table(&mut self) -> Result<pb::NodeTable> {
        let req = pb::ListNodesRequest {
            brief: true,
            ..Default::default()
        };
        self.list_nodes(req)
            .await
            .map(|r| r.table.unwrap_or_default())
    }

    async fn list_nodes(&mut self, req: pb::ListNodesRequest) -> Result<pb::ListNodesResponse> {
        self.call(true, move |mut c| {
            let req = req.clone();
            async move { c.list_nodes(req).await }
        })
        .await
        .map_err(|s| self.status("list nodes", s))
    }
}

/// What a listing page may hold, asked of the coordinator (which caps it).
const PAGE_BYTES: u32 = gpuctl_core::limits::MAX_LIST_PAGE as u32;

/// Whether a listing goes on after a page: a next name past the last one.
/// A coordinator that names no later page (or, broken, the same or an
/// earlier one) ends it, so that no answer makes the loop endless.
fn moves_on(after: &str, next: &str) -> bool {
    !next.is_empty() && next > after
}

/// A gRPC status as one sentence. The coordinator's messages are written for
/// users ("asked for 5 nodes, 4 match"), so they are shown as they are.
/// A refusal or failure of the coordinator, said for the user, that keeps
/// its gRPC code so that the exit code does not depend on the wording.
#[derive(Debug)]
pub struct RpcError {
    pub code: Code,
    pub text: String,
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for RpcError {}

pub fn status_error(url: &str, what: &str, s: Status) -> anyhow::Error {
    let code = s.code();
    let text = status_text(url, what, s).to_string();
    RpcError { code, text }.into()
}

fn status_text(url: &str, what: &str, s: Status) -> anyhow::Error {
    let msg = s.message().trim().to_string();
    match s.code() {
        Code::Unavailable => unreachable(url, &msg),
        // The channel's own timeout ("URL: no answer within 30s").
        Code::DeadlineExceeded if msg.starts_with(url) => {
            unreachable(url, msg[url.len()..].trim_start_matches(':').trim())
        }
        Code::InvalidArgument
        | Code::FailedPrecondition
        | Code::AlreadyExists
        | Code::Unauthenticated
        | Code::PermissionDenied => {
            anyhow!("{what} refused by the coordinator: {msg}")
        }
        Code::NotFound if msg.is_empty() => anyhow!("{what}: not found"),
        Code::NotFound => anyhow!("{msg}"),
        Code::Unimplemented => anyhow!(
            "the coordinator at {url} does not implement {what} ({msg}); is it an older gpuctl-coordinator?"
        ),
        code => anyhow!("{what} failed: {msg} ({code:?})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_reads_or_calls_a_standby_refused_go_to_another_url() {
        let standby = leader::standby_status(Some("http://10.0.0.1:7070"));
        let broken = Status::unavailable("connection reset");
        assert!(may_retry(&standby, false) && may_retry(&standby, true));
        // A change cut off mid-way may have been done: not sent twice.
        assert!(!may_retry(&broken, false));
        assert!(may_retry(&broken, true));
        assert!(!may_retry(&Status::invalid_argument("no"), true));
    }

    #[test]
    fn a_listing_ends_unless_the_next_page_moves_on() {
        assert!(moves_on("", "node-0131"));
        assert!(moves_on("node-0131", "node-0263"));
        assert!(!moves_on("node-0263", ""), "the last page");
        // A coordinator that names the same or an earlier page ends it.
        assert!(!moves_on("node-0263", "node-0263"));
        assert!(!moves_on("node-0263", "node-0001"));
    }

    #[test]
    fn a_silent_coordinator_reads_as_unreachable() {
        let url = "http://10.0.0.9:7070";
        let s = Status::deadline_exceeded(format!("{url}: no answer within 30s"));
        assert_eq!(
            status_error(url, "list nodes", s).to_string(),
            "cannot reach coordinator at http://10.0.0.9:7070: no answer within 30s \
             (start one with `gpuctl local up` or set --coordinator)"
        );
        // A deadline the coordinator itself reports stays its own message.
        let s = Status::deadline_exceeded("rendezvous wait ended");
        assert_eq!(
            status_error(url, "report", s).to_string(),
            "report failed: rendezvous wait ended (DeadlineExceeded)"
        );
    }
}

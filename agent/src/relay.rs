//! The workers' way to the coordinator: a `WorkerService` on loopback that
//! passes each call on over the agent's own connection.
//!
//! A worker that dialled the coordinator itself cost the coordinator one
//! connection per rank and job: two file descriptors per GPU of the fleet
//! and ~13 KB of HTTP/2 and tonic state each at a job's peak, ~420 MB at
//! 4,096 × 8 (docs/benchmarks.md, seventeenth round). Through the relay the
//! coordinator sees one connection per node, the one the agent's session
//! already holds.
//!
//! The relay grants nothing: it passes on the rank secret the worker
//! presents, and the coordinator checks it as before. Failover follows the
//! agent: calls go to the coordinator the agent last registered with. A
//! standby's answer reaches the worker without its leader hint, so that the
//! worker keeps calling the relay (which moves when the agent's session
//! does) instead of leaving for the leader on its own connection.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use gpuctl_core::client::Channel;
use gpuctl_core::server::MAX_MESSAGE_BYTES;
use gpuctl_proto::pb::worker_service_client::WorkerServiceClient;
use gpuctl_proto::pb::worker_service_server::{WorkerService, WorkerServiceServer};
use gpuctl_proto::pb::{
    Ack, RankProgressReport, RankResult, RendezvousGetRequest, RendezvousGetResponse,
    RendezvousPutRequest,
};
use tonic::{Request, Response, Status};

/// How long a passed-on call may take when the worker named no limit
/// (gpuctl-worker names one only for long polls): its own channel waits 20 s.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The header `tonic::Request::set_timeout` writes; passed on as it came.
const GRPC_TIMEOUT: &str = "grpc-timeout";
/// Calls of one worker connection handled at once: a worker makes at most
/// two (its work and its progress thread); more is not one of ours.
const CALLS_PER_CONNECTION: usize = 16;

/// Calls the coordinator takes at once on one HTTP/2 connection (hyper's
/// default, which its server keeps).
pub const COORDINATOR_STREAMS: usize = 200;
/// Ranks whose calls fit in those streams: each has at most two in flight
/// (a rendezvous long poll and a progress report), beside the session.
pub const RANKS_PER_CONNECTION: usize = (COORDINATOR_STREAMS - 8) / 2;

/// How workers reach the coordinator (`--worker-connections`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum WorkerConnections {
    /// Through the agent's relay on loopback and the agent's connection.
    #[default]
    Relay,
    /// Each worker opens its own connection to the coordinator, as before
    /// the relay: a connection per GPU of the fleet during jobs.
    Direct,
}

/// Where the relay sends calls: the agent's current coordinator.
#[derive(Debug)]
pub struct Relay {
    node: String,
    upstream: RwLock<Option<Channel>>,
}

impl Relay {
    pub fn new(node: &str) -> Arc<Relay> {
        Arc::new(Relay {
            node: node.to_string(),
            upstream: RwLock::new(None),
        })
    }

    /// The channel of the coordinator the agent just registered with.
    pub fn set_upstream(&self, channel: Channel) {
        *self.upstream.write().unwrap_or_else(|e| e.into_inner()) = Some(channel);
    }

    fn client(&self) -> Result<WorkerServiceClient<Channel>, Status> {
        let channel = self
            .upstream
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| {
                Status::unavailable(format!(
                    "agent `{}` has not registered with a coordinator yet; try again",
                    self.node
                ))
            })?;
        Ok(WorkerServiceClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }

    /// Serves the relay on `listen` (loopback, port 0 for any); returns the
    /// URL workers are given. It runs as long as the agent's runtime, not
    /// until the shutdown signal: the agent stops its workers after that
    /// signal, and a result a worker sends meanwhile still gets through.
    pub async fn serve(self: Arc<Self>, listen: SocketAddr) -> std::io::Result<String> {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let url = format!("http://{}", listener.local_addr()?);
        let service = WorkerServiceServer::new(Forward(self))
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let server = gpuctl_core::server::builder()
            .concurrency_limit_per_connection(CALLS_PER_CONNECTION)
            .add_service(service)
            .serve_with_incoming(gpuctl_core::server::incoming(listener));
        tokio::spawn(async move {
            if let Err(e) = server.await {
                tracing::error!("the workers' relay stopped: {e}");
            }
        });
        Ok(url)
    }
}

/// The call as it goes on: the worker's message, its rank secret and its
/// time limit; nothing else of what the worker sent.
fn onward<T>(req: Request<T>) -> Request<T> {
    let (meta, _, message) = req.into_parts();
    let mut out = Request::new(message);
    if let Some(secret) = meta.get(gpuctl_core::auth::RANK_SECRET) {
        let mut secret = secret.clone();
        // A credential: never indexed in HTTP/2's header tables.
        secret.set_sensitive(true);
        out.metadata_mut()
            .insert(gpuctl_core::auth::RANK_SECRET, secret);
    }
    match meta.get(GRPC_TIMEOUT) {
        Some(limit) => {
            out.metadata_mut().insert(GRPC_TIMEOUT, limit.clone());
        }
        None => out.set_timeout(DEFAULT_TIMEOUT),
    }
    out
}

/// The coordinator's answer without its metadata: a standby's leader hint
/// would send the worker away from the relay.
fn back(status: Status) -> Status {
    Status::new(status.code(), status.message().to_string())
}

struct Forward(Arc<Relay>);

#[tonic::async_trait]
impl WorkerService for Forward {
    async fn rendezvous_put(
        &self,
        req: Request<RendezvousPutRequest>,
    ) -> Result<Response<Ack>, Status> {
        let mut c = self.0.client()?;
        c.rendezvous_put(onward(req)).await.map_err(back)
    }

    async fn rendezvous_get(
        &self,
        req: Request<RendezvousGetRequest>,
    ) -> Result<Response<RendezvousGetResponse>, Status> {
        let mut c = self.0.client()?;
        c.rendezvous_get(onward(req)).await.map_err(back)
    }

    async fn report_progress(
        &self,
        req: Request<RankProgressReport>,
    ) -> Result<Response<Ack>, Status> {
        let mut c = self.0.client()?;
        c.report_progress(onward(req)).await.map_err(back)
    }

    async fn report_result(&self, req: Request<RankResult>) -> Result<Response<Ack>, Status> {
        let mut c = self.0.client()?;
        c.report_result(onward(req)).await.map_err(back)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_secret_and_the_time_limit_go_on() {
        let mut req = Request::new(());
        req.metadata_mut()
            .insert(gpuctl_core::auth::RANK_SECRET, "s3".parse().unwrap());
        req.metadata_mut().insert("x-other", "no".parse().unwrap());
        req.set_timeout(Duration::from_secs(25));
        let out = onward(req);
        assert_eq!(
            out.metadata().get(gpuctl_core::auth::RANK_SECRET).unwrap(),
            "s3"
        );
        assert_eq!(out.metadata().get(GRPC_TIMEOUT).unwrap(), "25000000u");
        assert!(out.metadata().get("x-other").is_none());

        let out = onward(Request::new(()));
        assert!(out.metadata().get(gpuctl_core::auth::RANK_SECRET).is_none());
        assert_eq!(out.metadata().get(GRPC_TIMEOUT).unwrap(), "30000000u");
    }

    #[test]
    fn a_standbys_leader_hint_does_not_reach_the_worker() {
        let standby = gpuctl_core::leader::standby_status(Some("http://b:7070"));
        assert!(gpuctl_core::leader::leader_of(&standby).is_some());
        let relayed = back(standby);
        assert_eq!(relayed.code(), tonic::Code::Unavailable);
        assert!(relayed.message().contains("http://b:7070"));
        assert!(gpuctl_core::leader::leader_of(&relayed).is_none());
    }
}

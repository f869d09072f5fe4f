//! A fake agent, for tests of the coordinator: it registers over real gRPC,
//! opens its session with the heartbeat the protocol wants first, heartbeats
//! every 200 ms, and hands the test what the coordinator sends down. What it
//! sends up beyond heartbeats (acks, telemetry, logs, exits) the test says.

use std::time::Duration;

use gpuctl_proto::pb::agent_message::Msg as Up;
use gpuctl_proto::pb::agent_service_client::AgentServiceClient;
use gpuctl_proto::pb::coordinator_message::Msg as Down;
use gpuctl_proto::pb::{
    AgentMessage, Assignment, AssignmentAck, CancelJob, CoordinatorMessage, GpuInfo, Heartbeat,
    HostFacts, RegisterRequest, RegisterResponse, TelemetryBatch,
};
use gpuctl_proto::PROTOCOL_VERSION;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Streaming;

use crate::host;

/// How often a fake agent heartbeats: well inside any node timeout a test sets.
pub const HEARTBEAT: Duration = Duration::from_millis(200);

/// How long [`FakeAgent::next`] waits for the coordinator: a test that gets
/// nothing fails naming the agent instead of hanging.
pub const WAIT: Duration = Duration::from_secs(10);

/// Registers `name` with `facts` and `gpus`; the client is kept for a
/// session ([`FakeAgent::session`]), the answer for the test to check.
pub async fn register(
    url: &str,
    name: &str,
    facts: HostFacts,
    gpus: Vec<GpuInfo>,
) -> (AgentServiceClient<Channel>, RegisterResponse) {
    register_with(
        url,
        RegisterRequest {
            gpus,
            ..host::register_request(name, facts)
        },
    )
    .await
}

/// Registers with `req` over `channel` (a TLS one, with a node's own
/// certificate) and opens the session, as [`FakeAgent::start`] does.
pub async fn start_on(channel: Channel, req: RegisterRequest) -> FakeAgent {
    let name = req.name.clone();
    let mut client = AgentServiceClient::new(channel)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20);
    client.register(req).await.unwrap();
    FakeAgent::session(client, &name).await
}

/// Sends `req` as a registration; panics where the coordinator refuses it.
pub async fn register_with(
    url: &str,
    req: RegisterRequest,
) -> (AgentServiceClient<Channel>, RegisterResponse) {
    let mut client = AgentServiceClient::connect(url.to_string()).await.unwrap();
    let resp = client.register(req).await.unwrap().into_inner();
    (client, resp)
}

/// A heartbeat of node `name`, running nothing.
pub fn heartbeat(name: &str) -> AgentMessage {
    AgentMessage {
        msg: Some(Up::Heartbeat(Heartbeat {
            node: name.into(),
            protocol_version: PROTOCOL_VERSION,
            unix_ms: gpuctl_core::clock::Clock::system().now_ms(),
            running: vec![],
            preflight: vec![],
        })),
    }
}

/// A fake agent: registered, with its session open, heartbeating every
/// [`HEARTBEAT`] until [`FakeAgent::stop_heartbeats`] or the session ends.
pub struct FakeAgent {
    pub name: String,
    /// What the agent sends: the test may send anything a real agent would.
    pub up: mpsc::Sender<AgentMessage>,
    /// What the coordinator sends; [`FakeAgent::next`] reads it.
    pub down: Streaming<CoordinatorMessage>,
    beating: Option<JoinHandle<()>>,
}

impl FakeAgent {
    /// Registers `name` with `facts` and `gpus` and opens its session.
    pub async fn start(url: &str, name: &str, facts: HostFacts, gpus: Vec<GpuInfo>) -> FakeAgent {
        let (client, _) = register(url, name, facts, gpus).await;
        FakeAgent::session(client, name).await
    }

    /// [`FakeAgent::start`] on a host of one CPU rank and no GPU.
    pub async fn cpu(url: &str, name: &str) -> FakeAgent {
        FakeAgent::start(url, name, host::cpu(name, 1), vec![]).await
    }

    /// Opens the session of the registered node `name` and starts heartbeats.
    pub async fn session(mut client: AgentServiceClient<Channel>, name: &str) -> FakeAgent {
        let (up, rx) = mpsc::channel(64);
        up.send(heartbeat(name)).await.unwrap();
        let down = client
            .session(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let (beat_tx, beat_name) = (up.clone(), name.to_string());
        let beating = tokio::spawn(async move {
            loop {
                tokio::time::sleep(HEARTBEAT).await;
                if beat_tx.send(heartbeat(&beat_name)).await.is_err() {
                    return;
                }
            }
        });
        FakeAgent {
            name: name.into(),
            up,
            down,
            beating: Some(beating),
        }
    }

    /// The coordinator's next message; fails after [`WAIT`] or if the
    /// session ended.
    pub async fn next(&mut self) -> Down {
        tokio::time::timeout(WAIT, self.down.message())
            .await
            .unwrap_or_else(|_| panic!("{}: nothing from the coordinator in 10 s", self.name))
            .unwrap()
            .expect("session open")
            .msg
            .unwrap()
    }

    /// The next message, which must be an assignment.
    pub async fn assignment(&mut self) -> Assignment {
        match self.next().await {
            Down::Assignment(a) => a,
            other => panic!("{}: expected an assignment, got {other:?}", self.name),
        }
    }

    /// The next assignment; cancels of jobs that already ended are skipped.
    pub async fn assignment_after_cancels(&mut self) -> Assignment {
        loop {
            match self.next().await {
                Down::Assignment(a) => return a,
                Down::Cancel(_) => continue,
                other => panic!("{}: expected an assignment, got {other:?}", self.name),
            }
        }
    }

    /// The next message, which must be a cancel.
    pub async fn cancel(&mut self) -> CancelJob {
        match self.next().await {
            Down::Cancel(c) => c,
            other => panic!("{}: expected a cancel, got {other:?}", self.name),
        }
    }

    /// Sends `msg` up the session.
    pub async fn send(&self, msg: Up) {
        self.up
            .send(AgentMessage { msg: Some(msg) })
            .await
            .unwrap_or_else(|_| panic!("{}: session closed", self.name));
    }

    /// Acks `a` as a real agent does once its workers started.
    pub async fn ack(&self, a: &Assignment) {
        self.send(Up::Ack(AssignmentAck {
            job_id: a.job_id.clone(),
            attempt: a.attempt,
            ok: true,
            ..Default::default()
        }))
        .await;
    }

    /// Sends one telemetry batch.
    pub async fn telemetry(&self, batch: TelemetryBatch) {
        self.send(Up::Telemetry(batch)).await;
    }

    /// Stops heartbeats, so that the coordinator finds the node lost.
    pub fn stop_heartbeats(&mut self) {
        if let Some(h) = self.beating.take() {
            h.abort();
        }
    }
}

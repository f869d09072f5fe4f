//! A fake coordinator, for tests of the agent: `AgentService` served on a
//! loopback port over the real gRPC transport. It records every registration
//! and hands each session to the test, which reads what the agent sends and
//! answers as it likes; it can be away (registrations fail), refuse jobs an
//! agent asks it to adopt, and end a session by dropping it.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuctl_proto::pb::agent_message::Msg as Up;
use gpuctl_proto::pb::agent_service_server::{AgentService, AgentServiceServer};
use gpuctl_proto::pb::{
    AgentMessage, AssignmentAck, CoordinatorMessage, RegisterRequest, RegisterResponse,
    WorkerExited, WorkerLog,
};
use gpuctl_proto::PROTOCOL_VERSION;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

/// How long the fake waits for an agent to register or to send a message:
/// a test that gets nothing fails instead of hanging.
pub const WAIT: Duration = Duration::from_secs(10);

type Out = mpsc::Sender<Result<CoordinatorMessage, Status>>;

/// What the fake answers a registration with, beside the node's name.
#[derive(Clone, Debug)]
pub struct Replies {
    /// `RegisterResponse.heartbeat_interval_ms`.
    pub heartbeat_interval_ms: u32,
    /// `RegisterResponse.coordinator_url`, the URL workers are told; empty:
    /// the agent keeps the one it dialled.
    pub coordinator_url: String,
}

impl Default for Replies {
    fn default() -> Self {
        // Short, so that an agent under test heartbeats often.
        Replies {
            heartbeat_interval_ms: 100,
            coordinator_url: String::new(),
        }
    }
}

/// What the served half shares with the test's half.
struct Shared {
    replies: Replies,
    away: AtomicBool,
    refuse: Mutex<Vec<String>>,
}

struct Service {
    shared: Arc<Shared>,
    registers: mpsc::UnboundedSender<RegisterRequest>,
    sessions: mpsc::UnboundedSender<FakeSession>,
}

#[tonic::async_trait]
impl AgentService for Service {
    async fn register(
        &self,
        req: Request<RegisterRequest>,
    ) -> Result<Response<RegisterResponse>, Status> {
        if self.shared.away.load(Ordering::SeqCst) {
            return Err(Status::unavailable("away"));
        }
        let req = req.into_inner();
        // Every job the agent still runs is adopted unless the test refuses it.
        let refuse = self.shared.refuse.lock().unwrap().clone();
        let (refused, adopted) = req
            .running
            .iter()
            .map(|r| r.job_id.clone())
            .partition(|id| refuse.contains(id));
        let name = req.name.clone();
        // The test may have stopped listening; the agent still gets its answer.
        let _ = self.registers.send(req);
        Ok(Response::new(RegisterResponse {
            name,
            heartbeat_interval_ms: self.shared.replies.heartbeat_interval_ms,
            protocol_version: PROTOCOL_VERSION,
            coordinator_url: self.shared.replies.coordinator_url.clone(),
            adopted,
            refused,
            pace: None,
        }))
    }

    type SessionStream = Pin<Box<dyn Stream<Item = Result<CoordinatorMessage, Status>> + Send>>;

    async fn session(
        &self,
        req: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let (out, rx) = mpsc::channel(16);
        let _ = self.sessions.send(FakeSession {
            inbound: req.into_inner(),
            out,
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// The fake coordinator, serving until the test's runtime ends.
pub struct FakeCoordinator {
    /// The URL agents dial (`http://127.0.0.1:PORT`).
    pub url: String,
    shared: Arc<Shared>,
    registers: mpsc::UnboundedReceiver<RegisterRequest>,
    sessions: mpsc::UnboundedReceiver<FakeSession>,
}

impl FakeCoordinator {
    /// Serves on a free loopback port with the default [`Replies`].
    pub async fn start() -> FakeCoordinator {
        FakeCoordinator::start_with(Replies::default()).await
    }

    /// Serves on a free loopback port answering registrations with `replies`.
    pub async fn start_with(replies: Replies) -> FakeCoordinator {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shared = Arc::new(Shared {
            replies,
            away: AtomicBool::new(false),
            refuse: Mutex::new(Vec::new()),
        });
        let (reg_tx, registers) = mpsc::unbounded_channel();
        let (ses_tx, sessions) = mpsc::unbounded_channel();
        let service = Service {
            shared: shared.clone(),
            registers: reg_tx,
            sessions: ses_tx,
        };
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(AgentServiceServer::new(service))
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        FakeCoordinator {
            url,
            shared,
            registers,
            sessions,
        }
    }

    /// While `away`, registrations fail as `Unavailable`, as when no
    /// coordinator answers.
    pub fn set_away(&self, away: bool) {
        self.shared.away.store(away, Ordering::SeqCst);
    }

    /// Jobs to refuse when an agent registers listing them as running; the
    /// rest it lists are adopted.
    pub fn refuse(&self, jobs: &[&str]) {
        *self.shared.refuse.lock().unwrap() = jobs.iter().map(|j| j.to_string()).collect();
    }

    /// The next registration, within [`WAIT`].
    pub async fn registration(&mut self) -> RegisterRequest {
        self.registration_within(WAIT).await
    }

    /// The next registration, within `limit`.
    pub async fn registration_within(&mut self, limit: Duration) -> RegisterRequest {
        tokio::time::timeout(limit, self.registers.recv())
            .await
            .unwrap_or_else(|_| panic!("no agent registered within {limit:?}"))
            .expect("the fake coordinator stopped")
    }

    /// The next session an agent opened, within [`WAIT`].
    pub async fn session(&mut self) -> FakeSession {
        tokio::time::timeout(WAIT, self.sessions.recv())
            .await
            .expect("no session opened within 10 s")
            .expect("the fake coordinator stopped")
    }
}

/// One agent's session: what it sends, and the way down to it. Dropping it
/// ends the session for the agent.
pub struct FakeSession {
    pub inbound: Streaming<AgentMessage>,
    pub out: Out,
}

impl FakeSession {
    /// The agent's next message, within [`WAIT`].
    pub async fn next(&mut self) -> Up {
        tokio::time::timeout(WAIT, self.inbound.message())
            .await
            .expect("agent sent nothing within 10 s")
            .expect("stream error")
            .expect("stream ended")
            .msg
            .expect("empty message")
    }

    /// Reads until `want` matches, skipping heartbeats and other messages.
    pub async fn until<T>(&mut self, want: impl Fn(&Up) -> Option<T>) -> T {
        loop {
            let m = self.next().await;
            if let Some(t) = want(&m) {
                return t;
            }
        }
    }

    /// The agent's next ack, skipping what comes before it.
    pub async fn ack(&mut self) -> AssignmentAck {
        self.until(|m| match m {
            Up::Ack(a) => Some(a.clone()),
            _ => None,
        })
        .await
    }

    /// The agent's next report of a worker's exit, skipping what comes before it.
    pub async fn exited(&mut self) -> WorkerExited {
        self.until(|m| match m {
            Up::WorkerExited(e) => Some(e.clone()),
            _ => None,
        })
        .await
    }

    /// The agent's next worker log, skipping what comes before it.
    pub async fn log(&mut self) -> WorkerLog {
        self.until(|m| match m {
            Up::Log(l) => Some(l.clone()),
            _ => None,
        })
        .await
    }

    /// Sends `msg` down to the agent.
    pub async fn send(&self, msg: CoordinatorMessage) {
        self.out
            .send(Ok(msg))
            .await
            .expect("the agent ended the session");
    }

    /// Ends the session, as a coordinator that went away.
    pub fn close(self) {}
}

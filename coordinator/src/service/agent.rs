//! `AgentService`: registration and the long-lived session. Each session gets
//! an id so that a replaced session's late close cannot detach the new one.
//!
//! A session must say who it is (its first Heartbeat) within the node
//! timeout, and one that sends nothing for that long is closed: 1,000
//! Session streams that never spoke once stayed open for good, each with
//! its task (issue 46). Both count as refused sessions on `/metrics`. A
//! live agent heartbeats several times per node timeout (`heartbeat_interval`).

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use gpuctl_proto::pb::agent_message::Msg;
use gpuctl_proto::pb::agent_service_server::AgentService;
use gpuctl_proto::pb::{AgentMessage, CoordinatorMessage, RegisterRequest, RegisterResponse};
use gpuctl_proto::PROTOCOL_VERSION;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};
use tracing::warn;

use super::admission::Registrations;
use super::auth::{PeerCerts, Security};
use super::inbox::{Inbox, Waiting};
use super::trace::Fetches;
use crate::refusals::Refused;
use crate::scheduler::{AgentEvent, Event, RankEvent, SchedulerHandle, SessionTx};

/// Refuses an agent that speaks another protocol version, naming both.
pub fn check_protocol(node: &str, version: u32) -> Result<(), Status> {
    if version == PROTOCOL_VERSION {
        return Ok(());
    }
    Err(Status::failed_precondition(super::clip(format!(
        "protocol version mismatch: agent `{node}` speaks gpuctl protocol {version}, this coordinator speaks protocol {PROTOCOL_VERSION}; run the same gpuctl release on agents and coordinator"
    ))))
}

pub struct AgentSvc {
    sched: SchedulerHandle,
    /// `--advertise-url`, or the listen URL when it is a concrete address.
    advertise_url: Option<String>,
    next_session: Arc<AtomicU64>,
    security: Security,
    /// Where sessions are read (`runtime::FleetRuntime`).
    fleet: Handle,
    /// Pieces of traces go to the `GetTrace` call that asked for them.
    fetches: Fetches,
    /// `--node-timeout`: how long a session may be silent, the first
    /// heartbeat included.
    node_timeout: Duration,
    /// Telemetry samples read and not yet taken by the scheduler, in every
    /// session together.
    waiting: Waiting,
    registrations: Registrations,
}

impl AgentSvc {
    pub fn new(
        sched: SchedulerHandle,
        advertise_url: Option<String>,
        security: Security,
        fleet: Handle,
        fetches: Fetches,
        node_timeout: Duration,
        registrations: Registrations,
    ) -> Self {
        AgentSvc {
            sched,
            advertise_url,
            next_session: Arc::new(AtomicU64::new(1)),
            security,
            fleet,
            fetches,
            node_timeout,
            waiting: Waiting::default(),
            registrations,
        }
    }
}

type SessionStream = Pin<Box<dyn Stream<Item = Result<CoordinatorMessage, Status>> + Send>>;

#[tonic::async_trait]
impl AgentService for AgentSvc {
    async fn register(
        &self,
        req: Request<RegisterRequest>,
    ) -> Result<Response<RegisterResponse>, Status> {
        // Listening on 0.0.0.0: the address this agent reached us at is one
        // its workers can reach too.
        let url = self
            .advertise_url
            .clone()
            .or_else(|| req.local_addr().map(|a| format!("http://{a}")))
            .unwrap_or_default();
        // Workers reach a TLS coordinator over TLS too (with the agent's CA).
        let url = match url.strip_prefix("http://") {
            Some(rest) if self.security.tls() => format!("https://{rest}"),
            _ => url,
        };
        let certs = req.peer_certs();
        let req = req.into_inner();
        check_protocol(&req.name, req.protocol_version)?;
        self.security
            .check_agent(certs.as_ref(), &req.name)
            .inspect_err(|s| warn!("register refused: {}", s.message()))?;
        self.registrations.admit()?;
        let resp = self
            .sched
            .ask(|reply| AgentEvent::AgentRegistered {
                req,
                coordinator_url: url,
                reply,
            })
            .await??;
        Ok(Response::new(resp))
    }

    type SessionStream = SessionStream;

    async fn session(
        &self,
        req: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<SessionStream>, Status> {
        // Answer at once and read the first heartbeat afterwards: an agent may
        // wait for the response before it sends anything. Refusals then come
        // down the stream as its error.
        let certs = req.peer_certs();
        let peer = req
            .remote_addr()
            .map_or_else(|| "an unknown address".to_string(), |a| a.to_string());
        let inbound = req.into_inner();
        let session = self.next_session.fetch_add(1, Ordering::Relaxed);
        // The stream carries what the scheduler sends, then why the session
        // was refused or broken off, if it was: an error ends a gRPC stream,
        // so it comes after every message the scheduler queued.
        let (tx, rx) = mpsc::unbounded_channel();
        let (refuse, refusal) = oneshot::channel();
        self.fleet.spawn(run_session(
            self.sched.clone(),
            (self.security.clone(), certs),
            inbound,
            tx,
            refuse,
            Id {
                session,
                peer,
                silent_for: self.node_timeout,
                waiting: self.waiting.clone(),
            },
            self.fetches.clone(),
        ));
        let refusal = futures::stream::once(let_go(refusal, session)).filter_map(|r| r.map(Err));
        let stream = UnboundedReceiverStream::new(rx)
            .map(|m| Ok(*m))
            .chain(refusal);
        Ok(Response::new(Box::pin(stream)))
    }
}

/// How long a session whose scheduler side ended waits for its reader's
/// refusal before it ends on its own.
const LET_GO_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// How a session's stream ends once the scheduler no longer sends on it: with
/// the reader's refusal when there is one; with nothing when the agent ended
/// it; else, while the agent still talks, with ABORTED. The scheduler lets go
/// of a session when another process registers under the node's name, or the
/// node is removed: a session left open then had the real agent heartbeat
/// into a void, its node `lost` for good (issue 35); told, it registers again.
async fn let_go(refusal: oneshot::Receiver<Status>, session: u64) -> Option<Status> {
    match tokio::time::timeout(LET_GO_WAIT, refusal).await {
        Ok(Ok(status)) => Some(status),
        Ok(Err(_)) => None,
        Err(_) => Some(Status::aborted(format!(
            "session {session} ended by the coordinator: another process registered under this node's name, the node was removed, or the coordinator is stopping; register again"
        ))),
    }
}

/// Which session: its number, where it comes from, how long it may be
/// silent (the node timeout), and the fleet's waiting telemetry its inbox
/// counts against.
struct Id {
    session: u64,
    peer: String,
    silent_for: Duration,
    waiting: Waiting,
}

/// Reads the session's first message and has the scheduler attach `tx` to
/// the node it names; returns the node's name.
async fn open(
    sched: &SchedulerHandle,
    (security, certs): &(Security, Option<PeerCerts>),
    inbound: &mut Streaming<AgentMessage>,
    tx: SessionTx,
    id: &Id,
) -> Result<String, Status> {
    let session = id.session;
    let first = match tokio::time::timeout(id.silent_for, inbound.message()).await {
        Ok(first) => first?,
        Err(_) => {
            let why = format!(
                "no first heartbeat within the node timeout ({}) of opening the session: closed; \
                 an agent sends one at once",
                humantime::format_duration(id.silent_for)
            );
            sched.refusals().refuse(Refused::Session, &id.peer, &why);
            return Err(Status::deadline_exceeded(why));
        }
    };
    let first = first
        .ok_or_else(|| Status::invalid_argument("the session ended before its first heartbeat"))?;
    let Some(Msg::Heartbeat(hb)) = first.msg else {
        return Err(Status::failed_precondition(
            "the first message of a session must be a Heartbeat naming the registered node",
        ));
    };
    check_protocol(&hb.node, hb.protocol_version)?;
    security.check_agent(certs.as_ref(), &hb.node)?;
    let node = hb.node.clone();
    sched
        .ask(|reply| AgentEvent::SessionOpened {
            node: node.clone(),
            session,
            tx,
            first: hb,
            reply,
        })
        .await??;
    Ok(node)
}

/// Reads one agent's session until it ends, turning messages into events.
/// A refusal goes to `refuse`, which ends the agent's stream with it. The
/// session is read ahead of the scheduler, into an [`Inbox`].
async fn run_session(
    sched: SchedulerHandle,
    auth: (Security, Option<PeerCerts>),
    mut inbound: Streaming<AgentMessage>,
    tx: SessionTx,
    refuse: oneshot::Sender<Status>,
    id: Id,
    fetches: Fetches,
) {
    let session = id.session;
    // Boxed, as the end below: the task of each of thousands of sessions
    // lives as long as its agent, and was ~6 KB a session with the first
    // message's and the last events' futures laid out in it.
    let node = match Box::pin(open(&sched, &auth, &mut inbound, tx, &id)).await {
        Ok(node) => node,
        Err(status) => {
            // A silent one is logged, at a bounded rate, as a refusal.
            if status.code() != tonic::Code::DeadlineExceeded {
                warn!("session refused: {}", status.message());
            }
            let _ = refuse.send(status);
            return;
        }
    };
    let mut lane = sched.fleet_lane();
    let mut inbox = Inbox::new(id.waiting.clone());
    let mut why = "the agent ended it".to_string();
    // Silence counts only while the session is read: with the inbox full,
    // the agent's messages wait in the connection, not in the agent.
    let silence = tokio::time::sleep(id.silent_for);
    tokio::pin!(silence);
    loop {
        if !inbox.has_room() {
            silence.as_mut().reset(Instant::now() + id.silent_for);
        }
        tokio::select! {
            // Handing on first: reading is only for what the scheduler
            // cannot take yet.
            biased;
            room = poll_fn(|cx| lane.poll_reserve(cx)), if !inbox.is_empty() => {
                let Some(ev) = inbox.pop(&node).filter(|_| room.is_ok()) else {
                    return; // the scheduler stopped
                };
                let _ = lane.send_item(ev);
            }
            msg = inbound.message(), if inbox.has_room() => {
                silence.as_mut().reset(Instant::now() + id.silent_for);
                let msg = match msg {
                    Ok(Some(m)) => m,
                    Ok(None) => break,
                    Err(e) => {
                        // "keep-alive timed out", "connection reset", …: what
                        // an operator needs to tell a dead host from a slow one.
                        why = e.message().to_string();
                        break;
                    }
                };
                if let Err(status) = read(&node, session, msg, &mut inbox, (&fetches, &sched)) {
                    warn!(node = %node, "{}", status.message());
                    let _ = refuse.send(status);
                    break;
                }
            }
            () = &mut silence, if inbox.has_room() => {
                why = format!(
                    "nothing from the agent for the node timeout ({}): closed; a live agent \
                     heartbeats several times in it",
                    humantime::format_duration(id.silent_for)
                );
                sched.refusals().refuse(Refused::Session, &node, &why);
                let _ = refuse.send(Status::deadline_exceeded(why.clone()));
                break;
            }
        }
    }
    if inbox.dropped > 0 && crate::burst::TELEMETRY_DROPPED.each(&node, inbox.dropped) {
        warn!(
            node = %node,
            samples = inbox.dropped,
            "telemetry samples dropped while the scheduler was busy"
        );
    }
    // A place in line it still waits for would hold a slot of the lane.
    drop(lane);
    fetches.session_closed(&node);
    Box::pin(close(&sched, inbox, node, session, why)).await;
}

/// Hands the scheduler what `inbox` still holds, then the session's end.
async fn close(sched: &SchedulerHandle, mut inbox: Inbox, node: String, session: u64, why: String) {
    while let Some(ev) = inbox.pop(&node) {
        sched.tell(ev).await;
    }
    sched
        .tell(AgentEvent::SessionClosed { node, session, why })
        .await;
}

/// Puts one message of `node`'s session into `inbox`; a heartbeat of
/// another protocol version ends the session.
fn read(
    node: &str,
    session: u64,
    msg: AgentMessage,
    inbox: &mut Inbox,
    (fetches, sched): (&Fetches, &SchedulerHandle),
) -> Result<(), Status> {
    let node = node.to_string();
    let event: Event = match msg.msg {
        Some(Msg::Heartbeat(hb)) => {
            check_protocol(&hb.node, hb.protocol_version)?;
            AgentEvent::Heartbeat { node, session, hb }.into()
        }
        Some(Msg::WorkerExited(exited)) => RankEvent::WorkerExited { node, exited }.into(),
        Some(Msg::Log(log)) => RankEvent::WorkerLog { node, log }.into(),
        Some(Msg::Ack(ack)) => AgentEvent::AssignmentAck { node, ack }.into(),
        // Not the scheduler's: it goes straight to the fetch that asked.
        Some(Msg::TraceChunk(piece)) => {
            let id = piece.request_id;
            if fetches.answer(&node, piece) {
                let why =
                    format!("node {node} answered trace fetch {id}, which asked another node");
                sched.refusals().refuse(Refused::Trace, &node, &why);
            }
            return Ok(());
        }
        Some(Msg::Telemetry(batch)) => {
            inbox.push_telemetry(&node, batch);
            return Ok(());
        }
        None => return Ok(()),
    };
    inbox.push(event);
    Ok(())
}

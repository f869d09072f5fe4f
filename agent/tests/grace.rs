//! An agent that loses its coordinator keeps its workers for the grace: it
//! registers again listing them, stops the jobs the coordinator refuses, and
//! stops the rest only when the grace runs out without a session; the exits
//! still reach the coordinator it finds next. Against a stand-in coordinator
//! on loopback with real (shell-script) workers.

mod common;

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{assignment, pid_alive, read_pid, until, worker_script};
use gpuctl_agent::session::{self, SessionConfig};
use gpuctl_agent::workers::{WorkerSettings, Workers};
use gpuctl_core::pb::{
    agent_message::Msg,
    agent_service_server::{AgentService, AgentServiceServer},
    AgentMessage, CoordinatorMessage, HostFacts, RegisterRequest, RegisterResponse,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

type Out = mpsc::Sender<Result<CoordinatorMessage, Status>>;

/// A coordinator that can be away (registrations fail) and refuses the
/// jobs named in `refuse`.
struct Fake {
    registers: mpsc::UnboundedSender<RegisterRequest>,
    sessions: mpsc::UnboundedSender<(Streaming<AgentMessage>, Out)>,
    away: Arc<AtomicBool>,
    refuse: Arc<Mutex<Vec<String>>>,
}

#[tonic::async_trait]
impl AgentService for Fake {
    async fn register(
        &self,
        req: Request<RegisterRequest>,
    ) -> Result<Response<RegisterResponse>, Status> {
        if self.away.load(Ordering::SeqCst) {
            return Err(Status::unavailable("away"));
        }
        let req = req.into_inner();
        let refuse = self.refuse.lock().unwrap().clone();
        let (refused, adopted) = req
            .running
            .iter()
            .map(|r| r.job_id.clone())
            .partition(|id| refuse.contains(id));
        let name = req.name.clone();
        self.registers.send(req).unwrap();
        Ok(Response::new(RegisterResponse {
            name,
            heartbeat_interval_ms: 100,
            protocol_version: gpuctl_core::PROTOCOL_VERSION,
            adopted,
            refused,
            ..Default::default()
        }))
    }

    type SessionStream = Pin<Box<dyn Stream<Item = Result<CoordinatorMessage, Status>> + Send>>;

    async fn session(
        &self,
        req: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let (tx, rx) = mpsc::channel(16);
        self.sessions.send((req.into_inner(), tx)).unwrap();
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

#[tokio::test]
async fn workers_outlive_the_coordinator_for_the_grace() {
    let tmp = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (reg_tx, mut registers) = mpsc::unbounded_channel();
    let (ses_tx, mut sessions) = mpsc::unbounded_channel();
    let away = Arc::new(AtomicBool::new(false));
    let refuse = Arc::new(Mutex::new(vec!["job-2".to_string()]));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AgentServiceServer::new(Fake {
                registers: reg_tx,
                sessions: ses_tx,
                away: away.clone(),
                refuse: refuse.clone(),
            }))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let settings = WorkerSettings {
        node: "test-node".into(),
        worker_bin: worker_script(tmp.path(), "grace=$GPUCTL_COORDINATOR_GRACE_MS"),
        work_dir: tmp.path().join("work"),
        ld_library_path: None,
        gpu_uuids: Default::default(),
        kill_grace: Duration::from_millis(500),
    };
    let (workers, events) = Workers::new(settings, url.clone());
    let grace = Duration::from_secs(3);
    let cfg = SessionConfig {
        coordinator: url,
        name: "test-node".into(),
        facts: HostFacts::default(),
        gpus: vec![],
        heartbeat_interval: Duration::from_secs(1),
        preflight: vec![],
        checker: None,
        connected: Arc::new(AtomicBool::new(false)),
        coordinator_grace: grace,
        relay: None,
    };
    let shutdown = CancellationToken::new();
    let agent = tokio::spawn(session::run(cfg, workers.clone(), events, shutdown.clone()));

    assert!(registers.recv().await.unwrap().running.is_empty());
    let (mut inbound, out) = sessions.recv().await.unwrap();
    for job in ["job-1", "job-2"] {
        out.send(Ok(assignment(job))).await.unwrap();
        assert!(
            until(&mut inbound, |m| match m {
                Msg::Ack(a) => Some(a.ok),
                _ => None,
            })
            .await
        );
    }
    let line = until(&mut inbound, |m| match m {
        Msg::Log(l) => Some(l.lines[0].clone()),
        _ => None,
    })
    .await;
    assert_eq!(line, "grace=3000", "workers are told the grace");
    let pid1 = read_pid(&tmp.path().join("pid-job-1")).await;
    let pid2 = read_pid(&tmp.path().join("pid-job-2")).await;

    // The session ends: the agent registers again listing both jobs, keeps
    // the adopted one and stops the refused one.
    drop((out, inbound));
    let reg = tokio::time::timeout(Duration::from_secs(10), registers.recv())
        .await
        .expect("no re-register")
        .unwrap();
    let listed: Vec<&str> = reg.running.iter().map(|r| r.job_id.as_str()).collect();
    assert_eq!(listed, vec!["job-1", "job-2"]);
    let (mut inbound, out) = sessions.recv().await.unwrap();
    let exited = until(&mut inbound, |m| match m {
        Msg::WorkerExited(e) => Some(e.clone()),
        _ => None,
    })
    .await;
    assert_eq!(
        (exited.job_id.as_str(), exited.stopped_by().label()),
        ("job-2", "coordinator-lost")
    );
    assert!(!pid_alive(pid2));
    assert!(pid_alive(pid1), "the adopted job's worker runs on");

    // Away for longer than the grace: the worker is stopped at its end, and
    // its exit reaches the coordinator once it is back.
    away.store(true, Ordering::SeqCst);
    let lost_at = std::time::Instant::now();
    drop((out, inbound));
    tokio::time::sleep(grace - Duration::from_millis(500)).await;
    assert!(pid_alive(pid1), "killed before the grace ended");
    let mut gone = None;
    for _ in 0..100 {
        if !pid_alive(pid1) {
            gone = Some(lost_at.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let gone = gone.expect("the worker outlived the grace by 5 s");
    assert!(gone >= grace, "{gone:?}");
    away.store(false, Ordering::SeqCst);
    let reg = tokio::time::timeout(Duration::from_secs(15), registers.recv())
        .await
        .expect("no re-register")
        .unwrap();
    assert!(reg.running.is_empty(), "{:?}", reg.running);
    let (mut inbound, _out) = sessions.recv().await.unwrap();
    let exited = until(&mut inbound, |m| match m {
        Msg::WorkerExited(e) => Some(e.clone()),
        _ => None,
    })
    .await;
    assert_eq!(
        (exited.job_id.as_str(), exited.stopped_by().label()),
        ("job-1", "coordinator-lost")
    );

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), agent)
        .await
        .expect("agent did not stop")
        .unwrap();
    assert_eq!(workers.live_workers(), 0);
}

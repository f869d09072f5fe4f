//! The agent's life with the coordinator: `Register`, then one long `Session`
//! stream (heartbeats and worker events up, assignments and cancels down;
//! pieces of profile traces up when the coordinator asks for them).
//!
//! When the stream breaks or ends, the coordinator is taken for away, not for
//! gone: the workers keep running for `--coordinator-grace` while the agent
//! reconnects with backoff and registers again listing the jobs it still runs,
//! which a restarted coordinator (or a standby that took over) adopts. Only
//! when the grace runs out without a session, or the coordinator refuses a
//! job, are workers killed (`stopped_by` coordinator-lost). Worker events
//! not yet sent (exits, bounded logs) are kept and sent on the next session.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gpuctl_core::client::Channel;
use gpuctl_core::shutdown::Shutdown;
use gpuctl_proto::pb::{
    agent_message::Msg, agent_service_client::AgentServiceClient, coordinator_message,
    AgentMessage, Assignment, CoordinatorMessage, GpuInfo, Heartbeat, HostFacts, PreflightCheck,
    RegisterRequest,
};
use gpuctl_proto::PROTOCOL_VERSION;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use crate::preflight::{self, Preflight};
use crate::relay::Relay;
use crate::workers::{stop_reason_of, EventReceiver, StopReason, Workers};

/// Connecting and registering (any unary call) must answer within these.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// A stream that accepts nothing for this long is as good as broken.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// Killing workers takes the kill grace (2 s) plus pipe draining; this bounds
/// it so a wedged process cannot hold up reconnecting or exiting.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// What the agent tells the coordinator about itself.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// `http://host:port`.
    pub coordinator: String,
    pub name: String,
    pub facts: HostFacts,
    pub gpus: Vec<GpuInfo>,
    pub heartbeat_interval: Duration,
    /// The coordinator's pace, shared with the telemetry loop.
    pub pace: Arc<gpuctl_core::pace::Pace>,
    /// The checks run at start, sent with `Register`.
    pub preflight: Vec<PreflightCheck>,
    /// Runs the checks again for every assignment (a failing one refuses
    /// it); `None` starts assignments unchecked.
    pub checker: Option<Arc<Preflight>>,
    /// True while a session is open (for `/metrics`).
    pub connected: Arc<AtomicBool>,
    /// How long workers outlive a lost coordinator (zero: killed at once).
    pub coordinator_grace: Duration,
    /// The workers' relay, told each coordinator the agent registers with;
    /// `None` when workers call the coordinator themselves.
    pub relay: Option<Arc<Relay>>,
}

/// Clears the connected flag when a session ends, however it ends.
struct Connected<'a>(&'a AtomicBool);

impl Drop for Connected<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

/// Why one connection ended.
enum Ended {
    Shutdown,
    /// `registered` says whether the coordinator had accepted us, which
    /// resets the backoff.
    Lost {
        reason: String,
        registered: bool,
    },
}

/// Runs sessions until `shutdown`; returns once every worker is gone.
pub async fn run(
    cfg: SessionConfig,
    workers: Arc<Workers>,
    mut events: EventReceiver,
    shutdown: Shutdown,
) {
    let grace = cfg.coordinator_grace;
    workers.set_coordinator_grace(grace);
    // Since when no session is open while workers may run (None: connected).
    let (away_tx, away_rx) = watch::channel(None);
    let watchdog = tokio::spawn(grace_watchdog(
        workers.clone(),
        grace,
        away_rx,
        shutdown.clone(),
    ));
    let mut failures = 0u32;
    while !shutdown.is_cancelled() {
        match serve_once(&cfg, &workers, &mut events, &shutdown, &away_tx).await {
            Ended::Shutdown => break,
            Ended::Lost { reason, registered } => {
                away_tx.send_if_modified(|away| {
                    let first = away.is_none();
                    if first {
                        *away = Some(Instant::now());
                    }
                    first
                });
                let live = workers.live_workers();
                failures = if registered { 0 } else { failures + 1 };
                // Jittered: a fleet that lost its coordinator together must
                // not come back to the next one in waves.
                let backoff = gpuctl_core::retry::reconnect::wait(failures + 1);
                if registered {
                    tracing::warn!(coordinator = %cfg.coordinator, live_workers = live,
                        "lost the coordinator: {reason}; reconnecting (workers are kept for {grace:?})");
                } else {
                    tracing::warn!(coordinator = %cfg.coordinator, failures, live_workers = live,
                        "cannot register with the coordinator: {reason}; retrying in {backoff:?}");
                }
                if grace.is_zero() {
                    // Killed before reconnecting, so that the next coordinator
                    // hears of none of them as running.
                    workers
                        .kill_all_and_wait(StopReason::CoordinatorLost, KILL_WAIT)
                        .await;
                }
                // The events still queued (logs, exits of workers that ended
                // meanwhile) stay queued: the next session sends them after
                // its first heartbeat.
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = shutdown.cancelled() => break,
                }
            }
        }
    }
    drop(away_tx);
    let _ = watchdog.await;
    // Nothing may outlive the agent (also covers a shutdown between sessions).
    workers
        .kill_all_and_wait(StopReason::AgentShutdown, KILL_WAIT)
        .await;
}

/// Kills every worker once no session has been open for the grace: a job
/// cannot finish without a coordinator to report to, and its GPUs must not be
/// held for good. Reconnecting goes on; the exits are sent when it succeeds.
async fn grace_watchdog(
    workers: Arc<Workers>,
    grace: Duration,
    mut away: watch::Receiver<Option<Instant>>,
    shutdown: Shutdown,
) {
    loop {
        let since = *away.borrow_and_update();
        let expired = async {
            match since {
                Some(t) => tokio::time::sleep_until(t + grace).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = away.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = expired => {
                if workers.live_workers() > 0 {
                    tracing::error!(live_workers = workers.live_workers(),
                        "no coordinator for {grace:?} (--coordinator-grace): stopping every worker");
                    workers
                        .kill_all_and_wait(StopReason::CoordinatorLost, KILL_WAIT)
                        .await;
                }
                // Nothing more to do until a session opens (or closes) again.
                if away.changed().await.is_err() {
                    return;
                }
            }
            _ = shutdown.cancelled() => return,
        }
    }
}

async fn connect(urls: &str) -> Result<(AgentServiceClient<Channel>, Channel), String> {
    // `urls`: `--coordinator`, one URL or several (a leader and its
    // standbys); the one that leads is used. The builder's HTTP/2 keepalive
    // is how an idle session notices a vanished coordinator host; its
    // request timeout bounds Register.
    let list = gpuctl_core::leader::split_urls(urls);
    let channel = gpuctl_core::leader::find_leader(&list, |url| {
        gpuctl_core::client::builder(url)
            .connect_timeout(CONNECT_TIMEOUT)
            .request_timeout(REQUEST_TIMEOUT)
    })
    .await
    .map_err(|e| format!("cannot reach {e}"))?;
    if list.len() > 1 {
        tracing::info!(leader = %channel.url(), "the leading coordinator");
    }
    let client = AgentServiceClient::new(channel.clone())
        .max_decoding_message_size(gpuctl_core::server::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(gpuctl_core::server::MAX_MESSAGE_BYTES);
    Ok((client, channel))
}

/// One connection: register, open the session, serve it until it ends.
async fn serve_once(
    cfg: &SessionConfig,
    workers: &Arc<Workers>,
    events: &mut EventReceiver,
    shutdown: &Shutdown,
    away: &watch::Sender<Option<Instant>>,
) -> Ended {
    let lost = |reason: String| Ended::Lost {
        reason,
        registered: false,
    };
    let (mut client, channel) = tokio::select! {
        c = connect(&cfg.coordinator) => match c {
            Ok(c) => c,
            Err(e) => return lost(e),
        },
        _ = shutdown.cancelled() => return Ended::Shutdown,
    };
    let request = RegisterRequest {
        protocol_version: PROTOCOL_VERSION,
        name: cfg.name.clone(),
        facts: Some(cfg.facts.clone()),
        gpus: cfg.gpus.clone(),
        preflight: cfg.preflight.clone(),
        // Workers kept while the coordinator was away: it adopts them or
        // refuses them.
        running: workers.running(),
    };
    let resp = tokio::select! {
        r = client.register(request) => match r {
            Ok(r) => r.into_inner(),
            Err(status) => {
                return lost(format!("Register failed ({:?}): {}", status.code(), status.message()))
            }
        },
        _ = shutdown.cancelled() => return Ended::Shutdown,
    };
    // The workers' calls share this connection from now on; a leader found
    // after a failover takes them over with the session.
    if let Some(relay) = &cfg.relay {
        relay.set_upstream(channel);
    }
    for id in &resp.refused {
        if workers.cancel(id, 0, StopReason::CoordinatorLost) {
            tracing::warn!(job = %id, "the coordinator does not know the job as running: stopping its workers");
        }
    }
    if !resp.adopted.is_empty() {
        tracing::info!(jobs = ?resp.adopted, "the coordinator adopted the jobs whose workers were kept");
    }
    let name = if resp.name.is_empty() {
        cfg.name.clone()
    } else {
        resp.name.clone()
    };
    let coordinator_url = if resp.coordinator_url.is_empty() {
        cfg.coordinator.clone()
    } else {
        resp.coordinator_url.clone()
    };
    workers.set_coordinator_url(coordinator_url.clone());
    // Beat at least as often as we were asked and as the coordinator wants.
    let mut interval = cfg.heartbeat_interval;
    if resp.heartbeat_interval_ms > 0 {
        interval = interval.min(Duration::from_millis(resp.heartbeat_interval_ms as u64));
    }
    let wanted = interval;
    cfg.pace.set(resp.pace.as_ref());
    let interval = cfg.pace.heartbeat(wanted).max(Duration::from_millis(50));

    // The first message must be a Heartbeat: queue it before the call so the
    // coordinator has it as soon as the stream opens.
    let (tx, rx) = mpsc::channel::<AgentMessage>(256);
    let _ = tx.try_send(heartbeat(&name, workers));
    let mut inbound = tokio::select! {
        r = client.session(ReceiverStream::new(rx)) => match r {
            Ok(r) => r.into_inner(),
            Err(status) => return lost(format!("Session refused ({:?}): {}", status.code(), status.message())),
        },
        _ = shutdown.cancelled() => return Ended::Shutdown,
    };
    tracing::info!(coordinator = %cfg.coordinator, node = %name, workers_told = %coordinator_url,
        heartbeat = ?interval, "registered; session open");
    cfg.connected.store(true, Ordering::Relaxed);
    let _connected = Connected(&cfg.connected);
    away.send_replace(None);

    let broken = |reason: String| Ended::Lost {
        reason,
        registered: true,
    };
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate; the first heartbeat is already queued
    let mut refresh = tokio::time::interval(PREFLIGHT_REFRESH);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    refresh.tick().await; // registration carried the first checks
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => {
                stop_gracefully(&tx, workers, events).await;
                drop(tx);
                // Give the transport a moment to flush the last messages.
                let _ = tokio::time::timeout(Duration::from_millis(500), inbound.message()).await;
                return Ended::Shutdown;
            }
            m = inbound.message() => match m {
                Ok(Some(CoordinatorMessage { msg: Some(coordinator_message::Msg::Pace(p)) })) => {
                    cfg.pace.set(Some(&p));
                    let every = cfg.pace.heartbeat(wanted).max(Duration::from_millis(50));
                    tracing::info!(heartbeat = ?every, telemetry_send = ?cfg.pace.telemetry_send(), "the coordinator paced this agent");
                    tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                }
                Ok(Some(m)) => {
                    if let Some(msg) = m.msg {
                        if let Err(e) = handle(msg, workers, cfg.checker.as_ref(), &tx).await {
                            return broken(e);
                        }
                    }
                }
                Ok(None) => return broken("the coordinator ended the session".into()),
                Err(status) => return broken(format!("session broke ({:?}): {}", status.code(), status.message())),
            },
            _ = tick.tick() => {
                if let Err(e) = send(&tx, heartbeat(&name, workers)).await {
                    return broken(e);
                }
            }
            _ = refresh.tick(), if cfg.checker.is_some() => {
                let (checks, _) = check_assignment(cfg.checker.as_ref(), workers, false).await;
                let mut hb = heartbeat(&name, workers);
                if let Some(Msg::Heartbeat(h)) = hb.msg.as_mut() {
                    h.preflight = checks;
                }
                if let Err(e) = send(&tx, hb).await {
                    return broken(e);
                }
            }
            Some(ev) = events.recv() => {
                if let Err(e) = send(&tx, ev).await {
                    return broken(e);
                }
            }
        }
    }
}

/// How often the preflight checks are run again between jobs.
const PREFLIGHT_REFRESH: Duration = Duration::from_secs(30);

async fn handle(
    msg: coordinator_message::Msg,
    workers: &Arc<Workers>,
    checker: Option<&Arc<Preflight>>,
    tx: &mpsc::Sender<AgentMessage>,
) -> Result<(), String> {
    match msg {
        coordinator_message::Msg::Assignment(a) => {
            log_assignment(&a);
            // The ack goes out before any of the new workers' events, which
            // only this loop forwards.
            let exclusive = a.spec.as_ref().is_some_and(|s| s.exclusive);
            let (checks, refusal) = check_assignment(checker, workers, exclusive).await;
            let mut ack = match refusal {
                Some(error) => workers.refuse(&a, error),
                None => workers.start(a),
            };
            ack.checks = checks;
            send(
                tx,
                AgentMessage {
                    msg: Some(Msg::Ack(ack)),
                },
            )
            .await
        }
        coordinator_message::Msg::FetchTrace(f) => {
            // Read apart from this loop: a piece of a large trace must not
            // hold up heartbeats or a cancel.
            let (dir, tx) = (workers.jobs_dir(), tx.clone());
            tokio::spawn(async move {
                let piece = crate::traces::serve(dir, f).await;
                let msg = AgentMessage {
                    msg: Some(Msg::TraceChunk(piece)),
                };
                // A broken session is noticed and handled by the loop.
                let _ = send(&tx, msg).await;
            });
            Ok(())
        }
        // Taken by the session's loop, which holds the heartbeat timer.
        coordinator_message::Msg::Pace(_) => Ok(()),
        coordinator_message::Msg::Cancel(c) => {
            let found = workers.cancel(&c.job_id, c.attempt, stop_reason_of(&c));
            if found {
                tracing::info!(job = %c.job_id, attempt = c.attempt, reason = %c.reason, "cancel: killing the job's workers");
            } else {
                tracing::debug!(job = %c.job_id, attempt = c.attempt, "cancel for a job with no workers here");
            }
            Ok(())
        }
    }
}

/// Runs preflight again before starting an assignment's workers: the
/// checks go back with the ack (the report shows the host as it was at job
/// start), with the refusal text when a check fails.
async fn check_assignment(
    checker: Option<&Arc<Preflight>>,
    workers: &Arc<Workers>,
    exclusive: bool,
) -> (Vec<PreflightCheck>, Option<String>) {
    let Some(checker) = checker.cloned() else {
        return (Vec::new(), None);
    };
    let own = workers.worker_pids();
    let node = checker.node.clone();
    match tokio::task::spawn_blocking(move || checker.run(&own).1).await {
        Ok(mut checks) => {
            if exclusive {
                preflight::exclusive(&mut checks);
            }
            let error = preflight::failures(&node, &checks);
            if error.is_some() {
                preflight::log_checks(&checks);
            }
            (checks, error)
        }
        Err(e) => {
            // A panic in a check must not stop the agent; start the job.
            tracing::error!("preflight for the assignment failed to run: {e}");
            (Vec::new(), None)
        }
    }
}

fn log_assignment(a: &Assignment) {
    let ranks: Vec<u32> = a.ranks.iter().map(|p| p.rank).collect();
    let workload = a.spec.as_ref().map(|s| s.workload.as_str()).unwrap_or("");
    tracing::info!(job = %a.job_id, attempt = a.attempt, workload, ?ranks, world_size = a.world_size,
        node_rank = a.node_rank, master = %format!("{}:{}", a.master_addr, a.master_port), "assignment");
}

/// On agent shutdown: kill the workers while still forwarding their last
/// logs and exits, so that the coordinator learns why the ranks ended.
async fn stop_gracefully(
    tx: &mpsc::Sender<AgentMessage>,
    workers: &Arc<Workers>,
    events: &mut EventReceiver,
) {
    let kill = workers.kill_all_and_wait(StopReason::AgentShutdown, KILL_WAIT);
    tokio::pin!(kill);
    loop {
        tokio::select! {
            _ = &mut kill => break,
            Some(ev) = events.recv() => {
                if send(tx, ev).await.is_err() {
                    break;
                }
            }
        }
    }
    while let Some(ev) = events.try_recv() {
        if send(tx, ev).await.is_err() {
            break;
        }
    }
}

fn heartbeat(name: &str, workers: &Workers) -> AgentMessage {
    AgentMessage {
        msg: Some(Msg::Heartbeat(Heartbeat {
            node: name.to_string(),
            protocol_version: PROTOCOL_VERSION,
            unix_ms: workers.clock().now_ms(),
            running: workers.running(),
            preflight: Vec::new(),
        })),
    }
}

async fn send(tx: &mpsc::Sender<AgentMessage>, msg: AgentMessage) -> Result<(), String> {
    match tokio::time::timeout(SEND_TIMEOUT, tx.send(msg)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err("the session stream closed".into()),
        Err(_) => Err(format!(
            "the coordinator accepted nothing for {SEND_TIMEOUT:?}"
        )),
    }
}

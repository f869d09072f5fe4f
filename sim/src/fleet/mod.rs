//! A simulated fleet: N fake agents with G GPUs each, speaking gpuctl.v1 to a
//! real coordinator exactly as `gpuctl-agent` does (Register, one Session
//! stream with heartbeats listing running ranks and telemetry batches per
//! job, both at the coordinator's pace (`sends.rs`), acknowledged
//! assignments, worker exits), and for every
//! assigned rank a fake worker ([`crate::ranks`] for stress,
//! [`crate::search_ranks`] for `nccl --pattern search`) that sends progress
//! and a result through the WorkerService with its rank secret. Nothing here
//! touches a GPU: the point is the coordinator's cost, not the workers'.
//! What a node describes (GPUs, host facts, telemetry) is `crate::host`;
//! what the bench counts, `crate::counters`.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use gpuctl_core::client::Channel;
use gpuctl_core::clock::Clock;
use gpuctl_core::shutdown::Shutdown;
use gpuctl_proto::pb::{
    agent_message::Msg, agent_service_client::AgentServiceClient, coordinator_message,
    worker_service_client::WorkerServiceClient, AgentMessage, Assignment, AssignmentAck,
    RankProcess, RegisterRequest, RunningJob, StopReason, WorkerExited,
};
use gpuctl_proto::PROTOCOL_VERSION;
use tokio::sync::{mpsc, Semaphore};
use tokio_stream::wrappers::ReceiverStream;

use crate::counters::Stats;
use crate::host;
use crate::ranks::{self, RankJob};
use crate::search_ranks::{self, SearchPlay};

mod config;
mod sends;

pub use config::{FleetConfig, RankConnections, HEARTBEAT};

/// A running simulated fleet; dropping it does not stop it, `shutdown` does.
pub struct Fleet {
    pub stats: Arc<Stats>,
    pub names: Vec<String>,
}

/// Starts every agent; returns once all are registered.
pub async fn start(cfg: FleetConfig, shutdown: Shutdown) -> Result<Fleet> {
    start_with(cfg, Arc::default(), shutdown).await
}

/// As [`start`], with the slow nodes and links its `nccl --pattern search`
/// jobs find ([`crate::search_ranks`]).
pub async fn start_with(
    cfg: FleetConfig,
    search: Arc<SearchPlay>,
    shutdown: Shutdown,
) -> Result<Fleet> {
    let stats = Arc::new(Stats::default());
    let clock = Clock::system();
    let urls = gpuctl_core::leader::split_urls(&cfg.url);
    let mut channels = Vec::new();
    for i in cfg.first..cfg.first + cfg.connections.clamp(1, cfg.nodes.max(1)) {
        // One coordinator: no leader to find, nor a probe call to make.
        let channel = match urls.as_slice() {
            [one] => cfg
                .builder(i, one)
                .connect()
                .await
                .map_err(anyhow::Error::from),
            _ => gpuctl_core::leader::find_leader(&urls, |u| cfg.builder(i, u))
                .await
                .map_err(anyhow::Error::from),
        };
        channels.push(channel.with_context(|| format!("connecting to {}", cfg.url))?);
    }
    let names: Vec<String> = (cfg.first..cfg.first + cfg.nodes).map(host::name).collect();
    let dials = Arc::new(Semaphore::new(dial_room(&cfg)));
    let mut registered = tokio::task::JoinSet::new();
    for (i, name) in names.iter().enumerate() {
        let agent = Agent {
            name: name.clone(),
            index: (cfg.first + i) as u32,
            cfg: cfg.clone(),
            channel: Mutex::new(channels[i % channels.len()].clone()),
            urls: urls.clone(),
            stats: stats.clone(),
            shutdown: shutdown.clone(),
            clock: clock.clone(),
            pace: Default::default(),
            search: search.clone(),
            dials: dials.clone(),
            away: Arc::default(),
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(agent.run(tx));
        registered.spawn(rx);
    }
    while let Some(r) = registered.join_next().await {
        r?.context("an agent stopped before registering")??;
    }
    Ok(Fleet { stats, names })
}

struct Agent {
    name: String,
    index: u32,
    cfg: FleetConfig,
    /// The connection to the coordinator that leads, as last found.
    channel: Mutex<Channel>,
    urls: Vec<String>,
    stats: Arc<Stats>,
    shutdown: Shutdown,
    /// The time its messages and its ranks' carry.
    clock: Clock,
    /// How often the coordinator lets it send, as `gpuctl-agent` keeps it.
    pace: gpuctl_core::pace::Pace,
    /// What its ranks play for `nccl --pattern search` jobs.
    search: Arc<SearchPlay>,
    /// Leaders being looked for open sockets: [`dial_room`].
    dials: Arc<Semaphore>,
    /// Set from a lost session until the next one opens: its ranks' calls
    /// fail at once meanwhile ([`ranks::Clients::unless_away`]).
    away: Arc<std::sync::atomic::AtomicBool>,
}

/// How many agents may look for the leader at once: the open-files limit
/// less what the fleet holds (each agent's connection, and for a job its
/// node's or its ranks' own, one descriptor each here) and a reserve. 16,384 agents reconnecting after a
/// failover ran this process out of its 20,000 descriptors ("tcp open
/// error"), and their failed tries, not the coordinator, set the time the
/// fleet took to come back.
fn dial_room(cfg: &FleetConfig) -> usize {
    const RESERVE: usize = 1024;
    let per_node = match cfg.rank_connections {
        RankConnections::Agent => 1,
        RankConnections::Node => 2,
        RankConnections::Rank => 1 + cfg.gpus as usize,
    };
    let (soft, _) = gpuctl_core::server::open_files_limit();
    let soft = usize::try_from(soft).unwrap_or(usize::MAX);
    if soft == 0 {
        return cfg.nodes.max(1); // unknown: no bound of ours
    }
    soft.saturating_sub(cfg.nodes * per_node + RESERVE).max(64)
}

/// The ranks one agent runs now, by job.
type Running = Arc<Mutex<BTreeMap<String, RunningJob>>>;

impl Agent {
    /// Registers and keeps a session open for the fleet's life: a session
    /// that ends (the coordinator restarted, or a starved simulator missed
    /// its keepalives) is opened again, as `gpuctl-agent` does, with the
    /// jobs still running here offered for adoption. `registered` hears of
    /// the first registration only.
    async fn run(self, registered: tokio::sync::oneshot::Sender<Result<()>>) {
        // Every message goes through one outbox for the agent's life; each
        // session forwards from it, so ranks and timers outlive a session.
        let (outbox, mut outbox_rx) = mpsc::channel::<AgentMessage>(256);
        let running: Running = Arc::default();
        let me = Arc::new(self);
        let beat = tokio::spawn(me.clone().heartbeats(outbox.clone(), running.clone()));
        let tele = tokio::spawn(me.clone().telemetry(outbox.clone(), running.clone()));
        let mut cancels: HashMap<String, Shutdown> = HashMap::new();
        let mut registered = Some(registered);
        let mut failed = 0u32;
        let mut lost = false;
        let mut reached = false;
        while !me.shutdown.is_cancelled() {
            // Finding the leader opens sockets (one per coordinator URL
            // tried): only as many agents at once as this process has
            // descriptors for, where each real agent has a host's own.
            let began = std::time::Instant::now();
            let (waited, found) = if lost {
                let dial = me.dials.acquire().await;
                let waited = began.elapsed();
                me.find_leader().await;
                drop(dial);
                (waited, began.elapsed() - waited)
            } else {
                (Duration::ZERO, Duration::ZERO)
            };
            lost = true;
            let opened = me.open(&running, &mut cancels).await;
            tracing::debug!(node = %me.name, ok = opened.is_ok(), permit_ms = waited.as_millis() as u64,
                leader_ms = found.as_millis() as u64,
                open_ms = (began.elapsed() - waited - found).as_millis() as u64, "tried to reconnect");
            match opened {
                Ok((inbound, session)) => {
                    me.away.store(false, Ordering::Relaxed);
                    if let Some(r) = registered.take() {
                        let _ = r.send(Ok(()));
                    } else {
                        me.stats.reconnects.fetch_add(1, Ordering::Relaxed);
                    }
                    failed = 0;
                    let ended = me.shutdown.child_token();
                    let fwd = tokio::spawn(forward(outbox_rx, session, ended.clone()));
                    me.clone()
                        .listen(inbound, &outbox, &running, &mut cancels)
                        .await;
                    ended.cancel();
                    me.away.store(true, Ordering::Relaxed);
                    outbox_rx = match fwd.await {
                        Ok(rx) => rx,
                        Err(_) => break,
                    };
                    if me.shutdown.is_cancelled() {
                        break;
                    }
                    me.stats.sessions_lost.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    // Past `--max-registrations-per-s`: an agent's backoff,
                    // not a failed start; from then on the coordinator is
                    // known to be there, and any failure is tried again.
                    let by_rate = e
                        .downcast_ref::<tonic::Status>()
                        .is_some_and(|s| s.code() == tonic::Code::ResourceExhausted);
                    reached |= by_rate;
                    // The leader refused it: no other coordinator to look
                    // for (each look opens connections to every URL).
                    lost = !by_rate;
                    if !reached {
                        if let Some(r) = registered.take() {
                            let _ = r.send(Err(e));
                            break;
                        }
                    }
                    me.stats.out_of_descriptors(&format!("{e:#}"));
                    failed += 1;
                    tracing::debug!(node = %me.name, "reconnecting: {e:#}");
                }
            }
            // As gpuctl-agent waits: jittered, so that a fleet that lost its
            // sessions together does not come back in one burst.
            let wait = gpuctl_core::retry::reconnect::wait(failed + 1);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = me.shutdown.cancelled() => break,
            }
        }
        beat.abort();
        tele.abort();
    }

    /// Registers (offering the jobs running here; those the coordinator
    /// refuses are stopped) and opens a session, its first message a
    /// heartbeat: the inbound stream and the session's sender.
    async fn open(
        &self,
        running: &Running,
        cancels: &mut HashMap<String, Shutdown>,
    ) -> Result<(
        tonic::Streaming<gpuctl_proto::pb::CoordinatorMessage>,
        mpsc::Sender<AgentMessage>,
    )> {
        let mut client = AgentServiceClient::new(self.channel());
        let jobs: Vec<RunningJob> = running.lock().unwrap().values().cloned().collect();
        let req = RegisterRequest {
            protocol_version: PROTOCOL_VERSION,
            name: self.name.clone(),
            facts: Some(host::facts(&self.name, self.index)),
            gpus: host::gpus(self.index, self.cfg.gpus),
            running: jobs.clone(),
            ..Default::default()
        };
        // The workers' calls go over this agent's connection, to the URL it
        // registered at: the URL the coordinator advertises is not needed.
        let answer = client
            .register(req)
            .await
            .map_err(|s| {
                let what = format!("{}: Register: {}", self.name, s.message());
                // The code is kept: a refusal by rate is tried again.
                anyhow::Error::new(s).context(what)
            })?
            .into_inner();
        for id in &answer.refused {
            if let Some(stop) = cancels.remove(id) {
                stop.cancel();
            }
        }
        self.stats.registered.fetch_add(1, Ordering::Relaxed);
        self.pace.set(answer.pace.as_ref());
        let (tx, rx) = mpsc::channel::<AgentMessage>(256);
        let jobs = jobs
            .into_iter()
            .filter(|j| !answer.refused.contains(&j.job_id))
            .collect();
        let _ = tx.send(self.heartbeat(jobs)).await;
        let inbound = client
            .session(ReceiverStream::new(rx))
            .await
            .map_err(|s| anyhow::anyhow!("{}: Session: {}", self.name, s.message()))?
            .into_inner();
        Ok((inbound, tx))
    }

    fn channel(&self) -> Channel {
        self.channel.lock().unwrap().clone()
    }

    /// With several coordinators, the one that leads now (after a lost
    /// session: the old leader may be gone); kept as it was when none answers.
    async fn find_leader(&self) {
        if self.urls.len() < 2 {
            return;
        }
        match gpuctl_core::leader::find_leader(&self.urls, |u| {
            self.cfg.builder(self.index as usize, u)
        })
        .await
        {
            Ok(c) => *self.channel.lock().unwrap() = c,
            Err(e) => {
                self.stats.out_of_descriptors(&e.to_string());
                tracing::debug!(node = %self.name, "no leader yet: {e}")
            }
        }
    }

    /// A client for workers' calls; a new connection, opened on its first
    /// call and closed when its last clone goes, unless they take the agent's.
    fn worker_client(&self) -> WorkerServiceClient<Channel> {
        let agent = self.channel();
        if self.cfg.rank_connections == RankConnections::Agent {
            return WorkerServiceClient::new(agent);
        }
        let lazy = self
            .cfg
            .builder(self.index as usize, agent.url())
            .connect_lazy();
        // The URL connected at the start, so this is not expected to fail.
        WorkerServiceClient::new(lazy.unwrap_or_else(|e| {
            tracing::warn!(node = %self.name, "workers' connection: {e}; taking the agent's");
            agent
        }))
    }

    /// Answers what the coordinator sends until the session ends.
    async fn listen(
        self: Arc<Self>,
        mut inbound: tonic::Streaming<gpuctl_proto::pb::CoordinatorMessage>,
        tx: &mpsc::Sender<AgentMessage>,
        running: &Running,
        cancels: &mut HashMap<String, Shutdown>,
    ) {
        loop {
            // Stopping first: the bench ends the coordinator right after
            // the fleet, and a session cut by that is no news.
            let msg = tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => return,
                m = inbound.message() => m,
            };
            let msg = match msg {
                Ok(Some(m)) => m,
                Ok(None) | Err(_) => {
                    let why = msg.err().map_or("the coordinator ended it".into(), |s| {
                        s.message().to_string()
                    });
                    tracing::info!(node = %self.name, "session ended, opening another: {why}");
                    return;
                }
            };
            match msg.msg {
                Some(coordinator_message::Msg::Assignment(a)) => {
                    self.stats.assigned(&a.job_id);
                    let stop = self.shutdown.child_token();
                    // Jobs that ended here need no cancel any more.
                    {
                        let live = running.lock().unwrap();
                        cancels.retain(|id, _| live.contains_key(id));
                    }
                    cancels.insert(a.job_id.clone(), stop.clone());
                    self.start_ranks(&a, tx, running, stop).await;
                }
                Some(coordinator_message::Msg::Cancel(c)) => {
                    if let Some(stop) = cancels.remove(&c.job_id) {
                        stop.cancel();
                    }
                }
                Some(coordinator_message::Msg::Pace(p)) => self.pace.set(Some(&p)),
                Some(coordinator_message::Msg::FetchTrace(f)) => {
                    let piece = gpuctl_proto::pb::TraceChunk {
                        request_id: f.request_id,
                        error: "a simulated node keeps no traces".into(),
                        ..Default::default()
                    };
                    let _ = tx
                        .send(AgentMessage {
                            msg: Some(Msg::TraceChunk(piece)),
                        })
                        .await;
                }
                None => {}
            }
        }
    }

    async fn start_ranks(
        self: &Arc<Self>,
        a: &Assignment,
        tx: &mpsc::Sender<AgentMessage>,
        running: &Running,
        stop: Shutdown,
    ) {
        let ranks: Vec<u32> = a.ranks.iter().map(|r| r.rank).collect();
        let search = search_ranks::wanted(a.spec.as_ref());
        let ok = search || a.spec.as_ref().is_some_and(|s| s.workload == "stress");
        let _ = tx
            .send(AgentMessage {
                msg: Some(Msg::Ack(AssignmentAck {
                    job_id: a.job_id.clone(),
                    attempt: a.attempt,
                    ok,
                    error: if ok {
                        String::new()
                    } else {
                        "gpuctl-sim plays the stress workload and nccl --pattern search only".into()
                    },
                    checks: vec![],
                })),
            })
            .await;
        if !ok {
            return;
        }
        running.lock().unwrap().insert(
            a.job_id.clone(),
            RunningJob {
                job_id: a.job_id.clone(),
                attempt: a.attempt,
                ranks: ranks.clone(),
                processes: ranks
                    .iter()
                    .map(|&rank| RankProcess {
                        rank,
                        pid: 100_000 + rank,
                        state: "R".into(),
                        state_name: "running".into(),
                        cpu_ms: 0,
                    })
                    .collect(),
            },
        );
        let left = Arc::new(AtomicU64::new(ranks.len() as u64));
        let node_client = self.worker_client();
        for p in &a.ranks {
            self.stats.ranks_started.fetch_add(1, Ordering::Relaxed);
            let job = RankJob {
                job_id: a.job_id.clone(),
                attempt: a.attempt,
                placement: p.clone(),
                secret: a.rank_secrets.get(&p.rank).cloned().unwrap_or_default(),
                spec: a.spec.clone().unwrap_or_default(),
                interval: self.cfg.interval,
                world_size: a.world_size,
                clock: self.clock.clone(),
            };
            let first = Mutex::new(Some(match self.cfg.rank_connections {
                RankConnections::Rank => self.worker_client(),
                _ => node_client.clone(),
            }));
            let me = self.clone();
            // The first client as before; after a failed call, the agent's
            // leader as it knows it then.
            // Relayed calls fail with their agent's session; a worker with
            // connections of its own does not know its agent is away.
            let away = match self.cfg.rank_connections {
                RankConnections::Agent => self.away.clone(),
                _ => Arc::default(),
            };
            let clients = ranks::Clients::new(
                Arc::new(move || {
                    let first = first.lock().unwrap().take();
                    first.unwrap_or_else(|| me.worker_client())
                }),
                away,
            );
            let (tx, running, left, stats, stop) = (
                tx.clone(),
                running.clone(),
                left.clone(),
                self.stats.clone(),
                stop.clone(),
            );
            let (nnodes, play) = (a.nnodes, self.search.clone());
            tokio::spawn(async move {
                let outcome = if search {
                    search_ranks::run(job.clone(), nnodes, play, clients, stats.clone(), stop).await
                } else {
                    ranks::run(job.clone(), clients, stats.clone(), stop).await
                };
                let (exit_code, stopped_by) = match outcome {
                    ranks::Outcome::Done => (0, StopReason::Unspecified),
                    ranks::Outcome::Cancelled => (-1, StopReason::Cancel),
                    ranks::Outcome::Failed => (1, StopReason::Unspecified),
                    ranks::Outcome::Undelivered => (
                        gpuctl_core::retry::outage::UNDELIVERED_EXIT,
                        StopReason::Unspecified,
                    ),
                };
                let _ = tx
                    .send(AgentMessage {
                        msg: Some(Msg::WorkerExited(WorkerExited {
                            job_id: job.job_id.clone(),
                            attempt: job.attempt,
                            rank: job.placement.rank,
                            exit_code,
                            signal: if exit_code < 0 {
                                "SIGKILL".into()
                            } else {
                                String::new()
                            },
                            // As gpuctl-worker's last line says it.
                            stderr_tail: if outcome == ranks::Outcome::Undelivered {
                                "ERROR the result did not reach the coordinator".into()
                            } else {
                                String::new()
                            },
                            stopped_by: stopped_by as i32,
                        })),
                    })
                    .await;
                let mut r = running.lock().unwrap();
                if let Some(j) = r.get_mut(&job.job_id) {
                    j.ranks.retain(|&x| x != job.placement.rank);
                    j.processes.retain(|p| p.rank != job.placement.rank);
                }
                if left.fetch_sub(1, Ordering::Relaxed) == 1 {
                    r.remove(&job.job_id);
                }
            });
        }
    }
}

/// Forwards the agent's outbox into one session until `ended`, then hands
/// the outbox back for the next one. A message taken as the session ended
/// is lost, as it would be by a real agent's broken stream.
async fn forward(
    mut outbox: mpsc::Receiver<AgentMessage>,
    session: mpsc::Sender<AgentMessage>,
    ended: Shutdown,
) -> mpsc::Receiver<AgentMessage> {
    loop {
        let m = tokio::select! {
            biased;
            _ = ended.cancelled() => return outbox,
            m = outbox.recv() => m,
        };
        let Some(m) = m else { return outbox };
        tokio::select! {
            biased;
            _ = ended.cancelled() => return outbox,
            r = session.send(m) => if r.is_err() { return outbox },
        }
    }
}

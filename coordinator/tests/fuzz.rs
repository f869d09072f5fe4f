//! Random and mutated messages of every request type, sent to a live
//! coordinator over real gRPC: no panic anywhere in the process, every
//! refusal a clear error (a definite code, a short message that says
//! something), and the coordinator still registers nodes and runs jobs
//! afterwards.
//!
//! The seed is printed; `GPUCTL_FUZZ_SEED=N` replays a run, and
//! `GPUCTL_FUZZ_MESSAGES=N` sends more.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{list_nodes, spec, start};
use gpuctl_proto::pb::agent_service_client::AgentServiceClient;
use gpuctl_proto::pb::*;
use gpuctl_proto::PROTOCOL_VERSION;
use gpuctl_testkit::{host, FakeAgent};
use prost::Message;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Status};

static PANICS: AtomicUsize = AtomicUsize::new(0);

/// What the generators draw from.
struct Gen {
    rng: fastrand::Rng,
    /// Real identifiers, so that mutations also reach past the lookups.
    job: String,
    node: String,
}

impl Gen {
    fn string(&mut self) -> String {
        match self.rng.u8(0..10) {
            0 => String::new(),
            1 => self.job.clone(),
            2 => self.node.clone(),
            3 => "x".repeat(self.rng.usize(200..300_000)),
            4 => (0..self.rng.usize(1..40))
                .map(|_| char::from_u32(self.rng.u32(0..0x11_0000)).unwrap_or('\u{fffd}'))
                .collect(),
            5 => "../../etc/passwd\0\n\r\t\u{202e}".into(),
            6 => "job-".to_string() + &self.rng.u64(..).to_string(),
            7 => ["stress", "nccl", "ddp", "fsdp", "maxbatch", "preflight"][self.rng.usize(0..6)]
                .into(),
            _ => (0..self.rng.usize(1..16))
                .map(|_| self.rng.alphanumeric())
                .collect(),
        }
    }

    fn u64(&mut self) -> u64 {
        match self.rng.u8(0..6) {
            0 => 0,
            1 => u64::MAX,
            2 => u32::MAX as u64,
            3 => self.rng.u64(0..100),
            4 => self.rng.u64(..),
            _ => self.rng.u64(0..100_000),
        }
    }

    fn u32(&mut self) -> u32 {
        self.u64() as u32
    }

    fn f64(&mut self) -> f64 {
        match self.rng.u8(0..5) {
            0 => f64::NAN,
            1 => f64::INFINITY,
            2 => -1e308,
            3 => 0.0,
            _ => self.rng.f64() * 1000.0,
        }
    }

    fn bytes(&mut self) -> Vec<u8> {
        let n = match self.rng.u8(0..4) {
            0 => 0,
            1 => self.rng.usize(60_000..200_000),
            _ => self.rng.usize(1..200),
        };
        (0..n).map(|_| self.rng.u8(..)).collect()
    }

    fn map(&mut self) -> std::collections::HashMap<String, String> {
        let n = match self.rng.u8(0..5) {
            0 => self.rng.usize(200..2_000),
            _ => self.rng.usize(0..5),
        };
        (0..n)
            .map(|i| {
                if n > 100 {
                    return (format!("K{i}"), "v".into());
                }
                let k = if self.rng.bool() {
                    self.string()
                } else {
                    [
                        "size",
                        "max_bytes",
                        "duration",
                        "ops",
                        "NCCL_DEBUG",
                        "precision",
                        "pattern",
                    ][i % 7]
                        .to_string()
                };
                (k, self.string())
            })
            .collect()
    }

    fn spec(&mut self) -> JobSpec {
        JobSpec {
            workload: self.string(),
            node_count: self.u32(),
            all_nodes: self.rng.bool(),
            selectors: (0..self.rng.usize(0..4)).map(|_| self.string()).collect(),
            duration_ms: self.u64(),
            params: self.map(),
            env: self.map(),
            timeout_ms: self.u64(),
            name: self.string(),
            baseline: self.string(),
            rules: self.string(),
            exclusive: self.rng.bool(),
            gpus_per_node: self.u32(),
            hang_timeout_ms: self.u64(),
            only_nodes: (0..self.rng.usize(0..4)).map(|_| self.string()).collect(),
        }
    }

    fn suite_request(&mut self) -> SubmitSuiteRequest {
        SubmitSuiteRequest {
            level: if self.rng.bool() {
                "quick".into()
            } else {
                self.string()
            },
            suite_toml: if self.rng.u8(0..4) == 0 {
                self.string()
            } else {
                String::new()
            },
            duration_ms: self.u64(),
            all_nodes: self.rng.bool(),
            node_count: self.u32(),
            selectors: (0..self.rng.usize(0..4)).map(|_| self.string()).collect(),
            rules: self.string(),
            exclusive: self.rng.bool(),
        }
    }

    fn gpu(&mut self) -> GpuInfo {
        GpuInfo {
            index: self.u32(),
            uuid: self.string(),
            name: self.string(),
            memory_total_bytes: self.u64(),
            ..Default::default()
        }
    }

    fn register(&mut self) -> RegisterRequest {
        let gpus = match self.rng.u8(0..6) {
            0 => self.rng.usize(60..200),
            _ => self.rng.usize(0..3),
        };
        RegisterRequest {
            protocol_version: if self.rng.u8(0..4) == 0 {
                self.u32()
            } else {
                PROTOCOL_VERSION
            },
            name: self.string(),
            facts: self.rng.bool().then(|| HostFacts {
                hostname: self.string(),
                addresses: (0..self.rng.usize(0..3)).map(|_| self.string()).collect(),
                cpu_count: self.u32(),
                memory_total_bytes: self.u64(),
                cpu_ranks: self.u32(),
                cpu_model: self.string(),
                labels: self.map(),
                ..Default::default()
            }),
            gpus: (0..gpus).map(|_| self.gpu()).collect(),
            preflight: (0..self.rng.usize(0..3))
                .map(|_| PreflightCheck {
                    node: self.string(),
                    name: self.string(),
                    verdict: self.u32() as i32,
                    detail: self.string(),
                    fix: self.string(),
                })
                .collect(),
            running: (0..self.rng.usize(0..3))
                .map(|_| RunningJob {
                    job_id: self.string(),
                    attempt: self.u32(),
                    ranks: vec![self.u32()],
                    processes: vec![],
                })
                .collect(),
        }
    }

    fn progress(&mut self) -> RankProgressReport {
        RankProgressReport {
            job_id: self.string(),
            attempt: self.u32(),
            progress: self.rng.bool().then(|| RankProgress {
                rank: self.u32(),
                node: self.string(),
                phase: self.string(),
                fraction: self.f64(),
                metrics: (0..self.rng.usize(0..4))
                    .map(|_| (self.string(), self.f64()))
                    .collect(),
                message: self.string(),
                unix_ms: self.u64(),
                iterations: self.u64(),
                waiting_for: self.string(),
            }),
        }
    }

    fn result(&mut self) -> RankResult {
        let detail = match self.rng.u8(0..5) {
            0 => Some(rank_result::Detail::Stress(StressResult {
                dtype: self.string(),
                matrix_size: self.u32(),
                iterations: self.u64(),
                tflops_per_interval: (0..self.rng.usize(0..2_000)).map(|_| self.f64()).collect(),
                tflops_median: self.f64(),
                digest: self.string(),
                device_class: self.string(),
                interval_s: self.f64(),
                ..Default::default()
            })),
            1 => Some(rank_result::Detail::Collectives(CollectiveResult {
                backend: self.string(),
                world_size: self.u32(),
                rows: (0..self.rng.usize(0..50))
                    .map(|_| CollectiveRow {
                        op: self.string(),
                        bytes: self.u64(),
                        busbw_gbps: self.f64(),
                        time_us: self.f64(),
                        wrong: self.u64(),
                        ..Default::default()
                    })
                    .collect(),
                links: (0..self.rng.usize(0..5))
                    .map(|_| LinkResult {
                        round: self.u32(),
                        node_a: self.u32(),
                        node_b: self.u32(),
                        op: self.string(),
                        busbw_gbps: self.f64(),
                        ..Default::default()
                    })
                    .collect(),
                bisect_culprit: self.rng.bool().then(|| self.u32()),
                ..Default::default()
            })),
            2 => Some(rank_result::Detail::Train(TrainResult {
                model: self.string(),
                samples_per_s: self.f64(),
                step_ms_p99: self.f64(),
                scaling_efficiency: self.f64(),
                ..Default::default()
            })),
            3 => Some(rank_result::Detail::Maxbatch(MaxBatchResult {
                max_batch: self.u32(),
                points: (0..self.rng.usize(0..20))
                    .map(|_| MaxBatchPoint {
                        batch_size: self.u32(),
                        fits: self.rng.bool(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })),
            _ => None,
        };
        RankResult {
            job_id: self.string(),
            attempt: self.u32(),
            rank: self.u32(),
            node: self.string(),
            device: self.string(),
            device_name: self.string(),
            ok: self.rng.bool(),
            error: self.string(),
            elapsed_ms: self.u64(),
            detail,
            ..Default::default()
        }
    }

    fn agent_message(&mut self) -> AgentMessage {
        use agent_message::Msg;
        let msg = match self.rng.u8(0..6) {
            0 => Msg::Heartbeat(Heartbeat {
                node: self.string(),
                protocol_version: PROTOCOL_VERSION,
                unix_ms: self.u64(),
                running: vec![RunningJob {
                    job_id: self.string(),
                    attempt: self.u32(),
                    ranks: vec![self.u32()],
                    processes: vec![RankProcess {
                        rank: self.u32(),
                        pid: self.u32(),
                        state: self.string(),
                        state_name: self.string(),
                        cpu_ms: self.u64(),
                    }],
                }],
                preflight: vec![],
            }),
            1 => Msg::WorkerExited(WorkerExited {
                job_id: self.string(),
                attempt: self.u32(),
                rank: self.u32(),
                exit_code: self.u32() as i32,
                signal: self.string(),
                stderr_tail: self.string(),
                stopped_by: self.u32() as i32,
            }),
            2 => Msg::Log(WorkerLog {
                job_id: self.string(),
                attempt: self.u32(),
                rank: self.u32(),
                lines: (0..self.rng.usize(0..300)).map(|_| self.string()).collect(),
            }),
            3 => Msg::Telemetry(TelemetryBatch {
                node: self.string(),
                job_id: self.string(),
                attempt: self.u32(),
                samples: (0..self.rng.usize(0..100))
                    .map(|_| GpuSample {
                        index: self.u32(),
                        uuid: self.string(),
                        unix_ms: self.u64(),
                        util_gpu: self.f64(),
                        temperature_c: self.f64(),
                        xids: vec![self.u32()],
                        ..Default::default()
                    })
                    .collect(),
            }),
            _ => Msg::Ack(AssignmentAck {
                job_id: self.string(),
                attempt: self.u32(),
                ok: self.rng.bool(),
                error: self.string(),
                checks: vec![],
            }),
        };
        AgentMessage { msg: Some(msg) }
    }

    /// A valid message with a few bytes flipped, inserted or cut; the
    /// original when the result no longer decodes.
    fn mutate<T: Message + Default + Clone>(&mut self, m: &T) -> T {
        let mut b = m.encode_to_vec();
        for _ in 0..self.rng.usize(1..4) {
            if b.is_empty() {
                break;
            }
            let i = self.rng.usize(0..b.len());
            match self.rng.u8(0..3) {
                0 => b[i] ^= 1 << self.rng.u8(0..8),
                1 => b.insert(i, self.rng.u8(..)),
                _ => b.truncate(i),
            }
        }
        T::decode(b.as_slice()).unwrap_or_else(|_| m.clone())
    }
}

/// An answer is fine when it succeeded or refused clearly.
fn judge(what: &str, r: Result<(), Status>, refusals: &mut usize) {
    let Err(s) = r else { return };
    *refusals += 1;
    assert!(
        !matches!(s.code(), Code::Unknown | Code::Internal | Code::DataLoss),
        "{what}: an unclear refusal {:?}: {}",
        s.code(),
        s.message()
    );
    assert!(
        !s.message().trim().is_empty(),
        "{what}: refused ({:?}) without a message",
        s.code()
    );
    assert!(
        s.message().len() <= 4096,
        "{what}: a refusal of {} bytes (echoing the input?)",
        s.message().len()
    );
}

// Several threads: a handler that blocks its thread still lets the
// test's timeouts fire and say which message did it.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_thousand_random_and_mutated_messages_break_nothing() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        default_hook(info);
    }));
    let seed = std::env::var("GPUCTL_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    let total: usize = std::env::var("GPUCTL_FUZZ_MESSAGES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_200);
    eprintln!("fuzz seed {seed} (GPUCTL_FUZZ_SEED={seed} replays it), {total} messages");

    let dir = tempfile::tempdir().unwrap();
    let coord = start(dir.path(), Duration::from_secs(30)).await;
    let _node = FakeAgent::start(&coord.url, "real", host::cpu("real", 2), vec![]).await;
    // Listings of what random specs leave behind are large (as the CLI's are).
    let mut jobs = coord
        .jobs()
        .await
        .max_decoding_message_size(gpuctl_core::server::MAX_MESSAGE_BYTES);
    let mut workers = coord.workers().await;
    let mut agents = AgentServiceClient::connect(coord.url.clone())
        .await
        .unwrap();
    let running = jobs
        .submit(common::submit_request("stress", 1, 600_000))
        .await
        .unwrap()
        .into_inner();

    let mut g = Gen {
        rng: fastrand::Rng::with_seed(seed),
        job: running.id.clone(),
        node: "real".into(),
    };
    let valid_result = RankResult {
        job_id: running.id.clone(),
        attempt: running.attempt,
        rank: 0,
        node: "real".into(),
        ok: true,
        ..Default::default()
    };
    let valid_spec = spec("stress", 1).spec.unwrap();
    let valid_register = host::register_request("fz", host::cpu("fz", 1));

    let mut refusals = 0usize;
    let mut sent = 0usize;
    let short = Duration::from_secs(3);
    let started = std::time::Instant::now();
    while sent < total {
        let kind = sent % 28;
        let mutate = g.rng.u8(0..3) == 0;
        let what = format!("message {sent} (kind {kind}, seed {seed})");
        let call = async {
            match kind {
                0 => {
                    let mut m = if mutate {
                        g.mutate(&valid_register)
                    } else {
                        g.register()
                    };
                    // Past the transport's limit the server resets the stream
                    // (an h2 error, not a status): tonic's edge, not ours.
                    while m.encoded_len() > gpuctl_core::server::MAX_MESSAGE_BYTES / 2 {
                        m = g.register();
                    }
                    agents.register(m).await.map(|_| ())
                }
                1 => {
                    // A session opened with random messages, then dropped.
                    let (tx, rx) = tokio::sync::mpsc::channel(16);
                    for _ in 0..g.rng.usize(1..5) {
                        let _ = tx.try_send(g.agent_message());
                    }
                    drop(tx);
                    match tokio::time::timeout(short, agents.session(ReceiverStream::new(rx))).await
                    {
                        Ok(r) => r.map(|_| ()),
                        Err(_) => Ok(()), // still open: the stream is served
                    }
                }
                2 | 3 => {
                    let spec = if mutate {
                        g.mutate(&valid_spec)
                    } else {
                        g.spec()
                    };
                    if kind == 2 {
                        jobs.submit(SubmitRequest { spec: Some(spec) })
                            .await
                            .map(|_| ())
                    } else {
                        jobs.plan_job(PlanRequest {
                            spec: Some(spec),
                            max_ranks: g.u32(),
                        })
                        .await
                        .map(|_| ())
                    }
                }
                4 => jobs
                    .get_job(GetJobRequest {
                        job_id: g.string(),
                        max_ranks: g.u32(),
                    })
                    .await
                    .map(|_| ()),
                5 => jobs
                    .list_jobs(ListJobsRequest { limit: g.u32() })
                    .await
                    .map(|_| ()),
                6 => {
                    // Never the job the rest of the run leans on.
                    let mut id = g.string();
                    if id == running.id {
                        id.push('x');
                    }
                    jobs.cancel_job(CancelJobRequest {
                        job_id: id,
                        reason: g.string(),
                    })
                    .await
                    .map(|_| ())
                }
                7 if g.rng.bool() => jobs
                    .get_report(GetReportRequest { job_id: g.string() })
                    .await
                    .map(|_| ()),
                7 => jobs
                    .get_report_packed(GetReportRequest { job_id: g.string() })
                    .await
                    .map(|_| ()),
                8 => jobs
                    .get_logs(GetLogsRequest {
                        job_id: g.string(),
                        has_rank: g.rng.bool(),
                        rank: g.u32(),
                        tail: g.u32(),
                    })
                    .await
                    .map(|_| ()),
                9 => jobs
                    .list_nodes(ListNodesRequest {
                        brief: g.rng.bool(),
                        page_bytes: g.u32(),
                        after: g.string(),
                    })
                    .await
                    .map(|_| ()),
                10 => {
                    let mut name = g.string();
                    if name == "real" {
                        name.push('x');
                    }
                    jobs.remove_node(RemoveNodeRequest { name })
                        .await
                        .map(|_| ())
                }
                11 => jobs
                    .get_telemetry(GetTelemetryRequest { job_id: g.string() })
                    .await
                    .map(|_| ()),
                12 => jobs
                    .save_baseline(SaveBaselineRequest {
                        job_id: g.string(),
                        name: g.string(),
                        replace: g.rng.bool(),
                    })
                    .await
                    .map(|_| ()),
                13 => jobs
                    .get_baseline(GetBaselineRequest { name: g.string() })
                    .await
                    .map(|_| ()),
                14 => jobs
                    .list_baselines(ListBaselinesRequest {})
                    .await
                    .map(|_| ()),
                15 => jobs
                    .delete_baseline(GetBaselineRequest { name: g.string() })
                    .await
                    .map(|_| ()),
                16 => jobs
                    .get_fleet(GetFleetRequest {
                        since_unix_ms: g.u64(),
                        node: g.string(),
                        page_bytes: g.u32(),
                        after: g.string(),
                        brief: g.u32().is_multiple_of(2),
                        packed: g.u32().is_multiple_of(2),
                        flagged_drift: g.u32().is_multiple_of(2),
                    })
                    .await
                    .map(|_| ()),
                17 => workers
                    .rendezvous_put(RendezvousPutRequest {
                        job_id: g.string(),
                        attempt: g.u32(),
                        key: g.string(),
                        value: g.bytes(),
                    })
                    .await
                    .map(|_| ()),
                18 => {
                    let req = RendezvousGetRequest {
                        job_id: g.string(),
                        attempt: g.u32(),
                        key: g.string(),
                        timeout_ms: g.u32(),
                    };
                    match tokio::time::timeout(short, workers.rendezvous_get(req)).await {
                        Ok(r) => r.map(|_| ()),
                        Err(_) => Ok(()), // waiting, as asked
                    }
                }
                19 => workers.report_progress(g.progress()).await.map(|_| ()),
                20 => jobs.submit_suite(g.suite_request()).await.map(|_| ()),
                21 => jobs
                    .get_suite(GetSuiteRequest {
                        suite_id: g.string(),
                    })
                    .await
                    .map(|_| ()),
                22 => jobs
                    .cancel_suite(GetSuiteRequest {
                        suite_id: g.string(),
                    })
                    .await
                    .map(|_| ()),
                25 => jobs
                    .get_cert(GetCertRequest {
                        node: g.string(),
                        evidence: g.rng.bool(),
                    })
                    .await
                    .map(|_| ()),
                26 => jobs
                    .revoke_cert(RevokeCertRequest {
                        id: g.string(),
                        reason: g.string(),
                    })
                    .await
                    .map(|_| ()),
                27 => jobs.list_certs(ListCertsRequest {}).await.map(|_| ()),
                _ => {
                    let m = if mutate {
                        g.mutate(&valid_result)
                    } else {
                        g.result()
                    };
                    workers.report_result(m).await.map(|_| ())
                }
            }
        };
        let r: Result<(), Status> = tokio::time::timeout(Duration::from_secs(20), call)
            .await
            .unwrap_or_else(|_| panic!("{what}: no answer within 20 s"));
        judge(&what, r, &mut refusals);
        sent += 1;
        if sent.is_multiple_of(500) {
            eprintln!("{sent} sent, {refusals} refused, {:?}", started.elapsed());
        }
    }
    eprintln!("{sent} messages, {refusals} refused");
    assert!(
        refusals > total / 4,
        "most random input is refused: {refusals}"
    );
    assert_eq!(
        PANICS.load(Ordering::SeqCst),
        0,
        "a panic in the coordinator"
    );

    // Still serving: the real node is listed, and a fresh node runs a job.
    let nodes = list_nodes(&mut jobs).await;
    assert!(nodes.iter().any(|n| n.name == "real"), "{nodes:?}");
    // Jobs the random specs queued are cancelled (each must be cancellable).
    let all = jobs
        .list_jobs(ListJobsRequest { limit: 0 })
        .await
        .unwrap()
        .into_inner()
        .jobs;
    for j in all
        .iter()
        .filter(|j| matches!(j.state(), JobState::Pending | JobState::Running))
    {
        jobs.cancel_job(CancelJobRequest {
            job_id: j.id.clone(),
            reason: "fuzz over".into(),
        })
        .await
        .unwrap_or_else(|e| panic!("cancelling {}: {e}", j.id));
    }
    let mut after = FakeAgent::start(&coord.url, "after", host::cpu("after", 1), vec![]).await;
    let mut s = spec("stress", 1);
    s.spec.as_mut().unwrap().selectors = vec!["name=after".into()];
    let job = jobs.submit(s).await.unwrap().into_inner();
    let a = after.assignment_after_cancels().await;
    assert_eq!(a.job_id, job.id);
    coord.shutdown().await;
}

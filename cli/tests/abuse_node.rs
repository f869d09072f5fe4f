//! One node speaks only for itself (issue 46), tried as an attacker would
//! with only what one compromised node holds: a coordinator with TLS, a
//! client CA and tokens; real CPU agents `a` and `b`; and a fake agent `c`
//! built here, with c's own valid certificate and its agent's session.
//!
//! c sends a worker's exit, log lines, a failed start and telemetry for a
//! job it has no rank in; then, in a job it is part of with 64 CPU ranks,
//! results at 0.5 TFLOP/s with another stress digest (once enough to
//! outvote a and b on the median and the digest majority), a result
//! that claims a B200 at 999 TFLOP/s, and telemetry of a GPU it does not
//! have. Every attempt is refused or has no
//! effect on a's and b's verdicts, logs and report; only c's ranks fail;
//! `/metrics` counts each refusal and shows no 999.

mod common;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{bin, free_port, stderr, Procs};
use gpuctl_proto::pb::agent_message::Msg as Up;
use gpuctl_proto::pb::worker_service_client::WorkerServiceClient;
use gpuctl_proto::pb::{
    rank_result, AssignmentAck, RankResult, StressResult, WorkerExited, WorkerLog,
};
use gpuctl_testkit::{agent::start_on, gpu, host};
use serde_json::Value;

const READ: &str = "read-token-0123456789abcdef";
const OPERATE: &str = "operate-token-0123456789abcdef";

fn gpuctl(url: &str, certs: &Path, token: &str, args: &[&str]) -> Output {
    Command::new(bin("gpuctl"))
        .args(args)
        .env("GPUCTL_COORDINATOR", url)
        .env("GPUCTL_TLS_CA", certs.join("ca.pem"))
        .env("GPUCTL_TOKEN", token)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run gpuctl")
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("no JSON on stdout: {}", stderr(out)))
}

fn agent(dir: &Path, url: &str, name: &str) -> Child {
    let work = dir.join(format!("work-{name}"));
    std::fs::create_dir_all(&work).unwrap();
    let log = std::fs::File::create(dir.join(format!("agent-{name}.log"))).unwrap();
    let certs = dir.join("certs");
    Command::new(bin("gpuctl-agent"))
        .args(["--coordinator", url, "--name", name, "--cpu-ranks", "1"])
        .args(["--label", "honest=yes"])
        .arg("--work-dir")
        .arg(&work)
        .args(["--heartbeat-interval", "500ms", "--metrics-listen", "off"])
        .arg("--tls-ca")
        .arg(certs.join("ca.pem"))
        .arg("--tls-cert")
        .arg(certs.join(format!("node-{name}.pem")))
        .arg("--tls-key")
        .arg(certs.join(format!("node-{name}.key")))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start gpuctl-agent")
}

fn state(url: &str, certs: &Path, id: &str) -> (String, Value) {
    // `status` exits 1 for a failed job and still prints it.
    let j = json(&gpuctl(url, certs, READ, &["status", id, "-o", "json"]));
    let s = j
        .get("state")
        .or_else(|| j.pointer("/job/state"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    (s, j)
}

fn wait_until(url: &str, certs: &Path, id: &str, done: &[&str], limit: Duration) -> String {
    let start = Instant::now();
    loop {
        let (s, j) = state(url, certs, id);
        if done.contains(&s.as_str()) {
            return s;
        }
        assert!(
            start.elapsed() < limit,
            "job {id} is {s} after {limit:?}: {j}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The first object under `v` holding `key` and a digest (a stress result).
fn find<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    match v {
        Value::Object(m) if m.contains_key(key) && m.contains_key("digest") => Some(v),
        Value::Object(m) => m.values().find_map(|x| find(x, key)),
        Value::Array(a) => a.iter().find_map(|x| find(x, key)),
        _ => None,
    }
}

/// Each node's verdict, and its reason with its ranks', in a report.
fn node_verdicts(report: &Value) -> Vec<(String, String, String)> {
    report["nodes"]
        .as_array()
        .unwrap_or_else(|| panic!("no nodes in {report}"))
        .iter()
        .map(|n| {
            let text = |k: &str| n[k].as_str().unwrap_or_default().to_string();
            // The node's reason and every rank's.
            let ranks = n["ranks"].as_array().cloned().unwrap_or_default();
            let why: Vec<String> = std::iter::once(text("reason"))
                .chain(ranks.iter().map(|r| r["reason"].to_string()))
                .collect();
            (text("name"), text("verdict"), why.join("; "))
        })
        .collect()
}

#[test]
fn a_node_with_its_own_certificate_cannot_decide_other_nodes_verdicts() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let certs = d.join("certs");
    let out = Command::new(bin("gpuctl"))
        .args(["certs", "init", "--nodes", "a,b,c", "--dir"])
        .arg(&certs)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::write(
        d.join("tokens"),
        format!("read {READ} reader\noperate {OPERATE} ops\n"),
    )
    .unwrap();
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut coord = Command::new(bin("gpuctl-coordinator"))
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", &metrics])
        .arg("--data-dir")
        .arg(d.join("data"))
        .arg("--tls-cert")
        .arg(certs.join("coordinator.pem"))
        .arg("--tls-key")
        .arg(certs.join("coordinator.key"))
        .arg("--client-ca")
        .arg(certs.join("ca.pem"))
        .arg("--tokens")
        .arg(d.join("tokens"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(d.join("coordinator.log")).unwrap())
        .spawn()
        .unwrap();
    let url = common::listening_url(&mut coord);
    let mut procs = Procs(vec![coord]);
    procs.0.push(agent(d, &url, "a"));
    procs.0.push(agent(d, &url, "b"));

    // c: a fake agent with c's own certificate, offering 64 CPU ranks.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let read = |f: &str| std::fs::read(certs.join(f)).unwrap();
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(read("ca.pem")))
        .identity(tonic::transport::Identity::from_pem(
            read("node-c.pem"),
            read("node-c.key"),
        ));
    let channel = || async {
        tonic::transport::Endpoint::from_shared(url.clone())
            .unwrap()
            .tls_config(tls.clone())
            .unwrap()
            .connect()
            .await
            .expect("connect with c's certificate")
    };
    let mut c = rt.block_on(async {
        start_on(
            channel().await,
            host::register_request("c", host::cpu("c", 64)),
        )
        .await
    });
    let start = Instant::now();
    loop {
        let v = json(&gpuctl(&url, &certs, READ, &["nodes", "-o", "json"]));
        let ready = common::nodes_array(&v)
            .iter()
            .filter(|n| n["state"] == "ready")
            .count();
        if ready == 3 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "not ready: {v}");
        std::thread::sleep(Duration::from_millis(200));
    }

    // 1. A job on a and b only; c speaks for its ranks.
    let job = json(&gpuctl(
        &url,
        &certs,
        OPERATE,
        &[
            "submit",
            "stress",
            "--duration",
            "8s",
            "--nodes",
            "2",
            "--selector",
            "honest=yes",
            "-o",
            "json",
        ],
    ));
    let one = common::job_id(&job).unwrap_or_else(|| panic!("no id in {job}"));
    wait_until(&url, &certs, &one, &["running"], Duration::from_secs(60));
    rt.block_on(async {
        c.send(Up::WorkerExited(WorkerExited {
            job_id: one.clone(),
            attempt: 1,
            rank: 0,
            signal: "SIGSEGV".into(),
            ..Default::default()
        }))
        .await;
        c.send(Up::Log(WorkerLog {
            job_id: one.clone(),
            attempt: 1,
            rank: 0,
            lines: vec!["FORGED-BY-C".into()],
        }))
        .await;
        c.send(Up::Ack(AssignmentAck {
            job_id: one.clone(),
            attempt: 1,
            ok: false,
            error: "FORGED-START".into(),
            ..Default::default()
        }))
        .await;
        c.telemetry(gpu::batch("c", &one, vec![gpu::healthy(0)]))
            .await;
    });
    let ended = wait_until(
        &url,
        &certs,
        &one,
        &["succeeded", "failed", "cancelled"],
        Duration::from_secs(120),
    );
    let report = json(&gpuctl(&url, &certs, READ, &["report", &one, "-o", "json"]));
    assert_eq!(ended, "succeeded", "{report}");
    let text = report.to_string();
    for forged in ["SIGSEGV", "FORGED-START", "\"c\""] {
        assert!(!text.contains(forged), "{forged} in {text}");
    }
    for rank in ["0", "1"] {
        let logs = gpuctl(&url, &certs, READ, &["logs", &one, "--rank", rank]);
        let logs = String::from_utf8_lossy(&logs.stdout).to_string();
        assert!(!logs.contains("FORGED-BY-C"), "rank {rank}'s log: {logs}");
    }
    // What an honest CPU rank reports, for c to pass its own off as.
    let honest: StressResult = {
        let s = find(&report, "device_class").expect("a stress result in the report");
        StressResult {
            dtype: s["dtype"].as_str().unwrap_or_else(|| panic!("{s}")).into(),
            matrix_size: s["matrix_size"].as_u64().unwrap() as u32,
            device_class: s["device_class"].as_str().unwrap().into(),
            checks: s["checks"].as_u64().unwrap(),
            interval_s: s["interval_s"].as_f64().unwrap_or(1.0),
            ..Default::default()
        }
    };

    // 2. A job on all three: c's 64 ranks say 0.5 TFLOP/s with another digest.
    let job = json(&gpuctl(
        &url,
        &certs,
        OPERATE,
        &[
            "submit",
            "stress",
            "--duration",
            "6s",
            "--nodes",
            "all",
            "-o",
            "json",
        ],
    ));
    let two = common::job_id(&job).unwrap_or_else(|| panic!("no id in {job}"));
    let forged_device = rt.block_on(async {
        let a = c.assignment_after_cancels().await;
        c.ack(&a).await;
        // c registered CPU ranks and no GPU: a GPU's telemetry is refused.
        c.telemetry(gpu::batch("c", &two, vec![gpu::healthy(7)]))
            .await;
        let mut w = WorkerServiceClient::new(channel().await);
        let result = |rank: u32, tflops: f64| RankResult {
            job_id: two.clone(),
            attempt: a.attempt,
            rank,
            ok: true,
            detail: Some(rank_result::Detail::Stress(StressResult {
                tflops_median: tflops,
                tflops_min: tflops,
                tflops_max: tflops,
                tflops_per_interval: vec![tflops; 6],
                digest: "f".repeat(64),
                ..honest.clone()
            })),
            ..Default::default()
        };
        let mine: Vec<u32> = a.rank_secrets.keys().copied().collect();
        assert_eq!(mine.len(), 64, "c's ranks");
        let send = |r: RankResult| {
            let mut req = tonic::Request::new(r.clone());
            let secret = a.rank_secrets[&r.rank].parse().unwrap();
            req.metadata_mut()
                .insert(gpuctl_core::auth::RANK_SECRET, secret);
            req
        };
        // A CPU rank claiming a B200 at 999 TFLOP/s.
        let mut b200 = result(mine[0], 999.0);
        b200.device = "cuda:0".into();
        b200.device_name = "NVIDIA B200".into();
        let refused = w.report_result(send(b200)).await.unwrap().into_inner();
        for r in &mine {
            let ack = w.report_result(send(result(*r, 0.5))).await.unwrap();
            assert!(ack.into_inner().ok, "c's own result is taken");
        }
        refused
    });
    assert!(!forged_device.ok, "{forged_device:?}");
    assert!(
        forged_device.message.contains("its result says cuda:0"),
        "{}",
        forged_device.message
    );
    wait_until(
        &url,
        &certs,
        &two,
        &["succeeded", "failed"],
        Duration::from_secs(120),
    );
    let report = json(&gpuctl(&url, &certs, READ, &["report", &two, "-o", "json"]));
    assert_eq!(
        report["telemetry"],
        serde_json::json!([]),
        "c's GPU 7 is no GPU of c's"
    );
    for (node, verdict, reason) in node_verdicts(&report) {
        if node == "c" {
            assert_eq!(verdict, "fail", "c's own figures fail c: {reason}");
            assert!(reason.contains("silent data corruption"), "{reason}");
        } else {
            assert_ne!(verdict, "fail", "node {node} failed by c: {reason}");
        }
    }

    // /metrics: every refusal counted; no 999 anywhere.
    let scrape = rt
        .block_on(gpuctl_core::metrics_http::get(
            &metrics,
            "/metrics",
            Duration::from_secs(10),
        ))
        .expect("scrape /metrics");
    let body = scrape.body;
    assert!(!body.contains(" 999"), "{body}");
    for kind in ["worker_exit", "log", "ack", "telemetry", "result"] {
        let series = format!("gpuctl_refused_messages_total{{kind=\"{kind}\"}}");
        let n = gpuctl_core::metrics_http::value(&body, &series);
        assert!(n.is_some_and(|n| n >= 1.0), "{series} = {n:?} in {body}");
    }
    // Telemetry twice: of a job c is not in, of a GPU c does not have.
    let series = "gpuctl_refused_messages_total{kind=\"telemetry\"}";
    let n = gpuctl_core::metrics_http::value(&body, series);
    assert!(n.is_some_and(|n| n >= 2.0), "{series} = {n:?} in {body}");
    drop(c);
}

//! Mutual TLS, tokens and worker secrets with real processes: `gpuctl certs
//! init`; a coordinator with TLS, a client CA and a tokens file; an agent
//! with its own certificate runs a job end to end (its workers reach the
//! coordinator over TLS with their rank's secret); an agent without a
//! certificate and one with another node's are refused saying why; a
//! result posted from outside the job's workers is refused and nothing of it
//! is kept; the CLI without a token, and with a read token trying to submit,
//! is refused.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{bin, stderr, Procs};
use gpuctl_proto::pb::worker_service_client::WorkerServiceClient;
use gpuctl_proto::pb::{RankResult, RendezvousPutRequest};
use serde_json::Value;

const READ: &str = "read-token-0123456789abcdef";
const OPERATE: &str = "operate-token-0123456789abcdef";

fn gpuctl(url: &str, certs: &Path, token: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(bin("gpuctl"));
    cmd.args(args)
        .env("GPUCTL_COORDINATOR", url)
        .env("GPUCTL_TLS_CA", certs.join("ca.pem"))
        .env_remove("GPUCTL_TOKEN")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    if let Some(t) = token {
        cmd.env("GPUCTL_TOKEN", t);
    }
    cmd.output().expect("run gpuctl")
}

fn json(out: &Output) -> Value {
    assert!(out.status.success(), "{}", stderr(out));
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

fn agent(dir: &Path, url: &str, name: &str, cert: Option<&str>) -> Child {
    let work = dir.join(format!("work-{name}"));
    std::fs::create_dir_all(&work).unwrap();
    let log = std::fs::File::create(dir.join(format!("agent-{name}.log"))).unwrap();
    let certs = dir.join("certs");
    let mut cmd = Command::new(bin("gpuctl-agent"));
    cmd.args(["--coordinator", url, "--name", name, "--cpu-ranks", "2"])
        .arg("--work-dir")
        .arg(&work)
        .args(["--heartbeat-interval", "500ms", "--metrics-listen", "off"])
        .arg("--tls-ca")
        .arg(certs.join("ca.pem"))
        .env_remove("GPUCTL_TLS_CERT")
        .env_remove("GPUCTL_TLS_KEY")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log);
    if let Some(stem) = cert {
        cmd.arg("--tls-cert")
            .arg(certs.join(format!("{stem}.pem")))
            .arg("--tls-key")
            .arg(certs.join(format!("{stem}.key")));
    }
    cmd.spawn().expect("start gpuctl-agent")
}

/// Waits until `file` contains `text`.
fn wait_log(file: &Path, text: &str, limit: Duration) -> String {
    let start = Instant::now();
    loop {
        let log = std::fs::read_to_string(file).unwrap_or_default();
        if log.contains(text) {
            return log;
        }
        assert!(
            start.elapsed() < limit,
            "{} has no `{text}` after {limit:?}:\n{log}",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn tls_certificates_tokens_and_worker_secrets_guard_the_coordinator() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let certs = d.join("certs");

    // certs init: a CA, the coordinator, one certificate per node, the CLI's.
    let out = Command::new(bin("gpuctl"))
        .args(["certs", "init", "--nodes", "a,b", "--dir"])
        .arg(&certs)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    for f in [
        "ca.pem",
        "ca.key",
        "coordinator.pem",
        "coordinator.key",
        "node-a.pem",
        "node-a.key",
        "node-b.pem",
        "node-b.key",
        "cli.pem",
        "cli.key",
    ] {
        let meta = std::fs::metadata(certs.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        if f.ends_with(".key") {
            assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{f}");
        }
    }

    // The coordinator: TLS, agents' client CA, tokens.
    std::fs::write(
        d.join("tokens"),
        format!("# role token name\nread {READ} reader\noperate {OPERATE} ops\n"),
    )
    .unwrap();
    let log = std::fs::File::create(d.join("coordinator.log")).unwrap();
    let mut coord = Command::new(bin("gpuctl-coordinator"))
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "off"])
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
        .stderr(log)
        .spawn()
        .unwrap();
    let url = common::listening_url(&mut coord);
    let mut procs = Procs(vec![coord]);
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");

    // The CLI without a token, then with a bad one: refused, saying why.
    let out = gpuctl(&url, &certs, None, &["nodes"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("set GPUCTL_TOKEN"),
        "{}",
        stderr(&out)
    );
    let out = gpuctl(&url, &certs, Some("not-a-token-of-this-one"), &["nodes"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("not one this coordinator knows"));

    // An agent with its own certificate registers.
    procs.0.push(agent(d, &url, "a", Some("node-a")));
    let start = Instant::now();
    loop {
        let v = json(&gpuctl(&url, &certs, Some(READ), &["nodes", "-o", "json"]));
        let ready = common::nodes_array(&v)
            .iter()
            .any(|n| n["name"] == "a" && n["state"] == "ready");
        if ready {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "a not ready: {v}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // No certificate, another node's certificate, and the operator's
    // certificate (named, but not made for a node): refused, saying why.
    procs.0.push(agent(d, &url, "c", None));
    procs.0.push(agent(d, &url, "b", Some("node-a")));
    procs.0.push(agent(d, &url, "gpuctl-operator", Some("cli")));
    wait_log(
        &d.join("agent-gpuctl-operator.log"),
        "that is not a node's",
        Duration::from_secs(30),
    );
    wait_log(
        &d.join("agent-c.log"),
        "presented no client certificate",
        Duration::from_secs(30),
    );
    wait_log(
        &d.join("agent-b.log"),
        "presented the certificate of `a`",
        Duration::from_secs(30),
    );
    let v = json(&gpuctl(&url, &certs, Some(READ), &["nodes", "-o", "json"]));
    let nodes = common::nodes_array(&v);
    let names: Vec<&str> = nodes.iter().map(|n| n["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["a"], "{v}");

    // A read token cannot submit; the operate token can.
    let submit = [
        "submit",
        "stress",
        "--duration",
        "6s",
        "--nodes",
        "1",
        "-o",
        "json",
    ];
    let out = gpuctl(&url, &certs, Some(READ), &submit);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("`operate` role"), "{}", stderr(&out));
    let jobs = json(&gpuctl(&url, &certs, Some(READ), &["jobs", "-o", "json"]));
    let listed = jobs.as_array().or_else(|| jobs["jobs"].as_array());
    assert_eq!(listed.map(Vec::len), Some(0), "nothing stored: {jobs}");
    let job = json(&gpuctl(&url, &certs, Some(OPERATE), &submit));
    let id = common::job_id(&job).unwrap_or_else(|| panic!("no job id in {job}"));
    // Revoking an acceptance certificate is an operator's change too.
    let revoke = ["cert", "revoke", "cert-acc-000001-a", "--reason", "test"];
    let out = gpuctl(&url, &certs, Some(READ), &revoke);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("`operate` role"), "{}", stderr(&out));
    let listed = gpuctl(&url, &certs, Some(READ), &["cert", "revoked", "-o", "json"]);
    assert_eq!(
        String::from_utf8_lossy(&listed.stdout).trim(),
        "[]",
        "{}",
        stderr(&listed)
    );

    // A result for rank 0 from outside its worker: refused, nothing kept.
    let rt = tokio::runtime::Runtime::new().unwrap();
    gpuctl_core::client::set_tls(gpuctl_core::client::TlsFiles {
        ca: Some(certs.join("ca.pem")),
        ..Default::default()
    });
    let forged = RankResult {
        job_id: id.clone(),
        attempt: 1,
        rank: 0,
        node: "a".into(),
        ok: false,
        error: "forged".into(),
        ..Default::default()
    };
    for secret in [None, Some("r1-00"), Some("r0-0123")] {
        let status = rt.block_on(async {
            let channel = gpuctl_core::client::builder(&url);
            let channel = match secret {
                Some(s) => channel.header(gpuctl_core::auth::RANK_SECRET, s),
                None => channel,
            };
            let mut w = WorkerServiceClient::new(channel.connect().await.unwrap());
            w.report_result(forged.clone()).await.unwrap_err()
        });
        assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
        assert!(
            status.message().contains("not from rank 0's worker"),
            "{}",
            status.message()
        );
    }

    // Nor may anyone outside the job write rank 0's rendezvous address.
    let status = rt.block_on(async {
        let channel = gpuctl_core::client::builder(&url).connect().await.unwrap();
        let mut w = WorkerServiceClient::new(channel);
        w.rendezvous_put(RendezvousPutRequest {
            job_id: id.clone(),
            attempt: 1,
            key: "tcp/addr/0".into(),
            value: b"10.6.6.6:1".to_vec(),
        })
        .await
        .unwrap_err()
    });
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains("not from rank 0's worker"),
        "{}",
        status.message()
    );

    // The job runs end to end: workers reach the coordinator over TLS with
    // their secrets; the forged result is nowhere.
    let start = Instant::now();
    let state = loop {
        // `status` exits 1 for a failed job and still prints it.
        let out = gpuctl(&url, &certs, Some(READ), &["status", &id, "-o", "json"]);
        let j: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|_| panic!("status: {}", stderr(&out)));
        let state = j
            .get("state")
            .or_else(|| j.pointer("/job/state"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if !["pending", "running"].contains(&state.as_str()) {
            break j;
        }
        assert!(start.elapsed() < Duration::from_secs(120), "{j}");
        std::thread::sleep(Duration::from_millis(500));
    };
    let ended = state
        .get("state")
        .or_else(|| state.pointer("/job/state"))
        .cloned();
    assert_eq!(ended, Some(Value::from("succeeded")), "{state}");
    let out = gpuctl(&url, &certs, Some(READ), &["report", &id, "-o", "json"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{}\n{text}", stderr(&out));
    assert!(!text.contains("forged"), "{text}");
    let out = gpuctl(&url, &certs, Some(READ), &["jobs"]);
    assert!(out.status.success(), "{}", stderr(&out));
    drop(procs);
}

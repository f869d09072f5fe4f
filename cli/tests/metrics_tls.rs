//! `/metrics` behind the same TLS as the gRPC port (`--metrics-tls`), with
//! real processes: `gpuctl certs init`, a coordinator with TLS and a client
//! CA, an agent with its node certificate. Each endpoint answers a scraper
//! that presents a certificate the CA signed, and nobody else: not plain
//! HTTP, not TLS without a client certificate.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{bin, free_port, stderr, Procs};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// A rustls client trusting the gpuctl CA, with the CLI's certificate or none.
fn client(certs: &Path, with_cert: bool) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(certs.join("ca.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let b = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    Arc::new(if with_cert {
        let chain: Vec<_> = CertificateDer::pem_file_iter(certs.join("cli.pem"))
            .unwrap()
            .map(|c| c.unwrap())
            .collect();
        let key = PrivateKeyDer::from_pem_file(certs.join("cli.key")).unwrap();
        b.with_client_auth_cert(chain, key).unwrap()
    } else {
        b.with_no_client_auth()
    })
}

const GET: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

/// `GET /metrics` over TLS: the whole answer, or why there was none.
fn get_tls(port: u16, name: &str, config: Arc<rustls::ClientConfig>) -> Result<String, String> {
    let server = ServerName::try_from(name.to_string()).unwrap();
    let conn = rustls::ClientConnection::new(config, server).map_err(|e| e.to_string())?;
    let tcp = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    tls.write_all(GET).map_err(|e| e.to_string())?;
    let mut out = String::new();
    match tls.read_to_string(&mut out) {
        Ok(_) => Ok(out),
        Err(e) if !out.is_empty() && e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(out),
        Err(e) => Err(e.to_string()),
    }
}

/// `GET /metrics` in plain HTTP: whatever came back.
fn get_plain(port: u16) -> String {
    let Ok(mut tcp) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = tcp.write_all(GET);
    let mut out = Vec::new();
    let _ = tcp.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Waits until an authorised scrape answers 200, and returns it.
fn scrape(port: u16, name: &str, certs: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match get_tls(port, name, client(certs, true)) {
            Ok(a) if a.starts_with("HTTP/1.1 200") => return a,
            other if Instant::now() > deadline => {
                panic!("no metrics over TLS on port {port} ({name}): {other:?}")
            }
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

#[test]
fn metrics_answer_only_scrapers_with_a_certificate_of_the_ca() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let certs = d.join("certs");
    let out = Command::new(bin("gpuctl"))
        .args(["certs", "init", "--nodes", "a", "--dir"])
        .arg(&certs)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));

    let (coord_metrics, agent_metrics) = (free_port(), free_port());
    let log = std::fs::File::create(d.join("coordinator.log")).unwrap();
    let mut coord = Command::new(bin("gpuctl-coordinator"))
        .args(["--listen", "127.0.0.1:0", "--metrics-tls"])
        .arg("--metrics-listen")
        .arg(format!("127.0.0.1:{coord_metrics}"))
        .arg("--data-dir")
        .arg(d.join("data"))
        .arg("--tls-cert")
        .arg(certs.join("coordinator.pem"))
        .arg("--tls-key")
        .arg(certs.join("coordinator.key"))
        .arg("--client-ca")
        .arg(certs.join("ca.pem"))
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let url = common::listening_url(&mut coord);
    let mut procs = Procs(vec![coord]);
    let alog = std::fs::File::create(d.join("agent.log")).unwrap();
    let agent = Command::new(bin("gpuctl-agent"))
        .args([
            "--coordinator",
            &url,
            "--name",
            "a",
            "--no-gpu",
            "--cpu-ranks",
            "1",
        ])
        .arg("--metrics-listen")
        .arg(format!("127.0.0.1:{agent_metrics}"))
        .arg("--metrics-tls")
        .arg("--work-dir")
        .arg(d.join("agent"))
        .arg("--tls-ca")
        .arg(certs.join("ca.pem"))
        .arg("--tls-cert")
        .arg(certs.join("node-a.pem"))
        .arg("--tls-key")
        .arg(certs.join("node-a.key"))
        .stderr(alog)
        .spawn()
        .unwrap();
    procs.0.push(agent);

    // The coordinator's certificate names localhost; the agent's, its node.
    for (port, name, family) in [
        (coord_metrics, "localhost", "gpuctl_nodes"),
        (agent_metrics, "a", "gpuctl_agent"),
    ] {
        let answer = scrape(port, name, &certs);
        eprintln!("{name}: {} bytes over TLS", answer.len());
        assert!(answer.contains(family), "{name}: {answer}");
        let plain = get_plain(port);
        assert!(
            !plain.contains("HTTP/1.1 200") && !plain.contains(family),
            "{name}: plain HTTP was answered: {plain}"
        );
        let anonymous = get_tls(port, name, client(&certs, false));
        assert!(
            anonymous
                .as_ref()
                .map_or(true, |a| !a.contains("HTTP/1.1 200")),
            "{name}: TLS without a client certificate was answered: {anonymous:?}"
        );
    }
    // A --metrics-tls without a certificate is refused at the start, saying why.
    let out = Command::new(bin("gpuctl-coordinator"))
        .args(["--listen", "127.0.0.1:0", "--metrics-tls"])
        .arg("--data-dir")
        .arg(d.join("data2"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--tls-cert"), "{}", stderr(&out));
}

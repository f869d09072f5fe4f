//! Floods that once kept the operator out (issue 46): connections that send
//! a byte or a few and stall, partial `GET /metrics` requests, TLS
//! handshakes left half done (or done, then nothing), agent sessions that
//! never speak. Each comes from a few loopback addresses (127.0.0.2 ...) at
//! an in-process coordinator with small caps. Every flood connection must be
//! closed within its deadline (or at once, past its address's cap), and
//! `ListNodes` on a fresh connection from 127.0.0.1, as the CLI makes it,
//! must answer within a second while the flood lasts.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use gpuctl_coordinator::config::MetricsListen;
use gpuctl_coordinator::Config;
use gpuctl_proto::pb::agent_service_client::AgentServiceClient;
use gpuctl_proto::pb::job_service_client::JobServiceClient;
use gpuctl_proto::pb::{AgentMessage, ListNodesRequest, NodeState};
use gpuctl_testkit::agent::heartbeat;
use gpuctl_testkit::FakeAgent;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinHandle;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
use tonic::Code;

/// The addresses the floods come from; the operator is 127.0.0.1.
const FLOODERS: [[u8; 4]; 3] = [[127, 0, 0, 2], [127, 0, 0, 3], [127, 0, 0, 4]];
/// `--handshake-timeout` of the gRPC floods, short so the tests are quick.
const OPENING: Duration = Duration::from_secs(2);
/// What a closed connection may take past its deadline on a busy CI box.
const MARGIN: Duration = Duration::from_secs(3);
/// The gRPC caps of the tests: three flooders at the per-address cap hold
/// more than all but the reserve (100 / 8 = 12 slots).
const PER_PEER: u32 = 40;
const TOTAL: u32 = 100;
/// The `/metrics` listener's own caps (gpuctl_core::metrics_tls::LIMITS).
const METRICS_PER_PEER: usize = 16;
const METRICS_OPENING: Duration = Duration::from_secs(10);

fn config(dir: &Path) -> Config {
    let mut cfg = Config::for_dir(dir);
    cfg.max_connections_per_peer = PER_PEER;
    cfg.max_connections = Some(TOTAL);
    cfg.handshake_timeout = OPENING;
    cfg
}

/// A TCP connection to `to` from `ip`.
async fn connect_from(ip: [u8; 4], to: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(SocketAddr::from((ip, 0))).unwrap();
    s.connect(to)
        .await
        .unwrap_or_else(|e| panic!("connecting {to} from {ip:?}: {e}"))
}

/// How one flood connection ended.
#[derive(Debug)]
struct Closed {
    /// Which of [`FLOODERS`].
    from: usize,
    /// How long after its connect the coordinator closed it; `None`: still
    /// open at the watch's end.
    after: Option<Duration>,
}

/// What flood connection `i` sends: at once, then a byte every 150 ms.
type Sends = fn(usize) -> (&'static [u8], &'static [u8]);

/// `each` connections from every flooder in turn, each sending what `sends`
/// says and holding on; each watched for `watch`.
async fn flood(
    to: SocketAddr,
    each: usize,
    sends: Sends,
    watch: Duration,
) -> Vec<JoinHandle<Closed>> {
    let mut watched = Vec::new();
    for (from, ip) in FLOODERS.iter().enumerate() {
        for i in 0..each {
            let stream = connect_from(*ip, to).await;
            let (first, dribble) = sends(i);
            watched.push(tokio::spawn(held(stream, from, first, dribble, watch)));
        }
    }
    watched
}

async fn held(
    stream: TcpStream,
    from: usize,
    first: &'static [u8],
    dribble: &'static [u8],
    watch: Duration,
) -> Closed {
    let t0 = Instant::now();
    let (mut rd, mut wr) = stream.into_split();
    let send = async move {
        let _ = wr.write_all(first).await;
        for b in dribble {
            tokio::time::sleep(Duration::from_millis(150)).await;
            if wr.write_all(std::slice::from_ref(b)).await.is_err() {
                break;
            }
        }
        // Holds the write half open: a FIN would end it from this side.
        std::future::pending::<()>().await;
        drop(wr);
    };
    let closed = async {
        let mut buf = [0u8; 4096];
        while let Ok(n) = rd.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    };
    let ended = tokio::time::timeout(watch, async {
        tokio::select! {
            _ = closed => {}
            _ = send => {}
        }
    })
    .await;
    Closed {
        from,
        after: ended.ok().map(|_| t0.elapsed()),
    }
}

/// Connections each flooder held past the first half of `deadline` (the
/// rest were closed at once); fails for any still open at the watch's end.
async fn held_per_flooder(watched: Vec<JoinHandle<Closed>>, deadline: Duration) -> [usize; 3] {
    let mut held = [0; 3];
    for w in watched {
        let c = w.await.unwrap();
        let after = c.after.unwrap_or_else(|| {
            panic!(
                "a connection from {:?} is still open {:?} after its connect: the deadline is {deadline:?}",
                FLOODERS[c.from],
                deadline + MARGIN
            )
        });
        if after >= deadline / 2 {
            held[c.from] += 1;
        }
    }
    held
}

/// `ListNodes` on a fresh connection from 127.0.0.1, as the CLI calls it;
/// fails unless it answers within a second.
async fn lists_nodes_within_a_second(url: &str, ca: Option<&str>, when: &str) {
    let t0 = Instant::now();
    let call = async {
        let mut ep = Endpoint::from_shared(url.to_string())
            .unwrap()
            .connect_timeout(Duration::from_secs(1))
            .timeout(Duration::from_secs(1));
        if let Some(ca) = ca {
            let tls = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca))
                .domain_name("localhost");
            ep = ep.tls_config(tls).unwrap();
        }
        let ch = ep.connect().await.map_err(|e| format!("{e:?}"))?;
        JobServiceClient::new(ch)
            .list_nodes(ListNodesRequest::default())
            .await
            .map_err(|s| s.to_string())
    };
    let answer = tokio::time::timeout(Duration::from_secs(3), call).await;
    let took = t0.elapsed();
    match answer {
        Ok(Ok(_)) => assert!(
            took < Duration::from_secs(1),
            "ListNodes {when} took {took:?}"
        ),
        Ok(Err(e)) => panic!("ListNodes {when} failed after {took:?}: {e}"),
        Err(_) => panic!("ListNodes {when}: no answer in 3 s"),
    }
}

fn addr_of(url: &str) -> SocketAddr {
    url.rsplit("://").next().unwrap().parse().unwrap()
}

/// One byte, then a few more of the HTTP/2 preface, never all 24: a
/// deadline that waited for a first byte, or reset on every byte, kept them.
fn preface_dribble(_: usize) -> (&'static [u8], &'static [u8]) {
    (b"P", b"RI * HTTP/2.0\r\n\r\nSM\r\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_dribble_bytes_are_closed_and_the_cli_gets_in() {
    let dir = tempfile::tempdir().unwrap();
    let coord = common::start_cfg(config(dir.path())).await;
    coord.jobs().await; // up
    let watched = flood(addr_of(&coord.url), 50, preface_dribble, OPENING + MARGIN).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    lists_nodes_within_a_second(&coord.url, None, "during the flood").await;

    let held = held_per_flooder(watched, OPENING).await;
    for (n, ip) in held.iter().zip(FLOODERS) {
        assert!(*n <= PER_PEER as usize, "{ip:?} held {n}: {held:?}");
    }
    let reserve = (TOTAL / 8) as usize;
    let sum: usize = held.iter().sum();
    assert!(
        sum <= TOTAL as usize - reserve,
        "the reserve was taken: {held:?}"
    );
    assert!(
        held[0] >= 30,
        "the first flooder was held to the deadline: {held:?}"
    );
    lists_nodes_within_a_second(&coord.url, None, "after the flood").await;
    coord.shutdown().await;
}

/// Half the requests stop in the request line (short of the 24 bytes that
/// open a connection), half in the headers (hyper's header timeout).
fn partial_get(i: usize) -> (&'static [u8], &'static [u8]) {
    if i.is_multiple_of(2) {
        (b"GET /met", b"rics")
    } else {
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\n", b"X-Slow: 1\r\n")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_metrics_requests_are_closed_and_neither_port_starves() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.metrics_listen = Some(MetricsListen::At("127.0.0.1:0".parse().unwrap()));
    let coord = common::start_with_metrics(cfg).await;
    coord.jobs().await;
    let metrics = coord.metrics.clone().unwrap();
    let watch = METRICS_OPENING + MARGIN;
    let watched = flood(metrics.parse().unwrap(), 24, partial_get, watch).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    lists_nodes_within_a_second(&coord.url, None, "during the /metrics flood").await;
    let t0 = Instant::now();
    let scrape = gpuctl_core::metrics_http::get(&metrics, "/metrics", Duration::from_secs(1))
        .await
        .unwrap_or_else(|e| panic!("a scrape during the flood: {e}"));
    assert_eq!(scrape.status, 200, "{scrape:?} in {:?}", t0.elapsed());

    let held = held_per_flooder(watched, METRICS_OPENING).await;
    for (n, ip) in held.iter().zip(FLOODERS) {
        assert!(
            *n <= METRICS_PER_PEER,
            "{ip:?} held {n} on /metrics: {held:?}"
        );
        assert!(*n > 0, "{ip:?}'s were all closed at once: {held:?}");
    }
    coord.get("/metrics").await;
    coord.shutdown().await;
}

/// A CA and the coordinator's certificate for 127.0.0.1 and localhost:
/// their files, and the CA's PEM.
fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf, String) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.distinguished_name
        .push(DnType::CommonName, "flood test CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    (
        write("coordinator.pem", &cert.pem()),
        write("coordinator.key", &key.serialize_pem()),
        write("ca.pem", &ca_pem),
        ca_pem,
    )
}

/// A ClientHello's record and handshake headers (508 bytes to come), then
/// a trickle of them.
fn half_client_hello(_: usize) -> (&'static [u8], &'static [u8]) {
    (
        &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc],
        &[0x03, 0x03, 0, 0, 0, 0, 0, 0],
    )
}

/// From `ip`: a whole TLS handshake, then 16 bytes of the HTTP/2 preface
/// and nothing more. How long after its connect the coordinator closed it.
async fn handshake_then_stall(ip: [u8; 4], to: SocketAddr, ca_pem: String) -> Option<Duration> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    use std::io::{Read, Write};
    let t0 = Instant::now();
    let sock = connect_from(ip, to).await.into_std().unwrap();
    tokio::task::spawn_blocking(move || {
        let mut sock = sock;
        sock.set_nonblocking(false).unwrap();
        sock.set_read_timeout(Some(OPENING + MARGIN)).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let name = "localhost".try_into().unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        while conn.is_handshaking() {
            conn.complete_io(&mut sock)
                .expect("the handshake is answered");
        }
        let mut tls = rustls::StreamOwned::new(conn, sock);
        tls.write_all(b"PRI * HTTP/2.0\r\n").unwrap();
        tls.flush().unwrap();
        let mut buf = [0u8; 4096];
        loop {
            match tls.read(&mut buf) {
                Ok(0) => return Some(t0.elapsed()),
                Ok(_) => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return None
                }
                Err(_) => return Some(t0.elapsed()),
            }
        }
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_tls_handshakes_are_closed_and_the_cli_gets_in() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, ca, ca_pem) = certificates(dir.path());
    let mut cfg = config(&dir.path().join("data"));
    cfg.tls_cert = Some(cert);
    cfg.tls_key = Some(key);
    cfg.client_ca = Some(ca);
    let coord = common::start_cfg(cfg).await;
    let addr = addr_of(&coord.url);
    let url = format!("https://{addr}");
    // Up: the TLS port answers.
    let t0 = Instant::now();
    while Endpoint::from_shared(url.clone())
        .unwrap()
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&ca_pem))
                .domain_name("localhost"),
        )
        .unwrap()
        .connect()
        .await
        .is_err()
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no TLS coordinator at {url}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let stalled: Vec<_> = (0..5)
        .map(|_| tokio::spawn(handshake_then_stall([127, 0, 0, 5], addr, ca_pem.clone())))
        .collect();
    let watched = flood(addr, 45, half_client_hello, OPENING + MARGIN).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    lists_nodes_within_a_second(&url, Some(&ca_pem), "during the TLS flood").await;

    let held = held_per_flooder(watched, OPENING).await;
    for (n, ip) in held.iter().zip(FLOODERS) {
        assert!(*n <= PER_PEER as usize, "{ip:?} held {n}: {held:?}");
    }
    assert!(
        held[0] >= 35,
        "the first flooder was held to the deadline: {held:?}"
    );
    for s in stalled {
        let after = s.await.unwrap();
        assert!(
            after.is_some(),
            "a connection that finished its TLS handshake and then sent 16 bytes is still open {:?} on",
            OPENING + MARGIN
        );
    }
    lists_nodes_within_a_second(&url, Some(&ca_pem), "after the TLS flood").await;
    coord.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_sessions_are_closed_at_the_node_timeout_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let node_timeout = Duration::from_secs(1);
    let mut cfg = config(dir.path());
    cfg.node_timeout = node_timeout;
    cfg.metrics_listen = Some(MetricsListen::At("127.0.0.1:0".parse().unwrap()));
    let coord = common::start_with_metrics(cfg).await;
    let mut jobs = coord.jobs().await;
    let live = FakeAgent::cpu(&coord.url, "live").await;

    // Sessions that never send their first heartbeat.
    let mut client = AgentServiceClient::connect(coord.url.clone())
        .await
        .unwrap();
    let mut silent = Vec::new();
    for _ in 0..20 {
        let s = client
            .session(futures::stream::pending::<AgentMessage>())
            .await
            .unwrap()
            .into_inner();
        silent.push(s);
    }
    // One that names its node, then says nothing more.
    let (mut quiet, _) = gpuctl_testkit::agent::register(
        &coord.url,
        "quiet",
        gpuctl_testkit::host::cpu("quiet", 1),
        vec![],
    )
    .await;
    let first = futures::stream::iter([heartbeat("quiet")]).chain(futures::stream::pending());
    let mut quiet = quiet.session(first).await.unwrap().into_inner();
    lists_nodes_within_a_second(&coord.url, None, "with silent sessions open").await;

    let within = node_timeout + MARGIN;
    for (i, mut s) in silent.into_iter().enumerate() {
        let end = tokio::time::timeout(within, s.message()).await;
        let status = match end {
            Ok(Err(status)) => status,
            other => panic!("silent session {i}, {within:?} on: {other:?}"),
        };
        assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
        assert!(status.message().contains("first heartbeat"), "{status:?}");
    }
    let status = tokio::time::timeout(within, async {
        loop {
            match quiet.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the quiet session ended without saying why"),
                Err(status) => return status,
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the quiet session is still open {within:?} on"));
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        status.message().contains("nothing from the agent"),
        "{status:?}"
    );

    // An agent that heartbeats is not touched, three node timeouts on.
    tokio::time::sleep(node_timeout * 2).await;
    let nodes = jobs
        .list_nodes(ListNodesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .nodes;
    let state = |name: &str| nodes.iter().find(|n| n.name == name).map(|n| n.state());
    assert_eq!(state("live"), Some(NodeState::Ready), "{nodes:?}");
    let body = coord.get("/metrics").await.body;
    let refused =
        gpuctl_core::metrics_http::value(&body, "gpuctl_refused_messages_total{kind=\"session\"}");
    assert_eq!(refused, Some(21.0), "{body}");
    drop(live);
    coord.shutdown().await;
}

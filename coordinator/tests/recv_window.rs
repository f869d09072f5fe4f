//! What a client may send the coordinator before it is read: frames no
//! bigger than a connection's first read buffer (issue 51: at 16,384 agents
//! buffers grown to 16 KiB frames held 350-570 MB), and a big request still
//! arrives whole. Between a real client and the real coordinator, a TCP
//! relay reads the HTTP/2 frames the client sends.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuctl_core::server::RECV_WINDOW_BYTES;
use gpuctl_proto::pb::job_service_client::JobServiceClient;
use gpuctl_proto::pb::{ListNodesRequest, PlanRequest};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A relay on loopback to `to`: what the client sends is kept in `sent`.
async fn relay(to: &str) -> (String, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let sent = Arc::new(Mutex::new(Vec::new()));
    let (to, kept) = (to.trim_start_matches("http://").to_string(), sent.clone());
    tokio::spawn(async move {
        let (client, _) = listener.accept().await.unwrap();
        let server = TcpStream::connect(&to).await.unwrap();
        let (mut cr, mut cw) = client.into_split();
        let (mut sr, mut sw) = server.into_split();
        tokio::spawn(async move { tokio::io::copy(&mut sr, &mut cw).await });
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = cr.read(&mut buf).await {
            if n == 0 || sw.write_all(&buf[..n]).await.is_err() {
                break;
            }
            kept.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    (url, sent)
}

/// The payload lengths of the DATA frames in `wire` (a client's bytes:
/// the 24-byte preface, then frames of a 9-byte head and a payload).
fn data_frames(wire: &[u8]) -> Vec<usize> {
    let mut at = 24;
    let mut out = Vec::new();
    while at + 9 <= wire.len() {
        let len = u32::from_be_bytes([0, wire[at], wire[at + 1], wire[at + 2]]) as usize;
        if wire[at + 3] == 0x0 {
            out.push(len);
        }
        at += 9 + len;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_request_comes_whole_in_frames_the_first_read_buffer_holds() {
    let dir = tempfile::tempdir().unwrap();
    let coord = common::start(dir.path(), Duration::from_secs(30)).await;
    let (url, sent) = relay(&coord.url).await;
    let channel = gpuctl_core::client::builder(&url).connect().await.unwrap();
    let mut jobs = JobServiceClient::new(channel);
    // Answered: the server's settings have come. Before them a client may
    // send the protocol's default window, 64 KiB, in frames of up to 16 KiB;
    // gpuctl's clients open with small calls.
    let nodes = ListNodesRequest::default();
    jobs.list_nodes(nodes).await.unwrap();
    let before = sent.lock().unwrap().len();
    let mut req: PlanRequest = PlanRequest {
        spec: common::spec("stress", 1).spec,
        max_ranks: 0,
    };
    // ~300 KB: a label past what a name may be, so the answer is a refusal
    // that names the field, read from the whole request.
    let long = "x".repeat(300_000);
    req.spec.as_mut().unwrap().name = long;
    let status = jobs.plan_job(req).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("name"), "{status:?}");

    let wire = sent.lock().unwrap().clone();
    let first = data_frames(&wire[..before]).len();
    let frames = data_frames(&wire)[first..].to_vec();
    let whole: usize = frames.iter().sum();
    assert!(whole > 300_000, "the request went whole: {whole} bytes");
    let most = frames.iter().copied().max().unwrap_or(0);
    assert!(
        most <= RECV_WINDOW_BYTES as usize && most + 9 <= 8 * 1024,
        "a frame of {most} bytes: {frames:?}"
    );
    coord.shutdown().await;
}

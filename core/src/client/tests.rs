//! The client's calls against listeners that misbehave on purpose: silent,
//! refusing, or reading the HPACK blocks a client sends.

use super::*;
use gpuctl_proto::pb::job_service_client::JobServiceClient;
use gpuctl_proto::pb::ListNodesRequest;
use std::time::Instant;

/// Accepts connections and never answers, like a standby coordinator
/// whose listener is bound while it waits for the leader key.
async fn silent_listener() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    (url, task)
}

#[tokio::test]
async fn a_silent_server_fails_the_call_in_time_and_names_the_url() {
    let (url, task) = silent_listener().await;
    let channel = builder(&url)
        .request_timeout(Duration::from_millis(300))
        .connect()
        .await
        .expect("TCP is accepted");
    let mut client = JobServiceClient::new(channel);
    let start = Instant::now();
    let status = tokio::time::timeout(
        Duration::from_secs(5),
        client.list_nodes(ListNodesRequest::default()),
    )
    .await
    .expect("the call must not hang")
    .unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(2));
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
    assert_eq!(status.message(), format!("{url}: no answer within 300ms"));

    // A call's own limit replaces the default, longer or shorter.
    let mut req = tonic::Request::new(ListNodesRequest::default());
    req.set_timeout(Duration::from_millis(100));
    let status = client.list_nodes(req).await.unwrap_err();
    assert_eq!(status.message(), format!("{url}: no answer within 100ms"));
    task.abort();
}

#[tokio::test]
async fn refused_and_malformed_addresses_say_so() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}");
    let err = builder(&url).connect().await.unwrap_err();
    assert!(matches!(err, ClientError::Unreachable { .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with(&format!("cannot reach {url}: ")),
        "{err}"
    );
    assert!(err.reason().contains("refused"), "{err}");

    let err = builder("http://bad host").connect().await.unwrap_err();
    assert!(matches!(err, ClientError::BadUrl { .. }), "{err}");
}

/// HPACK fields of one header block that the sender added to its
/// table (RFC 7541 6.2.1: a literal with incremental indexing).
fn indexed_fields(block: &[u8]) -> usize {
    fn int(b: &[u8], i: &mut usize, bits: u32) -> usize {
        let mask = (1usize << bits) - 1;
        let mut v = b[*i] as usize & mask;
        *i += 1;
        if v == mask {
            let mut shift = 0;
            loop {
                let c = b[*i];
                *i += 1;
                v += ((c & 0x7f) as usize) << shift;
                shift += 7;
                if c & 0x80 == 0 {
                    break;
                }
            }
        }
        v
    }
    let skip_string = |b: &[u8], i: &mut usize| {
        let len = int(b, i, 7);
        *i += len;
    };
    let (mut i, mut added) = (0, 0);
    while i < block.len() {
        let b = block[i];
        let (bits, literal) = match b {
            _ if b & 0x80 != 0 => (7, false),
            _ if b & 0xc0 == 0x40 => (6, true),
            _ if b & 0xe0 == 0x20 => (5, false),
            _ => (4, true),
        };
        added += (b & 0xc0 == 0x40) as usize;
        if int(block, &mut i, bits) == 0 && literal {
            skip_string(block, &mut i);
        }
        if literal {
            skip_string(block, &mut i);
        }
    }
    added
}

/// Every call's headers go never indexed but what tonic's own channel
/// adds (`:authority`, `user-agent`), so the server keeps no table of
/// them for the connection: with each call's `grpc-timeout` indexed,
/// 16,384 agents' tables held ~70 MB of a coordinator (issue 51).
#[tokio::test]
async fn calls_leave_the_server_no_header_table_to_keep() {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let wire = Arc::new(std::sync::Mutex::new(Vec::new()));
    let task = tokio::spawn({
        let wire = wire.clone();
        async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            while let Ok(n) = conn.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                wire.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        }
    });
    let channel = builder(&url)
        .header("x-gpuctl-node", "node-7")
        .connect()
        .await
        .unwrap();
    let mut client = JobServiceClient::new(channel);
    for ms in 40..50 {
        let mut req = tonic::Request::new(ListNodesRequest::default());
        req.set_timeout(Duration::from_millis(ms));
        client.list_nodes(req).await.unwrap_err();
    }
    let wire = wire.lock().unwrap().clone();
    task.abort();
    // The client's preface, then frames: 9 bytes of head, the payload.
    let mut at = 24;
    let mut added = Vec::new();
    while at + 9 <= wire.len() {
        let len = u32::from_be_bytes([0, wire[at], wire[at + 1], wire[at + 2]]) as usize;
        let kind = wire[at + 3];
        let payload = &wire[at + 9..(at + 9 + len).min(wire.len())];
        if kind == 0x1 {
            added.push(indexed_fields(payload));
        }
        at += 9 + len;
    }
    assert_eq!(added.len(), 10, "one header block a call");
    assert!(added[0] <= 2, "{added:?}");
    assert!(added[1..].iter().all(|&n| n == 0), "{added:?}");
}

#[test]
fn grpc_timeout_headers_parse() {
    let mut h = http::HeaderMap::new();
    assert_eq!(grpc_timeout(&h), None);
    for (text, want) in [
        ("30S", Duration::from_secs(30)),
        ("1500m", Duration::from_millis(1500)),
        ("2M", Duration::from_secs(120)),
        ("7u", Duration::from_micros(7)),
    ] {
        h.insert("grpc-timeout", text.parse().unwrap());
        assert_eq!(grpc_timeout(&h), Some(want), "{text}");
    }
    h.insert("grpc-timeout", "5x".parse().unwrap());
    assert_eq!(grpc_timeout(&h), None);
}

//! What a rank's result call holds while it waits at the gate (`service::gate`), counted by the
//! allocator: at a 131,072-rank job's end ~100,000 wait there at once, so its bytes a call are
//! part of the coordinator's peak. On one thread, so that nothing else allocates meanwhile.

use std::convert::Infallible;
use std::task::{Context, Poll};

use gpuctl_coordinator::service::gate::ResultGate;
use gpuctl_core::counting_alloc::{live, Counting};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use tower::{Layer, Service};

#[global_allocator]
static GLOBAL: Counting = Counting;

const CALLS: usize = 2_000;

/// A `ReportResult` call as h2 hands it on: tonic's headers and the rank's secret (`r{rank}-`
/// and 64 hex digits), each name outside HTTP's standard ones and each value in an allocation
/// of its own, as h2's decoder makes them.
fn request(rank: usize) -> http::Request<()> {
    let secret = format!("r{rank}-{:064x}", rank * 7919);
    let mut headers = HeaderMap::new();
    for (name, value) in [
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("user-agent", "tonic/0.14.9"),
        ("grpc-timeout", "19999m"),
        (gpuctl_core::auth::RANK_SECRET, secret.as_str()),
    ] {
        headers.append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_bytes(value.as_bytes()).unwrap(),
        );
    }
    let mut req = http::Request::builder()
        .uri("/gpuctl.v1.WorkerService/ReportResult")
        .body(())
        .unwrap();
    *req.headers_mut() = headers;
    req
}

/// Takes every call and never answers: the first holds the gate's one permit.
#[derive(Clone)]
struct Holds;

impl Service<http::Request<()>> for Holds {
    type Response = ();
    type Error = Infallible;
    type Future = std::future::Pending<Result<(), Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<()>) -> Self::Future {
        std::future::pending()
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_result_waiting_at_the_gate_holds_its_headers_packed() {
    let mut gate = ResultGate::new(1).layer(Holds);
    let mut inside = gate.call(request(0));
    assert!(futures::poll!(&mut inside).is_pending());
    let mut waiting = Vec::with_capacity(CALLS);

    let before = live();
    for rank in 1..=CALLS {
        let mut call = gate.call(request(rank));
        assert!(futures::poll!(&mut call).is_pending(), "call {rank} waits");
        waiting.push(call);
    }
    let per_call = (live() - before) / CALLS as isize;
    // The call itself (its request, the gate's future, its place in the queue) and its headers:
    // 1,471 bytes measured with the headers held as h2 decoded them (a map with room for six, and
    // five values and two names each in an allocation of its own), 900 packed.
    println!("a waiting call holds {per_call} bytes");
    assert!(
        per_call < 1_100,
        "a call waiting at the gate holds {per_call} bytes: are its headers held as h2 decoded them?"
    );
    drop(waiting);
}

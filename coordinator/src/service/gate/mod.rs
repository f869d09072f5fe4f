//! Admission of rank results: at most [`RESULTS_IN_FLIGHT`] `ReportResult`
//! calls are decoded and handled at once; the rest wait before their body is
//! read.
//!
//! Every rank of a job ends within the same second, and the scheduler takes
//! results one at a time. Unbounded, 32,768 results were decoded (several KB
//! each), each with its handler's state, all waiting on the scheduler: a few
//! hundred MB at the coordinator's peak. A call that waits here holds only its
//! undecoded bytes in HTTP/2's buffers, bounded by the flow-control window,
//! and its headers packed ([`headers`]).
//! Worker retries see nothing of it but the wait, which the scheduler would
//! have made them wait anyway. The waiting calls go in in the order their
//! rank's result first arrived ([`places`]), so a call sent again after its
//! timeout keeps its place. A call that waited says since when ([`Arrived`]:
//! that first arrival): the rank's result was in hand, not missing,
//! meanwhile.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower::{Layer, Service};

mod headers;
mod places;
use headers::Packed;
use places::{Entry, Places};

/// More than the scheduler can use at once, few enough to be small.
pub const RESULTS_IN_FLIGHT: usize = 256;

/// The gRPC path of `WorkerService.ReportResult`.
const GATED_PATH: &str = "/gpuctl.v1.WorkerService/ReportResult";

/// The layer for the coordinator's server; one gate for every connection.
#[derive(Clone)]
pub struct ResultGate {
    places: Arc<Places>,
}

impl ResultGate {
    pub fn new(in_flight: usize) -> ResultGate {
        ResultGate {
            places: Places::new(in_flight),
        }
    }
}

impl<S> Layer<S> for ResultGate {
    type Service = Gated<S>;

    fn layer(&self, inner: S) -> Gated<S> {
        Gated {
            inner,
            places: self.places.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Gated<S> {
    inner: S,
    places: Arc<Places>,
}

/// When the rank's result first reached the gate (this call's or an
/// earlier try's); its handler dates the result's arrival by it
/// (`jobs::hearing`).
#[derive(Debug, Clone, Copy)]
pub struct Arrived(pub tokio::time::Instant);

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> Service<http::Request<B>> for Gated<S>
where
    S: Service<http::Request<B>> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        if req.uri().path() != GATED_PATH {
            return Box::pin(self.inner.call(req));
        }
        // The service that was made ready goes with the call; a clone stays.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let places = self.places.clone();
        Box::pin(async move {
            let rank = req
                .headers()
                .get(gpuctl_core::auth::RANK_SECRET)
                .map(|v| v.as_bytes());
            let (_permit, first) = match places.enter(rank) {
                Entry::In(permit, first) => (permit, first),
                Entry::Queued(queued) => {
                    let packed = Packed::take(req.headers_mut());
                    let got = queued.wait().await;
                    packed.restore(req.headers_mut());
                    got
                }
            };
            req.extensions_mut().insert(Arrived(first));
            inner.call(req).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb::worker_service_server::SERVICE_NAME;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn the_gated_path_is_report_result_of_the_worker_service() {
        assert_eq!(GATED_PATH, format!("/{SERVICE_NAME}/ReportResult"));
    }

    /// Counts the calls inside it at once, the most it saw, and holds each
    /// a little while.
    #[derive(Clone, Default)]
    struct Busy {
        now: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
        /// The longest a call waited since it was stamped [`Arrived`]
        /// (ms), and how many were.
        waited_ms: Arc<AtomicUsize>,
        stamped: Arc<AtomicUsize>,
        /// Each call's headers as they came in.
        headers: Arc<std::sync::Mutex<Vec<http::HeaderMap>>>,
    }

    impl Service<http::Request<()>> for Busy {
        type Response = ();
        type Error = std::convert::Infallible;
        type Future = BoxFuture<Result<(), Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: http::Request<()>) -> Self::Future {
            self.headers.lock().unwrap().push(req.headers().clone());
            if let Some(Arrived(at)) = req.extensions().get::<Arrived>() {
                let waited = at.elapsed().as_millis() as usize;
                self.waited_ms.fetch_max(waited, Ordering::SeqCst);
                self.stamped.fetch_add(1, Ordering::SeqCst);
            }
            let (now, most) = (self.now.clone(), self.most.clone());
            Box::pin(async move {
                let inside = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(inside, Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                now.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            })
        }
    }

    /// A call as a worker's client sends it: its own secret, never indexed.
    fn request(path: &str, i: usize) -> http::Request<()> {
        let mut secret = http::HeaderValue::from_str(&format!("secret-{i}")).unwrap();
        secret.set_sensitive(true);
        http::Request::builder()
            .uri(path)
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header(gpuctl_core::auth::RANK_SECRET, secret)
            .body(())
            .unwrap()
    }

    async fn most_at_once(path: &str, calls: usize) -> Busy {
        let busy = Busy::default();
        let mut gated = ResultGate::new(3).layer(busy.clone());
        let all: Vec<_> = (0..calls).map(|i| gated.call(request(path, i))).collect();
        for r in futures::future::join_all(all).await {
            r.unwrap();
        }
        busy
    }

    #[tokio::test(start_paused = true)]
    async fn results_past_the_gate_wait_and_other_calls_do_not() {
        let gated = most_at_once(GATED_PATH, 12).await;
        assert_eq!(gated.most.load(Ordering::SeqCst), 3);
        // Each says since when it waited: the last three, behind three
        // rounds of 20 ms.
        assert_eq!(gated.stamped.load(Ordering::SeqCst), 12);
        assert_eq!(gated.waited_ms.load(Ordering::SeqCst), 60);
        // Those that waited went on with their headers as sent.
        let mut seen = gated.headers.lock().unwrap().clone();
        seen.sort_by_key(|h| h[gpuctl_core::auth::RANK_SECRET].as_bytes().to_vec());
        let mut sent: Vec<_> = (0..12)
            .map(|i| request(GATED_PATH, i).headers().clone())
            .collect();
        sent.sort_by_key(|h| h[gpuctl_core::auth::RANK_SECRET].as_bytes().to_vec());
        assert_eq!(seen, sent);
        assert!(seen
            .iter()
            .all(|h| h[gpuctl_core::auth::RANK_SECRET].is_sensitive()));
        let other = most_at_once(&format!("/{SERVICE_NAME}/RendezvousPut"), 12).await;
        assert_eq!(other.most.load(Ordering::SeqCst), 12);
        assert_eq!(other.stamped.load(Ordering::SeqCst), 0);
    }
}

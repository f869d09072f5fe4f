//! The one `/metrics` endpoint of the agent and the coordinator: an axum
//! server that answers `GET /metrics` with the OpenMetrics text that
//! `prometheus-client` encodes, 404 elsewhere, until the [`Shutdown`].
//!
//! Values come from live state at every scrape: the caller hands [`serve`] a
//! function that fills a fresh `Registry` (typically with a `Collector` over
//! a snapshot), and [`write_family`] writes one family of such a snapshot.

use std::future::Future;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing;
use axum::Router;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::shutdown::Shutdown;

/// How long open connections get to finish after the shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// What prometheus-client writes: OpenMetrics text, ending in `# EOF`.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The whole exposition of `registry`.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::with_capacity(4096);
    prometheus_client::encoding::text::encode(&mut out, registry)
        .expect("writing to a String cannot fail");
    out
}

/// Labels of one series, in the order they are shown.
pub type Labels = Vec<(&'static str, String)>;

/// Writes one family: HELP and TYPE, then `name{labels} value` per series in
/// the order given; nothing for a family without series.
///
/// Series keep `name` exactly. A counter named `*_total` is a plain
/// OpenMetrics counter (family `name` less `_total`); other counters
/// (dcgm-exporter's `DCGM_FI_DEV_ECC_SBE_VOL_TOTAL`, which dashboards query by
/// that name) are typed counter under their own name, as dcgm-exporter shows them.
pub fn write_family(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    series: &[(Labels, f64)],
) -> std::fmt::Result {
    if series.is_empty() {
        return Ok(());
    }
    let suffixed = matches!(kind, MetricType::Counter) && name.ends_with("_total");
    let family = if suffixed {
        &name[..name.len() - "_total".len()]
    } else {
        name
    };
    let mut metric = encoder.encode_descriptor(family, help, None, kind)?;
    for (labels, v) in series {
        // No labels: `name 3`, not `name{} 3`.
        if labels.is_empty() {
            put(&mut metric, *v, suffixed)?;
        } else {
            put(&mut metric.encode_family(labels)?, *v, suffixed)?;
        }
    }
    Ok(())
}

/// One sample; integers without a fraction, as Prometheus's own clients show them.
fn put(m: &mut MetricEncoder, v: f64, suffixed: bool) -> std::fmt::Result {
    let int = v.fract() == 0.0 && v.abs() < 1e15;
    match (suffixed && v >= 0.0, int) {
        (true, true) => m.encode_counter::<NoLabelSet, _, u64>(&(v as u64), None),
        (true, false) => m.encode_counter::<NoLabelSet, _, u64>(&v, None),
        (false, true) => m.encode_gauge(&(v as i64)),
        (false, false) => m.encode_gauge(&v),
    }
}

/// What a `GET` of an endpoint answered.
#[derive(Debug, Clone)]
pub struct Scrape {
    pub status: u16,
    /// Empty when the answer named none.
    pub content_type: String,
    pub body: String,
}

/// The value of the sample line `series` (a name with its labels, as
/// written, e.g. `gpuctl_jobs{state="running"}`) in exposition `text`.
pub fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// `GET path` from the HTTP endpoint at `addr` (`host:port`) on a
/// connection of its own, all within `within`: how the simulator's bench
/// and the tests read a coordinator's `/metrics`.
pub async fn get(addr: &str, path: &str, within: Duration) -> std::io::Result<Scrape> {
    use http_body_util::{BodyExt as _, Empty};
    use prost::bytes::Bytes;
    fn other(e: impl std::error::Error + Send + Sync + 'static) -> std::io::Error {
        std::io::Error::other(e)
    }
    let read = async {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(other)?;
        let conn = tokio::spawn(conn);
        let request = axum::http::Request::get(path)
            .header(header::HOST, addr)
            .body(Empty::<Bytes>::new())
            .map_err(other)?;
        let answer = sender.send_request(request).await.map_err(other)?;
        let status = answer.status().as_u16();
        let content_type = answer
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let body = answer
            .into_body()
            .collect()
            .await
            .map_err(other)?
            .to_bytes();
        conn.abort();
        Ok(Scrape {
            status,
            content_type,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    };
    tokio::time::timeout(within, read).await.map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer from http://{addr}{path} within {within:?}"),
        )
    })?
}

/// Serves `/metrics` on `listener` until `shutdown`, over TLS when `tls` is
/// given, under the listener's own caps and deadlines
/// ([`crate::metrics_tls`]). `scrape` runs once per request and returns the
/// registry to show, or why there is none (503).
pub async fn serve<F, Fut>(
    listener: TcpListener,
    scrape: F,
    shutdown: Shutdown,
    tls: Option<crate::metrics_tls::TlsConfig>,
) -> std::io::Result<()>
where
    F: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Registry, String>> + Send + 'static,
{
    let app = Router::new()
        .route("/metrics", routing::get(answer::<F, Fut>))
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                "not found; metrics are at /metrics\n",
            )
        })
        .with_state(scrape);
    crate::metrics_tls::serve(listener, app, tls, shutdown, SHUTDOWN_GRACE).await
}

async fn answer<F, Fut>(State(scrape): State<F>) -> Response
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Registry, String>>,
{
    match scrape().await {
        Ok(registry) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], encode(&registry)).into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::collector::Collector;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[derive(Debug)]
    struct Fixed(u64);

    impl Collector for Fixed {
        fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
            let l = |v: &str| vec![("node", v.to_string())];
            write_family(
                &mut e,
                "up",
                "Up.",
                MetricType::Gauge,
                &[(l("a\"b\\c"), 1.0), (l("d"), 0.5)],
            )?;
            write_family(
                &mut e,
                "jobs_total",
                "Jobs.",
                MetricType::Counter,
                &[(vec![], self.0 as f64)],
            )?;
            write_family(
                &mut e,
                "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                "ECC.",
                MetricType::Counter,
                &[(l("x"), 3.0)],
            )?;
            write_family(&mut e, "empty", "Nothing.", MetricType::Gauge, &[])
        }
    }

    fn registry(n: u64) -> Registry {
        let mut r = Registry::default();
        r.register_collector(Box::new(Fixed(n)));
        r
    }

    #[test]
    fn families_keep_their_series_names() {
        assert_eq!(
            encode(&registry(7)),
            "# HELP up Up.\n# TYPE up gauge\nup{node=\"a\\\"b\\\\c\"} 1\nup{node=\"d\"} 0.5\n\
             # HELP jobs Jobs.\n# TYPE jobs counter\njobs_total 7\n\
             # HELP DCGM_FI_DEV_ECC_SBE_VOL_TOTAL ECC.\n# TYPE DCGM_FI_DEV_ECC_SBE_VOL_TOTAL counter\n\
             DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{node=\"x\"} 3\n# EOF\n"
        );
    }

    async fn raw_get(addr: std::net::SocketAddr, request: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out))
            .await
            .expect("an answer within 5 s")
            .unwrap();
        out
    }

    #[tokio::test]
    async fn get_reads_the_status_type_and_body() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let stop = Shutdown::new();
        let server = tokio::spawn(serve(
            listener,
            || async { Ok(registry(3)) },
            stop.clone(),
            None,
        ));
        let within = Duration::from_secs(5);
        let scrape = super::get(&addr, "/metrics", within).await.unwrap();
        assert_eq!(scrape.status, 200);
        assert_eq!(scrape.content_type, CONTENT_TYPE);
        assert!(scrape.body.contains("\njobs_total 3\n"), "{}", scrape.body);
        assert_eq!(value(&scrape.body, "jobs_total"), Some(3.0));
        assert_eq!(value(&scrape.body, "up{node=\"d\"}"), Some(0.5));
        // A name that only starts another's is not it.
        assert_eq!(value(&scrape.body, "jobs"), None);
        assert_eq!(
            super::get(&addr, "/nope", within).await.unwrap().status,
            404
        );
        stop.cancel();
        server.await.unwrap().unwrap();
        let gone = super::get(&addr, "/metrics", within).await;
        assert!(gone.is_err(), "{gone:?}");
    }

    #[tokio::test]
    async fn serves_live_values_404s_elsewhere_and_stops() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let jobs = Arc::new(AtomicU64::new(1));
        let live = jobs.clone();
        let scrape = move || {
            let n = live.load(Ordering::Relaxed);
            async move {
                if n < 5 {
                    Ok(registry(n))
                } else {
                    Err("stopping".to_string())
                }
            }
        };
        let stop = Shutdown::new();
        let server = tokio::spawn(serve(listener, scrape, stop.clone(), None));

        let close = "Connection: close\r\n\r\n";
        let resp = raw_get(
            addr,
            &format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{close}"),
        )
        .await;
        assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");
        assert!(
            resp.contains(&format!("content-type: {CONTENT_TYPE}\r\n")),
            "{resp}"
        );
        assert!(resp.contains("\njobs_total 1\n"), "{resp}");
        jobs.store(2, Ordering::Relaxed);
        let resp = raw_get(addr, &format!("GET /metrics?x=1 HTTP/1.1\r\n{close}")).await;
        assert!(resp.contains("\njobs_total 2\n"), "{resp}");
        let resp = raw_get(addr, &format!("GET /nope HTTP/1.1\r\n{close}")).await;
        assert!(resp.starts_with("HTTP/1.1 404"), "{resp}");
        let resp = raw_get(
            addr,
            &format!("POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n{close}"),
        )
        .await;
        assert!(resp.starts_with("HTTP/1.1 405"), "{resp}");
        jobs.store(9, Ordering::Relaxed);
        let resp = raw_get(addr, &format!("GET /metrics HTTP/1.1\r\n{close}")).await;
        assert!(resp.starts_with("HTTP/1.1 503"), "{resp}");
        assert!(resp.ends_with("stopping\n"), "{resp}");

        // A client that sent half a request does not hold up the stop.
        let mut half = tokio::net::TcpStream::connect(addr).await.unwrap();
        half.write_all(b"GET /metr").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("the server stops on shutdown")
            .unwrap()
            .unwrap();
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "the listener is closed"
        );
    }
}

//! The one place that builds gRPC clients (CLI, agent, worker), so that every
//! connection has the same keepalives and none waits forever: a coordinator
//! that accepts TCP but never answers (a standby waiting for the leader key,
//! a wedged host) costs a caller at most its timeouts, and the error names
//! the URL and the wait ("http://h:7070: no answer within 30s").
//!
//! The request timeout bounds the wait for a response's headers: all of a
//! unary call, but only the opening of a stream, whose messages then flow for
//! as long as the stream lives (the HTTP/2 keepalive notices a dead peer
//! there). A call that waits longer on purpose (a long poll) names its own
//! limit with `tonic::Request::set_timeout`, which replaces the default.
//!
//! An `https://` URL gets TLS with the process's [`TlsFiles`] (the CA that
//! signed the coordinator, and this process's own certificate where it has
//! one): set once from flags with [`set_tls`], else read from `GPUCTL_TLS_*`.
//! [`Builder::header`] puts a header (a token, a worker's secret) on every call.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::body::Body;
use tonic::codegen::{http, Service, StdError};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use tonic::Status;

use crate::retry;

/// Time to open the TCP connection (and the HTTP/2 one over it).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Time for a unary call's answer unless the caller says otherwise.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// HTTP/2 pings: how an idle session notices a vanished host (no FIN ever
/// comes from a machine that lost power), and how any call notices a peer
/// that accepted the connection but never speaks.
/// 20 s as the server's (crate::server::KEEPALIVE_TIMEOUT): at 10 s a
/// node busy with its test, or a starved simulator, lost its session.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// How much a server may send on one call, and on the whole connection,
/// before this client says it has read it. HTTP/2's default of 64 KiB made
/// a 4,096-node `gpuctl nodes` (270 KB) wait on four window updates, each
/// a round trip through both busy processes, and a big job's report one
/// per 64 KiB. A unary answer is buffered whole before it is decoded
/// either way; a stream's reader (an agent's session) reads each message as
/// it comes.
const STREAM_WINDOW_BYTES: u32 = 8 << 20;
const CONNECTION_WINDOW_BYTES: u32 = 16 << 20;

/// Why no channel came about. The texts name the URL; callers add their fix.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("`{url}` is not a gRPC URL ({reason}); write it like http://127.0.0.1:7070")]
    BadUrl { url: String, reason: String },
    #[error("cannot reach {url}: {reason}")]
    Unreachable { url: String, reason: String },
    /// TLS files missing or unreadable, or a header that is no header value.
    #[error("cannot connect to {url}: {reason}")]
    Setup { url: String, reason: String },
}

impl ClientError {
    /// What went wrong, without the URL (for messages that name it already).
    pub fn reason(&self) -> &str {
        match self {
            ClientError::BadUrl { reason, .. }
            | ClientError::Unreachable { reason, .. }
            | ClientError::Setup { reason, .. } => reason,
        }
    }
}

/// The TLS files of a client: the CA that signed the server's certificate
/// and, for mutual TLS, this process's own certificate and key (PEM).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// The environment variables [`TlsFiles::from_env`] reads.
pub const TLS_CA_ENV: &str = "GPUCTL_TLS_CA";
pub const TLS_CERT_ENV: &str = "GPUCTL_TLS_CERT";
pub const TLS_KEY_ENV: &str = "GPUCTL_TLS_KEY";

impl TlsFiles {
    /// `GPUCTL_TLS_CA`, `GPUCTL_TLS_CERT`, `GPUCTL_TLS_KEY` (empty = unset).
    pub fn from_env() -> TlsFiles {
        let var = |name| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        TlsFiles {
            ca: var(TLS_CA_ENV),
            cert: var(TLS_CERT_ENV),
            key: var(TLS_KEY_ENV),
        }
    }

    /// Absolute paths, so that child processes in other folders (workers)
    /// can be handed them.
    fn absolute(self) -> TlsFiles {
        let abs = |p: Option<PathBuf>| p.map(|p| std::path::absolute(&p).unwrap_or(p));
        TlsFiles {
            ca: abs(self.ca),
            cert: abs(self.cert),
            key: abs(self.key),
        }
    }

    fn config(&self) -> Result<ClientTlsConfig, String> {
        let read = |p: &Path, what: &str| {
            std::fs::read(p).map_err(|e| format!("cannot read the {what} {}: {e}", p.display()))
        };
        let ca = self.ca.as_deref().ok_or_else(|| {
            format!("an https:// URL needs the CA that signed the coordinator's certificate: pass --tls-ca FILE or set {TLS_CA_ENV}")
        })?;
        let mut config =
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca, "CA")?));
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                config = config.identity(Identity::from_pem(
                    read(cert, "certificate")?,
                    read(key, "key")?,
                ));
            }
            (None, None) => {}
            _ => return Err("--tls-cert and --tls-key go together: pass both or neither".into()),
        }
        Ok(config)
    }
}

static PROCESS_TLS: OnceLock<TlsFiles> = OnceLock::new();

/// Sets the TLS files of every `https://` channel this process builds (from
/// its flags); the first call wins. Without it, `GPUCTL_TLS_*` apply.
pub fn set_tls(files: TlsFiles) {
    let _ = PROCESS_TLS.set(files.absolute());
}

/// The TLS files `https://` channels of this process use.
pub fn tls() -> TlsFiles {
    PROCESS_TLS
        .get()
        .cloned()
        .unwrap_or_else(|| TlsFiles::from_env().absolute())
}

/// Builds a [`Channel`] to one URL: `builder(url).request_timeout(..).connect()`.
#[derive(Debug, Clone)]
pub struct Builder {
    url: String,
    connect_timeout: Duration,
    request_timeout: Duration,
    headers: Vec<(&'static str, String)>,
    local_address: Option<std::net::IpAddr>,
}

/// A client of `url` with the default timeouts.
pub fn builder(url: &str) -> Builder {
    Builder {
        url: url.to_string(),
        connect_timeout: CONNECT_TIMEOUT,
        request_timeout: REQUEST_TIMEOUT,
        headers: Vec::new(),
        local_address: None,
    }
}

impl Builder {
    pub fn connect_timeout(mut self, limit: Duration) -> Self {
        self.connect_timeout = limit;
        self
    }

    pub fn request_timeout(mut self, limit: Duration) -> Self {
        self.request_timeout = limit;
        self
    }

    /// Sends `name: value` with every call of the channel (a bearer token,
    /// a worker's secret).
    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    /// Opens its connections from `address` (one of this host's), not the
    /// one the kernel picks: each simulated node comes from a loopback
    /// address of its own (`gpuctl-sim --own-addresses`), as real hosts come
    /// from theirs.
    pub fn local_address(mut self, address: Option<std::net::IpAddr>) -> Self {
        self.local_address = address;
        self
    }

    fn setup_error(&self, reason: String) -> ClientError {
        ClientError::Setup {
            url: self.url.clone(),
            reason,
        }
    }

    fn endpoint(&self) -> Result<Endpoint, ClientError> {
        let mut endpoint =
            Endpoint::from_shared(self.url.clone()).map_err(|e| ClientError::BadUrl {
                url: self.url.clone(),
                reason: e.to_string(),
            })?;
        if self.url.starts_with("https://") {
            let config = tls().config().map_err(|e| self.setup_error(e))?;
            endpoint = endpoint
                .tls_config(config)
                .map_err(|e| self.setup_error(format!("TLS: {}", root_cause(&e))))?;
        }
        Ok(endpoint
            .connect_timeout(self.connect_timeout)
            .local_address(self.local_address)
            .tcp_nodelay(true)
            .initial_stream_window_size(STREAM_WINDOW_BYTES)
            .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
            // No HPACK dynamic table for what the server sends back: told
            // this, the server indexes no response header for this
            // connection. Its encoder's tables were 133 MB of the
            // coordinator's heap at 16,384 simulated nodes (jemalloc's heap
            // profile at a job's end, docs/benchmarks.md), for a gain of a
            // few dozen bytes a response.
            .http2_header_table_size(0)
            .tcp_keepalive(Some(Duration::from_secs(30)))
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true))
    }

    fn headers(&self) -> Result<Arc<http::HeaderMap>, ClientError> {
        let mut map = http::HeaderMap::new();
        for (name, value) in &self.headers {
            let mut value = http::HeaderValue::from_str(value).map_err(|_| {
                self.setup_error(format!(
                    "the value for `{name}` has characters a header cannot carry"
                ))
            })?;
            // Every header set here is a credential (a token, a rank's
            // secret): HTTP/2 sends it never indexed (RFC 7541 7.1.3), so it
            // sits in neither side's header table. The coordinator's tables
            // of connections that carried 8 ranks' secrets per job grew
            // ~70 MB over 9 jobs at 4,096 simulated nodes.
            value.set_sensitive(true);
            map.insert(*name, value);
        }
        Ok(Arc::new(map))
    }

    fn wrap(&self, inner: tonic::transport::Channel) -> Result<Channel, ClientError> {
        Ok(Channel {
            inner,
            url: Arc::from(self.url.as_str()),
            request_timeout: self.request_timeout,
            headers: self.headers()?,
        })
    }

    /// Connects now, so that a wrong or dead address is reported up front.
    pub async fn connect(&self) -> Result<Channel, ClientError> {
        let endpoint = self.endpoint()?;
        self.headers()?;
        let unreachable = |reason: String| ClientError::Unreachable {
            url: self.url.clone(),
            reason,
        };
        match tokio::time::timeout(self.connect_timeout, endpoint.connect()).await {
            Ok(Ok(inner)) => self.wrap(inner),
            Ok(Err(e)) if is_timeout(&e) => Err(unreachable(no_answer(self.connect_timeout))),
            Ok(Err(e)) => Err(unreachable(root_cause(&e))),
            Err(_) => Err(unreachable(no_answer(self.connect_timeout))),
        }
    }

    /// Connects on the first call (and again after a broken connection).
    /// Must be called inside a tokio runtime.
    pub fn connect_lazy(&self) -> Result<Channel, ClientError> {
        self.wrap(self.endpoint()?.connect_lazy())
    }
}

fn no_answer(limit: Duration) -> String {
    format!("no answer within {}", humantime::format_duration(limit))
}

/// The innermost cause says "connection refused"; tonic's outer text is generic.
pub fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// Whether any error in `e`'s chain is `what`.
fn in_chain(
    e: &(dyn std::error::Error + 'static),
    what: impl Fn(&(dyn std::error::Error + 'static)) -> bool,
) -> bool {
    let mut cur = Some(e);
    while let Some(e) = cur {
        if what(e) {
            return true;
        }
        cur = e.source();
    }
    false
}

fn is_keepalive_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    in_chain(e, |e| {
        e.downcast_ref::<hyper::Error>()
            .is_some_and(|h| h.is_timeout())
    })
}

fn is_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    is_keepalive_timeout(e)
        || in_chain(e, |e| {
            e.is::<tonic::TimeoutExpired>()
                || e.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        })
}

/// A tonic channel whose calls end with `DEADLINE_EXCEEDED` ("URL: no answer
/// within 30s") when the response does not start in time. Generated clients
/// take it like a tonic `Channel`: `JobServiceClient::new(channel)`.
#[derive(Clone, Debug)]
pub struct Channel {
    inner: tonic::transport::Channel,
    url: Arc<str>,
    request_timeout: Duration,
    headers: Arc<http::HeaderMap>,
}

impl Channel {
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Service<http::Request<Body>> for Channel {
    type Response = http::Response<Body>;
    type Error = StdError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, StdError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StdError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        for (name, value) in self.headers.iter() {
            req.headers_mut().insert(name, value.clone());
        }
        // Sent never indexed: the server's HPACK decoder keeps a table of
        // what a client indexes, and each call's `grpc-timeout` filled it,
        // ~4 KB a connection (70 MB for 16,384 agents, issue 51). The cost
        // is a few dozen bytes a call.
        for value in req.headers_mut().values_mut() {
            value.set_sensitive(true);
        }
        let limit = grpc_timeout(req.headers()).unwrap_or(self.request_timeout);
        let url = self.url.clone();
        let again = retry::again(req.uri().path());
        // The service made ready by poll_ready goes with the call (tower's
        // rule: it holds the buffer's slot); a clone stays for the next.
        let fresh = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, fresh);
        let call = tries(ready, req, again);
        Box::pin(async move {
            let late = |d| Status::deadline_exceeded(format!("{url}: {}", no_answer(d))).into();
            match tokio::time::timeout(limit, call).await {
                Ok(Ok(resp)) => Ok(resp),
                // A peer that accepted and never speaks fails the pings first.
                Ok(Err(e)) if is_keepalive_timeout(&*e) => {
                    Err(late(KEEPALIVE_INTERVAL + KEEPALIVE_TIMEOUT))
                }
                // tonic's channel reads `grpc-timeout` too and may fire first.
                Ok(Err(e)) if is_timeout(&*e) => Err(late(limit)),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(late(limit)),
            }
        })
    }
}

/// `req` on `inner` (made ready), and again on a new connection while the failure
/// shows it may go again (crate::retry), at most [`retry::ATTEMPTS`]
/// times in all; the whole within the caller's limit.
async fn tries(
    mut inner: tonic::transport::Channel,
    req: http::Request<Body>,
    again: retry::Again,
) -> Result<http::Response<Body>, StdError> {
    if again == retry::Again::Never {
        return inner.call(req).await.map_err(Into::into);
    }
    let kept = retry::Kept::keep(req).await?;
    let mut n = 1;
    loop {
        // Ready for the first try already (poll_ready); again after.
        let ready = match n {
            1 => Ok(()),
            _ => futures::future::poll_fn(|cx| inner.poll_ready(cx)).await,
        };
        let sent = match ready {
            Ok(()) => inner.call(kept.request()).await,
            Err(e) => Err(e),
        };
        match sent {
            Err(e) if n < retry::ATTEMPTS && retry::worth_again(again, &e) => {
                n += 1;
                tracing::debug!(
                    path = kept.path(),
                    attempt = n,
                    "the connection failed under the call ({}); trying again",
                    root_cause(&e)
                );
                tokio::time::sleep(retry::pause(n)).await;
            }
            other => return other.map_err(Into::into),
        }
    }
}

/// The `grpc-timeout` header that `tonic::Request::set_timeout` writes:
/// at most 8 digits and a unit (gRPC over HTTP/2 spec).
fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let text = headers.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = text.split_at(text.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests;

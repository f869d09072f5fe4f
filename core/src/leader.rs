//! Which of several coordinator URLs leads. With `--store etcd` one
//! coordinator leads and the others stand by; a standby answers every call at
//! once with `UNAVAILABLE` and the leader's URL in the `gpuctl-leader`
//! metadata ([`standby_status`]), so a client given every URL finds the
//! leader without parsing text:
//! - [`find_leader`] connects to the URL that leads, for clients that connect
//!   up front (CLI, agent): each URL in turn is connected and asked once;
//!   a standby's pointer is followed once.
//! - [`Failover`] is a lazy channel over the list for clients that connect on
//!   their first call and retry their own calls (workers): a call that meets
//!   a standby or a dead coordinator fails as before, and the channel moves
//!   to the leader (or the next URL), so the caller's retry lands there.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::{http, Service, StdError};
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

use crate::client::{Builder, Channel, ClientError};

/// The metadata key (and HTTP/2 header) of a standby's answer: the leader's URL.
pub const LEADER_METADATA: &str = "gpuctl-leader";

/// A path no coordinator serves: asked to learn whether a URL leads. A
/// leader answers `UNIMPLEMENTED` (or any other refusal) at once; a standby
/// answers `UNAVAILABLE`, as to every call.
const PROBE_PATH: &str = "/gpuctl.v1.Leader/Probe";

/// `http://a:7070, http://b:7070` as a list: trimmed, without empty items or repeats.
pub fn split_urls(list: &str) -> Vec<String> {
    let mut urls: Vec<String> = Vec::new();
    for url in list.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        if !urls.iter().any(|u| u == url) {
            urls.push(url.to_string());
        }
    }
    urls
}

/// What a standby answers to every call: `UNAVAILABLE` naming the leader
/// (and carrying it as `gpuctl-leader`), or saying that none leads yet.
pub fn standby_status(leader: Option<&str>) -> Status {
    let Some(url) = leader else {
        return Status::unavailable(
            "standby; no coordinator leads at the moment (the etcd leader key is free or unknown); retry shortly",
        );
    };
    let mut status = Status::unavailable(format!("standby; the leader is {url}; retry there"));
    if let Ok(value) = MetadataValue::try_from(url) {
        status.metadata_mut().insert(LEADER_METADATA, value);
    }
    status
}

/// The leader a standby named in its answer, if `status` is one.
pub fn leader_of(status: &Status) -> Option<String> {
    if status.code() != Code::Unavailable {
        return None;
    }
    let url = status
        .metadata()
        .get(LEADER_METADATA)?
        .to_str()
        .ok()?
        .trim();
    (!url.is_empty()).then(|| url.to_string())
}

/// Why no URL led: each URL tried with what it said, in order.
#[derive(Debug, thiserror::Error)]
#[error("{}", self.describe())]
pub struct NoLeader {
    pub tried: Vec<(String, String)>,
}

impl NoLeader {
    /// The URLs tried, comma-separated.
    pub fn urls(&self) -> String {
        let urls: Vec<&str> = self.tried.iter().map(|(u, _)| u.as_str()).collect();
        urls.join(", ")
    }

    fn describe(&self) -> String {
        let each: Vec<String> = self
            .tried
            .iter()
            .map(|(url, why)| format!("{url}: {why}"))
            .collect();
        each.join("; ")
    }

    /// Every URL was malformed: the input is wrong, not the fleet.
    pub fn all_bad_urls(&self) -> bool {
        !self.tried.is_empty() && self.tried.iter().all(|(_, why)| why.starts_with(BAD_URL))
    }
}

const BAD_URL: &str = "not a gRPC URL";

/// Whether the coordinator behind `channel` serves (leads): `Err` carries the
/// reason it does not and, for a standby, the leader it named.
pub async fn probe(channel: &Channel) -> Result<(), (String, Option<String>)> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready()
        .await
        .map_err(|e| (crate::client::root_cause(&*e), None))?;
    let codec = tonic_prost::ProstCodec::<(), ()>::default();
    let path = http::uri::PathAndQuery::from_static(PROBE_PATH);
    match grpc.unary(tonic::Request::new(()), path, codec).await {
        Ok(_) => Ok(()),
        Err(s) if matches!(s.code(), Code::Unavailable | Code::DeadlineExceeded) => {
            let leader = leader_of(&s);
            Err((s.message().to_string(), leader))
        }
        // Anything else is an answer from a coordinator that serves.
        Err(_) => Ok(()),
    }
}

/// Connects to the URL of `urls` that leads, trying them in order with
/// `builder(url)`; a standby's answer sends it to the leader it names first
/// (once: a leader named by a second standby is not chased).
pub async fn find_leader(
    urls: &[String],
    builder: impl Fn(&str) -> Builder,
) -> Result<Channel, NoLeader> {
    let mut queue: VecDeque<String> = urls.iter().cloned().collect();
    let mut tried: Vec<(String, String)> = Vec::new();
    let mut followed = false;
    while let Some(url) = queue.pop_front() {
        if tried.iter().any(|(u, _)| *u == url) {
            continue;
        }
        let channel = match builder(&url).connect().await {
            Ok(c) => c,
            Err(e @ ClientError::BadUrl { .. }) => {
                tried.push((url, format!("{BAD_URL} ({})", e.reason())));
                continue;
            }
            Err(e) => {
                tried.push((url, e.reason().to_string()));
                continue;
            }
        };
        match probe(&channel).await {
            Ok(()) => return Ok(channel),
            Err((why, leader)) => {
                // The channel's own timeout names the URL already.
                let why = match why.strip_prefix(url.as_str()) {
                    Some(rest) => rest.trim_start_matches(':').trim().to_string(),
                    None => why,
                };
                tried.push((url, why));
                if let Some(leader) = leader.filter(|_| !followed) {
                    followed = true;
                    queue.push_front(leader);
                }
            }
        }
    }
    Err(NoLeader { tried })
}

/// Builds the lazy channel of one URL (with the caller's timeouts).
pub type MakeChannel = dyn Fn(&str) -> Result<Channel, ClientError> + Send + Sync;

/// A lazily connected channel over several coordinator URLs. Each call goes
/// to the current URL; a call answered by a standby moves the channel to the
/// leader it names, a call that found no coordinator moves it to the next
/// URL. The failed call itself is not repeated (its body is gone): callers
/// retry as they would after any failure.
#[derive(Clone)]
pub struct Failover {
    state: Arc<Mutex<State>>,
    make: Arc<MakeChannel>,
}

struct State {
    urls: Vec<String>,
    channels: Vec<Option<Channel>>,
    current: usize,
}

impl std::fmt::Debug for Failover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("Failover")
            .field("urls", &s.urls)
            .field("current", &s.current)
            .finish()
    }
}

impl Failover {
    /// Checks every URL up front (a malformed one fails here); connects to none.
    pub fn new(
        urls: &[String],
        make: impl Fn(&str) -> Result<Channel, ClientError> + Send + Sync + 'static,
    ) -> Result<Failover, ClientError> {
        if urls.is_empty() {
            return Err(ClientError::BadUrl {
                url: String::new(),
                reason: "no coordinator URL given".into(),
            });
        }
        let channels = urls
            .iter()
            .map(|u| make(u).map(Some))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Failover {
            state: Arc::new(Mutex::new(State {
                urls: urls.to_vec(),
                channels,
                current: 0,
            })),
            make: Arc::new(make),
        })
    }

    /// The URL calls go to now.
    pub fn url(&self) -> String {
        let s = self.lock();
        s.urls[s.current].clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn current(&self) -> (usize, Channel) {
        let mut s = self.lock();
        let i = s.current;
        if s.channels[i].is_none() {
            s.channels[i] = (self.make)(&s.urls[i]).ok();
        }
        match s.channels[i].clone() {
            Some(c) => (i, c),
            // Only a leader URL we were told can fail to build; forget it.
            None => {
                s.current = 0;
                (0, s.channels[0].clone().expect("checked in new"))
            }
        }
    }

    /// After a failed call on `from`: go to `leader` (a standby named it) or
    /// to the next URL. Calls that failed on an earlier URL change nothing.
    fn move_on(&self, from: usize, leader: Option<String>) {
        let mut s = self.lock();
        if s.current != from {
            return;
        }
        let next = match leader {
            Some(l) => match s.urls.iter().position(|u| *u == l) {
                Some(i) => i,
                None => {
                    s.urls.push(l);
                    s.channels.push(None);
                    s.urls.len() - 1
                }
            },
            None => (from + 1) % s.urls.len(),
        };
        if next != from {
            tracing::info!(from = %s.urls[from], to = %s.urls[next], "coordinator failover");
        }
        s.current = next;
    }
}

/// A trailers-only `UNAVAILABLE` answer (a standby's): the leader it names, if any.
fn standby_answer(headers: &http::HeaderMap) -> Option<Option<String>> {
    if headers.get("grpc-status")?.as_bytes() != b"14" {
        return None;
    }
    Some(
        headers
            .get(LEADER_METADATA)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty()),
    )
}

impl Service<http::Request<Body>> for Failover {
    type Response = http::Response<Body>;
    type Error = StdError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, StdError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), StdError>> {
        // Readiness is the chosen channel's, awaited in `call`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let (index, mut channel) = self.current();
        let me = self.clone();
        Box::pin(async move {
            std::future::poll_fn(|cx| channel.poll_ready(cx)).await?;
            match channel.call(req).await {
                Ok(resp) => {
                    if let Some(leader) = standby_answer(resp.headers()) {
                        me.move_on(index, leader);
                    }
                    Ok(resp)
                }
                Err(e) => {
                    me.move_on(index, None);
                    Err(e)
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_lists_split_trim_and_drop_repeats() {
        assert_eq!(
            split_urls(" http://a:1, http://b:2,,http://a:1 "),
            vec!["http://a:1".to_string(), "http://b:2".to_string()]
        );
        assert!(split_urls(" , ").is_empty());
    }

    #[test]
    fn a_standby_status_names_the_leader_in_text_and_metadata() {
        let s = standby_status(Some("http://10.0.0.1:7070"));
        assert_eq!(s.code(), Code::Unavailable);
        assert_eq!(
            s.message(),
            "standby; the leader is http://10.0.0.1:7070; retry there"
        );
        assert_eq!(leader_of(&s).as_deref(), Some("http://10.0.0.1:7070"));
        let headers = s.into_http::<()>().headers().clone();
        assert_eq!(
            standby_answer(&headers),
            Some(Some("http://10.0.0.1:7070".to_string()))
        );

        let none = standby_status(None);
        assert_eq!(none.code(), Code::Unavailable);
        assert_eq!(leader_of(&none), None);
        // Other codes are never read as a pointer to a leader.
        let mut other = Status::internal("x");
        other
            .metadata_mut()
            .insert(LEADER_METADATA, MetadataValue::from_static("http://x:1"));
        assert_eq!(leader_of(&other), None);
    }

    #[tokio::test]
    async fn no_leader_names_every_url_and_why() {
        let dead = |_: ()| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        };
        let urls = vec![dead(()), dead(()), "not a url".to_string()];
        let err = find_leader(&urls, crate::client::builder)
            .await
            .unwrap_err();
        assert_eq!(err.tried.len(), 3, "{err}");
        assert_eq!(err.urls(), urls.join(", "));
        let text = err.to_string();
        assert!(text.contains(&format!("{}: ", urls[0])), "{text}");
        assert!(text.contains("refused"), "{text}");
        assert!(!err.all_bad_urls());
    }

    #[tokio::test]
    async fn failover_moves_to_the_next_url_after_a_refused_call() {
        let dead = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        };
        let other = "http://127.0.0.1:9".to_string();
        let mut f = Failover::new(&[dead.clone(), other.clone()], |u| {
            crate::client::builder(u).connect_lazy()
        })
        .unwrap();
        assert_eq!(f.url(), dead);
        let mut grpc = tonic::client::Grpc::new(f.clone());
        grpc.ready().await.unwrap();
        let codec = tonic_prost::ProstCodec::<(), ()>::default();
        let path = http::uri::PathAndQuery::from_static(PROBE_PATH);
        let status = grpc
            .unary(tonic::Request::new(()), path, codec)
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert_eq!(f.url(), other);
        assert!(std::future::poll_fn(|cx| f.poll_ready(cx)).await.is_ok());
    }

    /// A server on a free loopback port answering every call like a standby
    /// naming `leader` (or, with `None`, like a leader: UNIMPLEMENTED).
    async fn server(standby_for: Option<String>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let answer = move |req: tonic::Request<()>| match &standby_for {
            Some(l) => Err(standby_status(Some(l))),
            None => Ok(req),
        };
        let serve = crate::server::builder()
            .layer(tonic::service::InterceptorLayer::new(answer))
            .add_routes(tonic::service::Routes::default())
            .serve_with_incoming(crate::server::incoming(listener));
        tokio::spawn(serve);
        url
    }

    async fn ask(f: &Failover) -> Status {
        let mut grpc = tonic::client::Grpc::new(f.clone());
        grpc.ready().await.unwrap();
        let codec = tonic_prost::ProstCodec::<(), ()>::default();
        let path = http::uri::PathAndQuery::from_static(PROBE_PATH);
        grpc.unary(tonic::Request::new(()), path, codec)
            .await
            .unwrap_err()
    }

    #[tokio::test]
    async fn a_standby_sends_clients_to_the_leader_it_names() {
        let leader = server(None).await;
        let standby = server(Some(leader.clone())).await;

        // Connecting up front: the standby's pointer is followed.
        let ch = find_leader(std::slice::from_ref(&standby), crate::client::builder)
            .await
            .unwrap();
        assert_eq!(ch.url(), leader);

        // Lazily: the call the standby refused fails; the next goes to the leader.
        let f = Failover::new(std::slice::from_ref(&standby), |u| {
            crate::client::builder(u).connect_lazy()
        })
        .unwrap();
        let refused = ask(&f).await;
        assert_eq!(leader_of(&refused).as_deref(), Some(leader.as_str()));
        assert_eq!(f.url(), leader);
        assert_eq!(ask(&f).await.code(), Code::Unimplemented);
    }
}

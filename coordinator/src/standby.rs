//! A coordinator that does not lead (`--store etcd`, another holds the
//! leader key) still answers on its port: every call of every service gets
//! `UNAVAILABLE` at once, naming the leader's URL in the text and in the
//! `gpuctl-leader` metadata (gpuctl_core::leader), so clients given several
//! URLs go to the leader instead of hanging on a silent socket.
//!
//! The standby server and, later, the real one accept on the same bound
//! listener: on taking the lead the standby answers that this coordinator
//! is loading its state until the real services are ready, then stops
//! accepting (the port is never released), tells its open connections to
//! go away (HTTP/2 GOAWAY, clients reconnect), and the real services accept
//! from then on.

use std::sync::Arc;
use std::time::Duration;

use gpuctl_core::conn::Limits;
use gpuctl_core::leader::standby_status;
use gpuctl_core::server::ServerTls;
use gpuctl_core::shutdown::Shutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::Stream;
use tracing::{info, warn};

use crate::store::etcd::{EtcdStore, LEADER_TTL};
use crate::store::Store;

/// How long the standby's open connections get to take their answers and go.
const DRAIN: Duration = Duration::from_secs(3);

/// The accepted connections of a shared listener under `limits` (taken as
/// gpuctl_core::server::incoming_limited takes them, waiting out a want of
/// descriptors), until `stop` trips: then the stream ends and accepts
/// nothing more, so that another server can take the listener.
pub fn incoming(
    listener: Arc<TcpListener>,
    stop: Shutdown,
    limits: Limits,
) -> impl Stream<Item = std::io::Result<gpuctl_core::server::Conn>> {
    futures::StreamExt::take_until(
        gpuctl_core::server::incoming_limited(listener, limits),
        stop.cancelled_owned(),
    )
}

/// [`incoming`] over TLS (gpuctl_core::server::incoming_tls).
pub fn incoming_tls(
    listener: Arc<TcpListener>,
    stop: Shutdown,
    limits: Limits,
    tls: ServerTls,
) -> impl Stream<Item = std::io::Result<gpuctl_core::server::TlsConn>> {
    futures::StreamExt::take_until(
        gpuctl_core::server::incoming_tls(listener, limits, tls),
        stop.cancelled_owned(),
    )
}

/// The leader's URL in the leader key's value: its first word, when that is
/// a URL (a leader of an older gpuctl stored only its host and pid).
pub fn leader_url(value: &str) -> Option<String> {
    let first = value.split_whitespace().next()?;
    (first.starts_with("http://") || first.starts_with("https://")).then(|| first.to_string())
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".into())
}

/// What the leader key holds for this coordinator: the URL clients should
/// use (`--advertise-url`, else the listen address, else the host name and
/// port for a wildcard address), then, for people reading the key, the host
/// and pid.
pub fn leader_value(advertise: Option<&str>, addr: std::net::SocketAddr) -> String {
    let url = match advertise {
        Some(u) => u.to_string(),
        None => format!("http://{}:{}", host_name(), addr.port()),
    };
    format!("{url} ({} pid {})", host_name(), std::process::id())
}

/// The standby server, answering until [`Standby::stop`] (or dropped).
pub struct Standby {
    leader: Arc<watch::Sender<Answer>>,
    stop: Shutdown,
    task: Option<JoinHandle<()>>,
}

/// What the standby answers every call with.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    /// Standing by: the leader's URL, as the leader key names it.
    Follow(Option<String>),
    /// This coordinator leads and loads the stored state: the real services
    /// are moments away.
    TakingOver,
}

impl Answer {
    fn status(&self) -> tonic::Status {
        match self {
            Answer::Follow(leader) => standby_status(leader.as_deref()),
            Answer::TakingOver => tonic::Status::unavailable(
                "this coordinator leads now and is loading the stored state; retry shortly",
            ),
        }
    }
}

impl Standby {
    /// Starts answering on `listener` (a clone of the one the real server
    /// takes later), its connections under `limits`.
    pub fn serve(listener: Arc<TcpListener>, limits: Limits) -> Standby {
        let (tx, rx) = watch::channel(Answer::Follow(None));
        let stop = Shutdown::new();
        let answer = move |_req: tonic::Request<()>| -> Result<tonic::Request<()>, tonic::Status> {
            Err(rx.borrow().status())
        };
        let server = gpuctl_core::server::builder()
            .layer(tonic::service::InterceptorLayer::new(answer))
            .add_routes(tonic::service::Routes::default())
            .serve_with_incoming_shutdown(
                incoming(listener, stop.clone(), limits),
                stop.clone().cancelled_owned(),
            );
        let task = tokio::spawn(async move {
            if let Err(e) = server.await {
                warn!("standby server: {e}");
            }
        });
        Standby {
            leader: Arc::new(tx),
            stop,
            task: Some(task),
        }
    }

    /// This coordinator leads: until [`Standby::stop`], calls are told it is
    /// loading the stored state. The standby answers through the load so
    /// that agents reconnecting meanwhile are answered at once: with no one
    /// accepting, 16,384 of them overflowed the listen queue, and each
    /// dropped handshake cost its agent seconds (issue 51).
    pub fn taking_over(&self) {
        self.leader.send_replace(Answer::TakingOver);
    }

    /// Follows the leader key's value as the etcd store reads it while
    /// standing by. Ends with `holder`'s sender (the store).
    fn follow(&self, mut holder: watch::Receiver<Option<String>>) -> JoinHandle<()> {
        let leader = self.leader.clone();
        tokio::spawn(async move {
            while holder.changed().await.is_ok() {
                let url = holder.borrow_and_update().as_deref().and_then(leader_url);
                let answer = Answer::Follow(url);
                leader.send_if_modified(|cur| {
                    let changed = *cur != answer && *cur != Answer::TakingOver;
                    if changed {
                        *cur = answer;
                    }
                    changed
                });
            }
        })
    }

    /// Stops accepting at once; the open connections are drained in the
    /// background (GOAWAY, at most [`DRAIN`]).
    pub fn stop(mut self) {
        self.stop.cancel();
        if let Some(mut task) = self.task.take() {
            tokio::spawn(async move {
                if tokio::time::timeout(DRAIN, &mut task).await.is_err() {
                    task.abort();
                }
            });
        }
    }
}

impl Drop for Standby {
    /// A coordinator that fails to start after leading (its state cannot
    /// be loaded) leaves no standby answering behind it.
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// What `--store etcd` opens: connects, then leads, standing by meanwhile
/// with `standby` answering. `value` goes into the leader key
/// ([`leader_value`]). `None` when `shutdown` came while standing by;
/// otherwise the store and a child of `shutdown` that also trips when the
/// leadership is lost.
pub async fn open_leader(
    endpoints: Option<&str>,
    prefix: &str,
    access: &crate::store::etcd_access::EtcdAccess,
    value: &str,
    standby: &Standby,
    shutdown: Shutdown,
) -> anyhow::Result<Option<(Arc<dyn Store>, Shutdown)>> {
    let endpoints = endpoints.ok_or_else(|| {
        anyhow::anyhow!(
            "--store etcd needs --etcd URL (e.g. --etcd http://127.0.0.1:2379), or use --store embedded"
        )
    })?;
    let store = Arc::new(EtcdStore::connect_with(endpoints, prefix, access).await?);
    info!(etcd = %endpoints, prefix = %store.prefix(), "state in etcd");
    let follower = standby.follow(store.holder());
    let led = store.lead(value, LEADER_TTL, shutdown).await;
    follower.abort();
    match led? {
        Some(stop) => Ok(Some((store, stop))),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_leader_url_is_the_first_word_of_the_key() {
        let addr: std::net::SocketAddr = "0.0.0.0:7070".parse().unwrap();
        let v = leader_value(Some("http://10.0.0.1:7070"), addr);
        assert!(v.starts_with("http://10.0.0.1:7070 ("), "{v}");
        assert_eq!(leader_url(&v).as_deref(), Some("http://10.0.0.1:7070"));
        // A wildcard listen address: the host name, which peers can resolve.
        let v = leader_value(None, addr);
        assert_eq!(leader_url(&v), Some(format!("http://{}:7070", host_name())));
        assert_eq!(
            leader_url("https://c.example:7070").as_deref(),
            Some("https://c.example:7070")
        );
        // An older leader's value, and a key gone meanwhile.
        assert_eq!(leader_url("host-a pid 12 listening on 0.0.0.0:7070"), None);
        assert_eq!(leader_url("(gone)"), None);
    }

    /// What a client's probe (gpuctl_core::leader) hears from `standby`.
    async fn heard(addr: std::net::SocketAddr) -> (String, Option<String>) {
        let channel = gpuctl_core::client::builder(&format!("http://{addr}"))
            .connect()
            .await
            .unwrap();
        gpuctl_core::leader::probe(&channel).await.unwrap_err()
    }

    #[tokio::test]
    async fn taking_over_is_answered_at_once_and_outlasts_the_old_leaders_key() {
        let listener = Arc::new(gpuctl_core::listen::bind("127.0.0.1:0".parse().unwrap()).unwrap());
        let addr = listener.local_addr().unwrap();
        let standby = Standby::serve(listener, Limits::unlimited());
        let (key, holder) = watch::channel(None);
        let follower = standby.follow(holder);
        key.send_replace(Some("http://10.0.0.9:7070 (a pid 1)".into()));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (_, leader) = heard(addr).await;
        assert_eq!(leader.as_deref(), Some("http://10.0.0.9:7070"));

        standby.taking_over();
        let (why, leader) = heard(addr).await;
        assert!(why.contains("loading the stored state"), "{why}");
        assert_eq!(leader, None, "no pointer to follow: this one leads");
        // The old leader's key, read late, does not send clients back to it.
        key.send_replace(Some("http://10.0.0.9:7070 (a pid 1)".into()));
        key.send_replace(Some("http://10.0.0.8:7070 (b pid 2)".into()));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (why, leader) = heard(addr).await;
        assert!(
            why.contains("loading the stored state") && leader.is_none(),
            "{why}"
        );
        follower.abort();
        standby.stop();
    }
}

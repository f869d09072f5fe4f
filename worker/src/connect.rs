//! How a worker reaches its coordinator: a current-thread runtime and a
//! failover channel carrying the rank's secret. Apart from `client.rs`
//! because the progress thread opens its own connection the same way, and
//! the progress reports must not depend on the rendezvous client.

use std::time::Duration;

use anyhow::{Context, Result};
use gpuctl_core::leader::Failover;
use tokio::runtime::Runtime;

/// A unary call's answer; the channel fails the call after this.
pub(crate) const RPC_TIMEOUT: Duration = Duration::from_secs(20);

pub(crate) fn runtime() -> Result<Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")
}

/// Connects on the first call, so a coordinator that restarts meanwhile is
/// found again; calls that get no answer in time fail naming the URL. Over
/// `url` and every URL in `GPUCTL_COORDINATOR_URLS` (the agent's list: a
/// leader and its standbys): a call that meets a standby or no coordinator
/// moves the channel to the leader or the next URL, where callers' retries go.
/// Every call carries this rank's secret (from the agent, in
/// `GPUCTL_RANK_SECRET`): the coordinator takes results and rendezvous
/// writes only from the job's own workers. TLS comes from `GPUCTL_TLS_CA`.
pub(crate) fn channel(url: &str) -> Result<Failover> {
    let mut urls = gpuctl_core::leader::split_urls(url);
    if let Ok(more) = std::env::var("GPUCTL_COORDINATOR_URLS") {
        for u in gpuctl_core::leader::split_urls(&more) {
            if !urls.contains(&u) {
                urls.push(u);
            }
        }
    }
    let secret = std::env::var(gpuctl_core::auth::RANK_SECRET_ENV).ok();
    Ok(Failover::new(&urls, move |u| {
        let mut builder = gpuctl_core::client::builder(u)
            .connect_timeout(Duration::from_secs(10))
            .request_timeout(RPC_TIMEOUT);
        if let Some(secret) = &secret {
            builder = builder.header(gpuctl_core::auth::RANK_SECRET, secret.clone());
        }
        builder.connect_lazy()
    })?)
}

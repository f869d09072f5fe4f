//! The coordinator process the bench measures: started with an embedded
//! store in a folder of its own and killed when dropped, and the times its
//! log says reports took to be stored. Apart from the run because starting,
//! reading and ending a process is not what the bench measures.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context, Result};
use gpuctl_proto::pb::job_service_client::JobServiceClient;

/// The coordinator process; killed when dropped.
pub(super) struct Coordinator {
    child: Child,
    pub(super) url: String,
    /// Its `/metrics` address.
    pub(super) metrics: String,
    pub(super) dir: PathBuf,
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Coordinator {
    pub(super) fn start(bin: &PathBuf, log: &str, dir: PathBuf) -> Result<Coordinator> {
        let log_file = std::fs::File::create(dir.join("coordinator.log"))?;
        // A free port, found by binding it: the coordinator prints only its
        // gRPC address.
        let metrics = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free port for the coordinator's /metrics")?
            .to_string();
        let mut child = Command::new(bin)
            .args(["--listen", "127.0.0.1:0", "--node-timeout", "60s"])
            .args(["--metrics-listen", &metrics])
            // The simulated fleet shares this host's one address: with
            // --rank-connections rank, 32,768 connections.
            .args(["--max-connections-per-peer", "10000000"])
            .arg("--data-dir")
            .arg(dir.join("store"))
            .env("RUST_LOG", log)
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut line)
            .context("reading the coordinator's first line")?;
        let Some(url) = line.trim().strip_prefix("listening on ") else {
            bail!(
                "the coordinator printed `{}`, not `listening on URL`",
                line.trim()
            );
        };
        Ok(Coordinator {
            url: url.to_string(),
            metrics,
            child,
            dir,
        })
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A client of its JobService for the run's own calls (submit, poll,
    /// report), each allowed `timeout`, taking answers as big as a whole
    /// report of 131,072 ranks.
    pub(super) async fn jobs(
        &self,
        timeout: std::time::Duration,
    ) -> Result<JobServiceClient<gpuctl_core::client::Channel>> {
        let builder = gpuctl_core::client::builder(&self.url).request_timeout(timeout);
        Ok(JobServiceClient::new(builder.connect().await?).max_decoding_message_size(256 << 20))
    }
}

/// Each job's "report stored" line in the coordinator's log: ms from the
/// job's end as the coordinator saw it to its report committed.
pub(super) fn stored_ms(log: &std::path::Path) -> BTreeMap<String, f64> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter(|l| l.contains("report stored"))
        .filter_map(|l| {
            let field = |name: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(name))
                    .map(str::to_string)
            };
            Some((field("job=")?, field("ms=")?.parse().ok()?))
        })
        .collect()
}

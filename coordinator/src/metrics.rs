//! The coordinator's `/metrics`: the fleet and job counts and the ingest
//! counters, on `--metrics-listen`, through the shared endpoint
//! ([`gpuctl_proto::metrics_http`]). Values come from the scheduler task at
//! scrape time (one event), so the numbers are one consistent snapshot.

use std::collections::BTreeMap;

use gpuctl_proto::metrics_http::{self, write_family, Labels};
use gpuctl_proto::shutdown::Shutdown;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tracing::debug;

use crate::scheduler::{Event, SchedulerHandle, Snapshot};

const NODE_STATES: &[&str] = &["ready", "busy", "lost"];
const JOB_STATES: &[&str] = &["pending", "running", "succeeded", "failed", "cancelled"];

/// One series per state: the known ones first, zero or not, so that
/// dashboards and alerts always see a value; then any other.
fn by_state(all: &[&'static str], counts: &BTreeMap<&'static str, u64>) -> Vec<(Labels, f64)> {
    let known = all.iter().map(|s| (*s, *counts.get(s).unwrap_or(&0)));
    let other = counts
        .iter()
        .filter(|(s, _)| !all.contains(s))
        .map(|(s, n)| (*s, *n));
    known
        .chain(other)
        .map(|(s, n)| (vec![("state", s.to_string())], n as f64))
        .collect()
}

impl Collector for Snapshot {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let gauge = MetricType::Gauge;
        write_family(
            &mut e,
            "gpuctl_nodes",
            "Registered nodes by state.",
            gauge,
            &by_state(NODE_STATES, &self.nodes),
        )?;
        write_family(
            &mut e,
            "gpuctl_jobs",
            "Jobs by state.",
            gauge,
            &by_state(JOB_STATES, &self.jobs),
        )?;
        for (name, help, v) in [
            (
                "gpuctl_jobs_submitted_total",
                "Jobs accepted by Submit since the coordinator started.",
                self.submitted,
            ),
            (
                "gpuctl_results_ingested_total",
                "Rank results stored since the coordinator started.",
                self.results,
            ),
            (
                "gpuctl_telemetry_samples_ingested_total",
                "GPU telemetry samples taken into running jobs since the coordinator started.",
                self.samples,
            ),
            (
                "gpuctl_worker_logs_lines_total",
                "Worker log lines received since the coordinator started.",
                self.log_lines,
            ),
        ] {
            write_family(
                &mut e,
                name,
                help,
                MetricType::Counter,
                &[(vec![], v as f64)],
            )?;
        }
        write_family(
            &mut e,
            "gpuctl_rendezvous_keys",
            "Rendezvous keys held for running jobs.",
            gauge,
            &[(vec![], self.rendezvous_keys as f64)],
        )
    }
}

impl Snapshot {
    pub fn registry(self) -> Registry {
        let mut r = Registry::default();
        r.register_collector(Box::new(self));
        r
    }
}

/// Serves `/metrics` on `listener` until `shutdown`.
pub async fn serve(listener: TcpListener, sched: SchedulerHandle, shutdown: Shutdown) {
    let scrape = move || {
        let sched = sched.clone();
        async move {
            match sched.ask(|reply| Event::Metrics { reply }).await {
                Ok(snap) => Ok(snap.registry()),
                Err(_) => Err("coordinator stopping".to_string()),
            }
        }
    };
    if let Err(e) = metrics_http::serve(listener, scrape, shutdown).await {
        debug!("metrics server: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_has_help_type_and_zero_states() {
        let mut s = Snapshot {
            submitted: 3,
            rendezvous_keys: 2,
            ..Default::default()
        };
        s.nodes.insert("ready", 2);
        s.jobs.insert("failed", 1);
        let t = metrics_http::encode(&s.registry());
        for line in [
            "gpuctl_nodes{state=\"ready\"} 2",
            "gpuctl_nodes{state=\"lost\"} 0",
            "gpuctl_jobs{state=\"failed\"} 1",
            "gpuctl_jobs{state=\"running\"} 0",
            "gpuctl_jobs_submitted_total 3",
            "gpuctl_results_ingested_total 0",
            "gpuctl_telemetry_samples_ingested_total 0",
            "gpuctl_worker_logs_lines_total 0",
            "gpuctl_rendezvous_keys 2",
            // OpenMetrics (prometheus-client) names a counter family without `_total`.
            "# TYPE gpuctl_jobs_submitted counter",
            "# TYPE gpuctl_nodes gauge",
        ] {
            assert!(t.lines().any(|l| l == line), "missing `{line}` in\n{t}");
        }
    }
}

//! The coordinator's `/metrics`: the fleet and job counts, the ingest
//! counters, and each node's last verdict and figures from the fleet history
//! (so Grafana charts fleet health), on `--metrics-listen`, through the shared
//! endpoint ([`gpuctl_core::metrics_http`]). Counts come from the scheduler
//! task at scrape time (one event), so they are one consistent snapshot.
//! The allocator's own figures say whether a rise in the process's memory is
//! live objects or memory the allocator holds.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpuctl_core::metrics_http::{self, write_family, Labels};
use gpuctl_core::shutdown::Shutdown;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tracing::debug;

use gpuctl_proto::pb::{FleetRow, GpuRow, Verdict};

use crate::fleet_view::FleetView;
use crate::scheduler::{Query, SchedulerHandle, Snapshot};

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
            "gpuctl_node_state",
            "Each registered node's state: 1 for the state it is in, 0 for the others (ready, busy, lost).",
            gauge,
            &node_states(&self.node_states),
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
                "gpuctl_jobs_deleted_total",
                "Ended jobs deleted from the store past --keep-jobs or --keep-jobs-bytes since the coordinator started.",
                self.jobs_deleted,
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
        for (name, help, v) in [
            (
                "gpuctl_rendezvous_keys",
                "Rendezvous keys held for running jobs.",
                self.rendezvous_keys,
            ),
            (
                "gpuctl_jobs_stored_bytes",
                "Bytes the ended jobs kept hold in the store (records, results, reports, logs, telemetry), each measured once its end is written; --keep-jobs-bytes bounds it.",
                self.jobs_stored_bytes,
            ),
            (
                "gpuctl_jobs_held_ranks",
                "Per-rank entries (placements, progress, results, exits, hang clocks) the coordinator holds in memory over all its jobs: the running jobs' and those of the few newest ended jobs it keeps whole.",
                self.held_ranks,
            ),
        ] {
            write_family(&mut e, name, help, gauge, &[(vec![], v as f64)])?;
        }
        let refused: Vec<(Labels, f64)> = self
            .refused
            .iter()
            .map(|(kind, n)| (vec![("kind", kind.to_string())], *n as f64))
            .collect();
        write_family(
            &mut e,
            "gpuctl_refused_messages_total",
            "Messages refused since the coordinator started because their sender may not say them (a node speaking for a rank it does not hold, a rendezvous key another rank owns, a result whose device disagrees with the plan), by kind.",
            MetricType::Counter,
            &refused,
        )?;
        results(&mut e, &self.fleet)
    }
}

/// Every node with each known state, 1 for its own: a node going lost flips
/// a value rather than starting a series, so alerts see the change at once.
fn node_states(nodes: &[(String, &'static str)]) -> Vec<(Labels, f64)> {
    let mut out = Vec::new();
    for (node, state) in nodes {
        let all = NODE_STATES.iter().copied();
        let extra = (!NODE_STATES.contains(state)).then_some(*state);
        for s in all.chain(extra) {
            out.push((
                vec![("node", node.clone()), ("state", s.to_string())],
                f64::from(u8::from(s == *state)),
            ));
        }
    }
    out
}

/// A verdict as a number an alert can compare: higher is worse.
fn verdict_value(v: Verdict) -> f64 {
    match v {
        Verdict::Pass => 0.0,
        Verdict::Warn => 1.0,
        Verdict::Fail => 2.0,
        Verdict::Incomplete | Verdict::Unspecified => 3.0,
    }
}

/// Per node: the last verdict, and each figure its last run of that kind
/// produced (a node that never ran a workload has no series for it, not 0).
fn results(e: &mut DescriptorEncoder, rows: &[FleetRow]) -> std::fmt::Result {
    let node = |r: &FleetRow| vec![("node", r.node.clone())];
    let figure = |f: fn(&FleetRow) -> f64| -> Vec<(Labels, f64)> {
        rows.iter()
            .filter(|r| f(r) > 0.0)
            .map(|r| (node(r), f(r)))
            .collect()
    };
    let gauge = MetricType::Gauge;
    write_family(
        e,
        "gpuctl_node_verdict",
        "Each node's verdict in its last finished job: 0 pass, 1 warn, 2 fail, 3 incomplete.",
        gauge,
        &rows
            .iter()
            .map(|r| (node(r), verdict_value(r.last_verdict())))
            .collect::<Vec<_>>(),
    )?;
    let mut tflops = Vec::new();
    for r in rows {
        for (stat, v) in [
            ("median", r.stress_tflops_median),
            ("worst", r.stress_tflops_worst),
        ] {
            if v > 0.0 {
                tflops.push((vec![("node", r.node.clone()), ("gpu", stat.to_string())], v));
            }
        }
    }
    write_family(
        e,
        "gpuctl_node_stress_tflops",
        "TFLOP/s in the node's last stress job: its median GPU's and its slowest GPU's median.",
        gauge,
        &tflops,
    )?;
    write_family(
        e,
        "gpuctl_node_all_reduce_busbw_gbps",
        "all_reduce bus bandwidth (GB/s) in the node's last nccl job, at its largest judged size.",
        gauge,
        &figure(|r| r.all_reduce_busbw_gbps),
    )?;
    write_family(
        e,
        "gpuctl_node_link_median_gbps",
        "The median bandwidth (GB/s) of the node's links in its last `nccl --pattern pairs` job.",
        gauge,
        &figure(|r| r.median_link_gbps),
    )?;
    write_family(
        e,
        "gpuctl_node_samples_per_second",
        "Training samples/s in the node's last ddp or fsdp job.",
        gauge,
        &figure(|r| r.samples_per_s),
    )?;
    write_family(
        e,
        "gpuctl_node_last_run_timestamp_seconds",
        "When the node's last finished job ended (Unix seconds).",
        gauge,
        &rows
            .iter()
            .filter(|r| r.last_unix_ms > 0)
            .map(|r| (node(r), r.last_unix_ms as f64 / 1000.0))
            .collect::<Vec<_>>(),
    )?;
    // The acceptance suite's level is a label: a handful of names, and an
    // operator's alert reads "failed quick acceptance" differently from
    // "failed full acceptance".
    write_family(
        e,
        "gpuctl_node_acceptance_verdict",
        "Each node's verdict in its last acceptance suite (`gpuctl accept`): 0 pass, 1 warn, 2 fail, 3 incomplete.",
        gauge,
        &rows
            .iter()
            .filter_map(|r| r.acceptance.as_ref())
            .map(|a| {
                (
                    vec![("node", a.node.clone()), ("level", a.level.clone())],
                    verdict_value(a.verdict()),
                )
            })
            .collect::<Vec<_>>(),
    )?;
    write_family(
        e,
        "gpuctl_node_acceptance_timestamp_seconds",
        "When the node's last acceptance suite finished (Unix seconds).",
        gauge,
        &rows
            .iter()
            .filter_map(|r| r.acceptance.as_ref())
            .filter(|a| a.finished_unix_ms > 0)
            .map(|a| {
                (
                    vec![("node", a.node.clone())],
                    a.finished_unix_ms as f64 / 1000.0,
                )
            })
            .collect::<Vec<_>>(),
    )?;
    let gpu = |r: &FleetRow, g: &GpuRow| vec![("node", r.node.clone()), ("gpu", g.gpu.clone())];
    write_family(
        e,
        "gpuctl_gpu_stress_tflops",
        "Each GPU's median TFLOP/s in the node's last stress job (gpu: NVML index, or cpuN for a CPU rank).",
        gauge,
        &rows
            .iter()
            .flat_map(|r| r.gpus.iter().map(move |g| (r, g)))
            .filter(|(_, g)| g.stress_tflops > 0.0)
            .map(|(r, g)| (gpu(r, g), g.stress_tflops))
            .collect::<Vec<_>>(),
    )?;
    write_family(
        e,
        "gpuctl_gpu_below_floor",
        "Each GPU's figures that failed their floor (the rules' minimum for its model) in the node's last job of each workload.",
        gauge,
        &rows
            .iter()
            .flat_map(|r| r.gpus.iter().map(move |g| (r, g)))
            .map(|(r, g)| (gpu(r, g), f64::from(g.below_floor)))
            .collect::<Vec<_>>(),
    )?;
    write_family(
        e,
        "gpuctl_node_drifted_figures",
        "Figures of the node's last run below the drift tolerance of its own history.",
        gauge,
        &rows
            .iter()
            .map(|r| (node(r), r.drift.iter().filter(|d| d.flagged).count() as f64))
            .collect::<Vec<_>>(),
    )
}

/// jemalloc's figures (the coordinator binary's allocator): bytes in live
/// allocations against bytes it holds in resident pages. Allocated flat while
/// the process grows is the allocator keeping pages, not the coordinator
/// keeping objects. A process on another allocator (the in-process tests)
/// reads jemalloc's own, near-empty figures.
#[derive(Debug)]
struct Heap;

impl Collector for Heap {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        use tikv_jemalloc_ctl::{epoch, stats};
        // The figures are cached until the epoch moves on.
        let figures = epoch::advance()
            .and_then(|_| Ok((stats::allocated::read()?, stats::resident::read()?)));
        let Ok((allocated, resident)) = figures else {
            debug!("metrics: the allocator's figures are unreadable");
            return Ok(());
        };
        write_family(
            &mut e,
            "gpuctl_coordinator_heap_bytes",
            "The allocator's bytes: in live allocations (allocated) and in resident pages it holds (resident).",
            MetricType::Gauge,
            &[
                (vec![("kind", "allocated".to_string())], allocated as f64),
                (vec![("kind", "resident".to_string())], resident as f64),
            ],
        )
    }
}

impl Snapshot {
    pub fn registry(self) -> Registry {
        let mut r = Registry::default();
        r.register_collector(Box::new(self));
        r.register_collector(Box::new(Heap));
        r
    }
}

/// Serves `/metrics` on `listener` until `shutdown`; each node's row comes
/// from `fleet`, the answer `gpuctl fleet` is cut from.
pub async fn serve(
    listener: TcpListener,
    sched: SchedulerHandle,
    fleet: FleetView,
    shutdown: Shutdown,
    tls: Option<gpuctl_core::metrics_tls::TlsConfig>,
) {
    let scrape = move || {
        let (sched, fleet) = (sched.clone(), fleet.clone());
        async move {
            let mut snap = match sched.ask(|reply| Query::Metrics { reply }).await {
                Ok(snap) => snap,
                Err(_) => return Err("coordinator stopping".to_string()),
            };
            snap.fleet = match fleet.current().await {
                Ok(built) => built.rows.clone(),
                // The history unreadable costs the result series, not the scrape.
                Err(e) => {
                    debug!("metrics: fleet history unreadable: {e}");
                    Arc::new(Vec::new())
                }
            };
            Ok(snap.registry())
        }
    };
    if let Err(e) = metrics_http::serve(listener, scrape, shutdown, tls).await {
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

    #[test]
    fn each_node_has_its_last_verdict_and_only_the_figures_it_produced() {
        let s = Snapshot {
            fleet: Arc::new(vec![
                FleetRow {
                    node: "a".into(),
                    last_verdict: Verdict::Fail as i32,
                    stress_tflops_median: 600.0,
                    stress_tflops_worst: 300.0,
                    drift: vec![gpuctl_proto::pb::Drift {
                        flagged: true,
                        ..Default::default()
                    }],
                    ..Default::default()
                },
                FleetRow {
                    node: "b".into(),
                    last_verdict: Verdict::Pass as i32,
                    all_reduce_busbw_gbps: 330.5,
                    ..Default::default()
                },
            ]),
            ..Default::default()
        };
        let t = metrics_http::encode(&s.registry());
        for line in [
            "gpuctl_node_verdict{node=\"a\"} 2",
            "gpuctl_node_verdict{node=\"b\"} 0",
            "gpuctl_node_stress_tflops{node=\"a\",gpu=\"worst\"} 300",
            "gpuctl_node_all_reduce_busbw_gbps{node=\"b\"} 330.5",
            "gpuctl_node_drifted_figures{node=\"a\"} 1",
        ] {
            assert!(t.lines().any(|l| l == line), "missing `{line}` in\n{t}");
        }
        assert!(!t.contains("gpuctl_node_stress_tflops{node=\"b\""), "{t}");
    }

    #[test]
    fn node_states_acceptance_and_gpus_have_their_series() {
        let s = Snapshot {
            node_states: vec![("a".into(), "lost"), ("b".into(), "ready")],
            fleet: Arc::new(vec![FleetRow {
                node: "a".into(),
                last_unix_ms: 1_700_000_000_500,
                acceptance: Some(gpuctl_proto::pb::Acceptance {
                    node: "a".into(),
                    level: "quick".into(),
                    verdict: Verdict::Fail as i32,
                    finished_unix_ms: 1_700_000_000_000,
                    ..Default::default()
                }),
                gpus: vec![
                    GpuRow {
                        gpu: "0".into(),
                        stress_tflops: 610.5,
                        ..Default::default()
                    },
                    GpuRow {
                        gpu: "1".into(),
                        below_floor: 2,
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }]),
            ..Default::default()
        };
        let t = metrics_http::encode(&s.registry());
        for line in [
            "gpuctl_node_state{node=\"a\",state=\"lost\"} 1",
            "gpuctl_node_state{node=\"a\",state=\"ready\"} 0",
            "gpuctl_node_state{node=\"b\",state=\"ready\"} 1",
            "gpuctl_node_state{node=\"b\",state=\"busy\"} 0",
            "gpuctl_node_acceptance_verdict{node=\"a\",level=\"quick\"} 2",
            "gpuctl_node_acceptance_timestamp_seconds{node=\"a\"} 1700000000",
            "gpuctl_node_last_run_timestamp_seconds{node=\"a\"} 1700000000.5",
            "gpuctl_gpu_stress_tflops{node=\"a\",gpu=\"0\"} 610.5",
            "gpuctl_gpu_below_floor{node=\"a\",gpu=\"0\"} 0",
            "gpuctl_gpu_below_floor{node=\"a\",gpu=\"1\"} 2",
        ] {
            assert!(t.lines().any(|l| l == line), "missing `{line}` in\n{t}");
        }
        // A GPU without a stress figure has no TFLOP/s series, not 0.
        assert!(
            !t.contains("gpuctl_gpu_stress_tflops{node=\"a\",gpu=\"1\"}"),
            "{t}"
        );
    }
}

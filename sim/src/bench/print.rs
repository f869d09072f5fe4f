//! The bench's figures for people (tables) and for machines (JSON).

use serde_json::{json, Value};

use clap::ValueEnum as _;

use super::figures::BenchReport;
use super::PLAN_CALLS;
use crate::fleet::RankConnections;

const MB: f64 = 1e6;

fn median_max(ms: &[f64]) -> (f64, f64) {
    let med = gpuctl_core::stats::median(ms.to_vec()).unwrap_or(0.0);
    (med, ms.iter().copied().fold(0.0, f64::max))
}

impl BenchReport {
    pub fn to_json(&self) -> Value {
        json!({
            "nodes": self.nodes,
            "gpus_per_node": self.gpus,
            "rank_connections": self.rank_connections.to_possible_value().map(|v| v.get_name().to_string()),
            "register_ms": self.register_ms,
            "plan_all_nodes_ms": { "view": self.plan_view_ms, "whole": self.plan_whole_ms },
            "plan_whole_bytes": self.plan_whole_bytes,
            "rss_before_jobs_bytes": self.rss_before_jobs,
            "heap_allocated_before_jobs_bytes": self.heap_before_jobs,
            "fleet": { "sessions_lost": self.sessions_lost, "rank_rpc_errors": self.rpc_errors, "rank_rpc_errors_by_kind": self.rpc_error_kinds.iter().map(|(k, n)| (k.clone(), json!(n))).collect::<serde_json::Map<_, _>>(), "results_refused": self.results_refused },
            "phases": self.phases.iter().map(|p| json!({
                "name": p.name, "seconds": p.seconds, "cpu_s_per_s": p.cpu_per_s, "sim_cpu_s_per_s": p.sim_cpu_per_s,
                "rss_max_bytes": p.rss_max, "rss_max_at_s": p.rss_max_at, "rss_end_bytes": p.rss_end, "store_bytes": p.store_bytes,
                "major_faults": p.major_faults, "host_file_refaults": p.host_refaults,
                "rss_bytes_over_time": p.rss_series.iter().map(|(t, b)| json!([t, b])).collect::<Vec<_>>(),
                "cli_ms": p.cli.iter().map(|(k, (p50, p99, n))| (k.clone(), json!({"p50": p50, "p99": p99, "calls": n}))).collect::<serde_json::Map<_, _>>(),
                "slowest_calls": p.slowest.iter().map(|(k, at, ms)| json!({"call": k, "at_s": at, "ms": ms})).collect::<Vec<_>>(),
                "started_unix_ms": p.started_unix_ms,
                "calls": p.calls.iter().map(|(k, at, ms)| json!([k, (at * 1e3).round() / 1e3, (ms * 1e3).round() / 1e3])).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "store_by_prefix": self.store_use.iter().map(|(k, (n, b))| (k.clone(), json!({"keys": n, "bytes": b}))).collect::<serde_json::Map<_, _>>(),
            "jobs": self.jobs.iter().map(|j| json!({
                "id": j.id, "state": j.state, "ranks": j.ranks, "results_in_report": j.results_in_report,
                "assign_ms": j.assign_ms, "ended_ms": j.ended_ms, "stored_ms": j.stored_ms, "report_ms": j.report_ms, "rss_after_bytes": j.rss_after,
                "heap_allocated_after_bytes": j.heap_after,
                "telemetry_bytes": j.telemetry_bytes,
            })).collect::<Vec<_>>(),
        })
    }

    pub fn print(&self) {
        println!(
            "gpuctl coordinator at {} simulated nodes × {} GPUs: registered in {:.0} ms; workers' calls over {}",
            self.nodes,
            self.gpus,
            self.register_ms,
            match self.rank_connections {
                RankConnections::Agent => "their agent's connection",
                RankConnections::Node => "a connection per node and job",
                RankConnections::Rank => "a connection per rank and job",
            }
        );
        let (v50, vmax) = median_max(&self.plan_view_ms);
        let (w50, wmax) = median_max(&self.plan_whole_ms);
        println!(
            "planning a job on every node, p50 / max of {PLAN_CALLS}: gpuctl plan's view {v50:.1} / {vmax:.1} ms; the whole plan ({:.1} MB) {w50:.1} / {wmax:.1} ms",
            self.plan_whole_bytes as f64 / MB
        );
        println!(
            "before the first job: resident {:.0} MB, allocator's live bytes {:.0} MB",
            self.rss_before_jobs as f64 / MB,
            self.heap_before_jobs as f64 / MB
        );
        let mut t = comfy_table::Table::new();
        t.load_preset(comfy_table::presets::NOTHING).set_header([
            "PHASE",
            "SECONDS",
            "CPU S/S",
            "SIM CPU S/S",
            "RSS MAX MB (AT S)",
            "RSS END MB",
            "STORE MB",
            "MAJ FAULTS / HOST REFAULTS",
            "CLI MS P50/P99",
        ]);
        for p in &self.phases {
            let cli: Vec<String> = p
                .cli
                .iter()
                .map(|(k, (p50, p99, _))| format!("{k} {p50:.1}/{p99:.1}"))
                .collect();
            t.add_row([
                p.name.clone(),
                format!("{:.1}", p.seconds),
                format!("{:.2}", p.cpu_per_s),
                format!("{:.2}", p.sim_cpu_per_s),
                format!("{:.0} ({:.0})", p.rss_max as f64 / MB, p.rss_max_at),
                format!("{:.0}", p.rss_end as f64 / MB),
                format!("{:.1}", p.store_bytes as f64 / MB),
                format!("{} / {}", p.major_faults, p.host_refaults),
                cli.join(", "),
            ]);
        }
        println!("{t}\n");
        for p in self.phases.iter().filter(|p| !p.slowest.is_empty()) {
            let calls: Vec<String> = p
                .slowest
                .iter()
                .map(|(k, at, ms)| format!("{k} {ms:.0} ms at {at:.1} s"))
                .collect();
            println!("slowest calls, {}: {}", p.name, calls.join("; "));
        }
        for (name, split) in self
            .phases
            .iter()
            .filter_map(|p| Some((&p.name, fleet_split(p)?)))
        {
            let [(d50, d99), (r50, r99)] = split;
            println!(
                "fleet calls, {name}: decoding the rows here p50/p99 {d50:.1}/{d99:.1} ms, \
                 the rest of the call {r50:.1}/{r99:.1} ms"
            );
        }
        println!();
        let mut t = comfy_table::Table::new();
        t.load_preset(comfy_table::presets::NOTHING).set_header([
            "JOB",
            "STATE",
            "RANKS",
            "RESULTS JUDGED",
            "ASSIGN MS",
            "ENDED MS",
            "STORED MS",
            "REPORT MS",
            "RSS AFTER MB",
            "HEAP AFTER MB",
            "TELEMETRY MB",
        ]);
        for j in &self.jobs {
            t.add_row([
                j.id.clone(),
                j.state.clone(),
                j.ranks.to_string(),
                j.results_in_report.to_string(),
                format!("{:.0}", j.assign_ms),
                format!("{:.0}", j.ended_ms),
                format!("{:.0}", j.stored_ms),
                format!("{:.0}", j.report_ms),
                format!("{:.0}", j.rss_after as f64 / MB),
                format!("{:.0}", j.heap_after as f64 / MB),
                format!("{:.1}", j.telemetry_bytes as f64 / MB),
            ]);
        }
        println!("{t}");
        if !self.store_use.is_empty() {
            let jobs = self.jobs.len().max(1) as f64;
            let mut t = comfy_table::Table::new();
            t.load_preset(comfy_table::presets::NOTHING).set_header([
                "STORE KEYS UNDER",
                "KEYS",
                "MB",
                "MB PER JOB",
            ]);
            for (part, (n, b)) in &self.store_use {
                t.add_row([
                    format!("{part}/"),
                    n.to_string(),
                    format!("{:.1}", *b as f64 / MB),
                    format!("{:.1}", *b as f64 / MB / jobs),
                ]);
            }
            println!("\nthe store after {} jobs (keys and values; the file holds more: pages, free space)\n{t}", self.jobs.len());
        }
        // Only when something went wrong: each is a reason to doubt the run.
        if self.sessions_lost + self.rpc_errors + self.results_refused > 0 {
            println!(
                "\nthe fleet's side: {} sessions lost (each opened again), {} rank calls failed, {} results refused",
                self.sessions_lost, self.rpc_errors, self.results_refused
            );
            for (kind, n) in &self.rpc_error_kinds {
                println!("  {n} × {kind}");
            }
        }
    }
}

/// A phase's `fleet` calls split in two, each as p50 and p99: the caller's
/// decoding of the rows (its own CPU, on this shared host) and the rest of
/// the call (the coordinator and the connection). `None` without calls.
fn fleet_split(p: &super::figures::PhaseFigures) -> Option<[(f64, f64); 2]> {
    // Each call's decodes are recorded before the call itself, which is
    // recorded at its end.
    let (mut decode, mut rest, mut pending) = (Vec::new(), Vec::new(), 0.0);
    for (name, _, ms) in &p.calls {
        match name.as_str() {
            super::calls::DECODE => pending += ms,
            "fleet" => {
                decode.push(pending);
                rest.push(ms - pending);
                pending = 0.0;
            }
            _ => {}
        }
    }
    if decode.is_empty() {
        return None;
    }
    let q = |v: &mut Vec<f64>| {
        let p50 = super::calls::percentile(v, 0.5);
        (p50, super::calls::percentile(v, 0.99))
    };
    Some([q(&mut decode), q(&mut rest)])
}

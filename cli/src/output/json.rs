//! JSON shapes of nodes, jobs, plans and reports, built by hand with serde_json
//! because the prost types carry no serde. Enums are lower-case words (the
//! `.label()` helpers), maps have sorted keys, and key names are stable: scripts
//! and the end-to-end tests read them.

use std::collections::HashMap;

use gpuctl_proto::pb;
use serde_json::{json, Map, Value};

fn sorted_map(m: &HashMap<String, String>) -> Value {
    // serde_json's Map is a BTreeMap without `preserve_order`: keys come out sorted.
    Value::Object(
        m.iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect::<Map<_, _>>(),
    )
}

pub fn spec(s: &pb::JobSpec) -> Value {
    json!({
        "workload": s.workload,
        "node_count": s.node_count,
        "all_nodes": s.all_nodes,
        "selectors": s.selectors,
        "duration_ms": s.duration_ms,
        "timeout_ms": s.timeout_ms,
        "hang_timeout_ms": s.hang_timeout_ms,
        "params": sorted_map(&s.params),
        "env": sorted_map(&s.env),
        "name": s.name,
    })
}

pub fn gpu(g: &pb::GpuInfo) -> Value {
    json!({
        "index": g.index,
        "uuid": g.uuid,
        "name": g.name,
        "memory_total_bytes": g.memory_total_bytes,
        "pci_bus_id": g.pci_bus_id,
        "pcie_gen_max": g.pcie_gen_max,
        "pcie_width_max": g.pcie_width_max,
        "nvlinks_active": g.nvlinks_active,
        "compute_capability": g.compute_capability,
        "sm_count": g.sm_count,
    })
}

pub fn node(n: &pb::Node, now_ms: u64) -> Value {
    let f = n.facts.clone().unwrap_or_default();
    json!({
        "name": n.name,
        "state": n.state().label(),
        "state_reason": n.state_reason,
        "slots": n.slots,
        "gpus": n.gpus.iter().map(gpu).collect::<Vec<_>>(),
        "cpu_ranks": f.cpu_ranks,
        "current_job": n.current_job,
        "last_heartbeat_unix_ms": n.last_heartbeat_unix_ms,
        "heartbeat_age_ms": if n.last_heartbeat_unix_ms == 0 { Value::Null } else { json!(now_ms.saturating_sub(n.last_heartbeat_unix_ms)) },
        "registered_unix_ms": n.registered_unix_ms,
        "facts": {
            "hostname": f.hostname,
            "addresses": f.addresses,
            "cpu_count": f.cpu_count,
            "cpu_model": f.cpu_model,
            "memory_total_bytes": f.memory_total_bytes,
            "shm_bytes": f.shm_bytes,
            "driver_version": f.driver_version,
            "cuda_driver_version": f.cuda_driver_version,
            "nvml_status": f.nvml_status,
            "ib_devices": f.ib_devices,
            "labels": sorted_map(&f.labels),
            "agent_version": f.agent_version,
            "libtorch": f.libtorch,
            "os": f.os,
            "kernel": f.kernel,
        },
    })
}

pub fn placement(r: &pb::RankPlacement) -> Value {
    json!({
        "rank": r.rank,
        "local_rank": r.local_rank,
        "node_rank": r.node_rank,
        "node": r.node,
        "device": r.device_label(),
        "gpu_uuid": r.gpu_uuid,
        "device_name": r.device_name,
    })
}

pub fn env_var(e: &pb::EnvVar) -> Value {
    json!({ "name": e.name, "value": e.value, "reason": e.reason })
}

pub fn check(c: &pb::PreflightCheck) -> Value {
    json!({
        "node": c.node,
        "name": c.name,
        "verdict": c.verdict().label(),
        "detail": c.detail,
        "fix": c.fix,
    })
}

pub fn plan(p: &pb::Plan) -> Value {
    json!({
        "nodes": p.nodes,
        "world_size": p.world_size,
        "master_addr": p.master_addr,
        "master_port": p.master_port,
        "ranks": p.ranks.iter().map(placement).collect::<Vec<_>>(),
        "env": p.env.iter().map(env_var).collect::<Vec<_>>(),
        "checks": p.checks.iter().map(check).collect::<Vec<_>>(),
        "spec": p.spec.as_ref().map(spec),
    })
}

pub fn progress(p: &pb::RankProgress) -> Value {
    let metrics: Map<String, Value> = p
        .metrics
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    json!({
        "rank": p.rank,
        "node": p.node,
        "phase": p.phase,
        "fraction": p.fraction,
        "metrics": metrics,
        "message": p.message,
        "unix_ms": p.unix_ms,
        "iterations": p.iterations,
    })
}

pub fn job(j: &pb::Job) -> Value {
    let mut progress: Vec<&pb::RankProgress> = j.progress.iter().collect();
    progress.sort_by_key(|p| p.rank);
    json!({
        "id": j.id,
        "job_id": j.id,
        "name": j.spec.as_ref().map(|s| s.name.clone()).unwrap_or_default(),
        "workload": j.spec.as_ref().map(|s| s.workload.clone()).unwrap_or_default(),
        "state": j.state().label(),
        "attempt": j.attempt,
        "created_unix_ms": j.created_unix_ms,
        "started_unix_ms": j.started_unix_ms,
        "finished_unix_ms": j.finished_unix_ms,
        "message": j.message,
        "results_in": j.results_in,
        "spec": j.spec.as_ref().map(spec),
        "plan": j.plan.as_ref().map(plan),
        "progress": progress.into_iter().map(self::progress).collect::<Vec<_>>(),
        // What a bounded view or a listing left out of plan and progress.
        "ranks_left_out": j.ranks_left_out,
        "checks_left_out": j.checks_left_out,
        "nodes_left_out": j.nodes_left_out,
    })
}

pub fn collective_row(r: &pb::CollectiveRow) -> Value {
    json!({
        "op": r.op,
        "bytes": r.bytes,
        "count": r.count,
        "dtype": r.dtype,
        "redop": r.redop,
        "root": r.root,
        "time_us": r.time_us,
        "algbw_gbps": r.algbw_gbps,
        "busbw_gbps": r.busbw_gbps,
        "wrong": r.wrong,
        "time_us_ip": r.time_us_ip,
        "algbw_gbps_ip": r.algbw_gbps_ip,
        "busbw_gbps_ip": r.busbw_gbps_ip,
        "wrong_ip": r.wrong_ip,
    })
}

fn stress(s: &pb::StressResult) -> Value {
    json!({
        "dtype": s.dtype,
        "matrix_size": s.matrix_size,
        "iterations": s.iterations,
        "tflops_min": s.tflops_min,
        "tflops_median": s.tflops_median,
        "tflops_max": s.tflops_max,
        "tflops_per_interval": s.tflops_per_interval,
        "with_comm": s.with_comm,
        // --with-comm: its first phase, the GEMMs alone (empty otherwise).
        "solo_tflops_median": s.solo_tflops_median,
        "solo_tflops_per_interval": s.solo_tflops_per_interval,
        "interval_s": s.interval_s,
        "digest": s.digest,
        "self_mismatches": s.self_mismatches,
        "checks": s.checks,
        "device_class": s.device_class,
    })
}

fn train(t: &pb::TrainResult) -> Value {
    json!({
        "model": t.model,
        "variant": t.variant,
        "mode": t.mode,
        "precision": t.precision,
        "batch_size": t.batch_size,
        "steps": t.steps,
        "samples_per_s": t.samples_per_s,
        "unit": t.unit,
        "step_ms_p50": t.step_ms_p50,
        "step_ms_p99": t.step_ms_p99,
        "param_digest": t.param_digest,
        "final_loss": t.final_loss,
        "peak_memory_bytes": t.peak_memory_bytes,
        "comm_ms_per_step": t.comm_ms_per_step,
        "comm_exposed_ms_per_step": t.comm_exposed_ms_per_step,
        "overlap_share": t.overlap_share,
        "shard_digest": t.shard_digest,
        "gathered_shard_digests": t.gathered_shard_digests,
        "baseline_samples_per_s": t.baseline_samples_per_s,
        "scaling_efficiency": t.scaling_efficiency,
        "parameters": t.parameters,
        "driver_peak_memory_bytes": t.driver_peak_memory_bytes,
        "step_ms": t.step_ms,
        "loader": super::loader::json(t),
        "profile": super::profile::json(t),
    })
}

fn maxbatch(m: &pb::MaxBatchResult) -> Value {
    json!({
        "model": m.model,
        "precision": m.precision,
        "max_batch": m.max_batch,
        "recommended": m.recommended,
        "margin": m.margin,
        "capped": m.capped,
        "note": m.note,
        "points": m.points.iter().map(|p| json!({
            "batch_size": p.batch_size,
            "fits": p.fits,
            "peak_memory_bytes": p.peak_memory_bytes,
            "error": p.error,
        })).collect::<Vec<_>>(),
    })
}

fn collectives(c: &pb::CollectiveResult) -> Value {
    json!({
        "backend": c.backend,
        "world_size": c.world_size,
        "rows": c.rows.iter().map(collective_row).collect::<Vec<_>>(),
    })
}

/// A rank's `p2p` result: its host copies and the pairs it took part in.
fn p2p(p: &pb::P2pResult) -> Value {
    json!({
        "bytes": p.bytes,
        "iters": p.iters,
        "method": p.method,
        "backend": p.backend,
        "h2d_gbps": p.h2d_gbps,
        "h2d_repeat_gbps": p.h2d_repeat_gbps,
        "d2h_gbps": p.d2h_gbps,
        "d2h_repeat_gbps": p.d2h_repeat_gbps,
        "peers": p.peers.iter().map(|c| json!({
            "src_rank": c.src_rank,
            "dst_rank": c.dst_rank,
            "src_local": c.src_local,
            "dst_local": c.dst_local,
            "gbps": c.gbps,
            "repeat_gbps": c.repeat_gbps,
            "wrong": c.wrong,
        })).collect::<Vec<_>>(),
    })
}

pub fn rank_report(node: &str, r: &pb::RankReport) -> Value {
    let mut o = json!({
        "rank": r.rank,
        "local_rank": r.local_rank,
        "node": node,
        "device": r.device,
        "device_name": r.device_name,
        "gpu_uuid": r.gpu_uuid,
        "verdict": r.verdict().label(),
        "reason": r.reason,
        "reported": r.result.is_some(),
        "last_phase": r.last_phase,
        "iterations": r.iterations,
        "last_progress_unix_ms": r.last_progress_unix_ms,
        "process_state": r.process_state,
    });
    if let Some(res) = &r.result {
        let m = o.as_object_mut().expect("object");
        m.insert("ok".into(), json!(res.ok));
        m.insert("error".into(), json!(res.error));
        m.insert("elapsed_ms".into(), json!(res.elapsed_ms));
        m.insert("peak_memory_bytes".into(), json!(res.peak_memory_bytes));
        m.insert("torch_version".into(), json!(res.torch_version));
        m.insert("nccl_version".into(), json!(res.nccl_version));
        match &res.detail {
            Some(pb::rank_result::Detail::Stress(s)) => {
                m.insert("stress".into(), stress(s));
            }
            Some(pb::rank_result::Detail::Train(t)) => {
                m.insert("train".into(), train(t));
            }
            Some(pb::rank_result::Detail::Maxbatch(x)) => {
                m.insert("maxbatch".into(), maxbatch(x));
            }
            Some(pb::rank_result::Detail::Collectives(c)) => {
                m.insert("collectives".into(), collectives(c));
            }
            Some(pb::rank_result::Detail::P2p(p)) => {
                m.insert("p2p".into(), p2p(p));
            }
            None => {}
        }
        // `--model a,b,c`: the models after the first, in order.
        m.insert(
            "more_train".into(),
            Value::Array(res.more_train.iter().map(train).collect()),
        );
        m.insert(
            "phases".into(),
            Value::Array(
                res.phases
                    .iter()
                    .map(|p| {
                        json!({
                            "phase": p.phase,
                            "unix_ms": p.unix_ms,
                            "iterations": p.iterations,
                            "kind": super::trace::kind_name(p.kind()),
                        })
                    })
                    .collect(),
            ),
        );
    }
    o
}

pub fn report(r: &pb::Report) -> Value {
    json!({
        "job_id": r.job_id,
        "workload": r.workload,
        "state": r.state().label(),
        "verdict": r.verdict().label(),
        "reason": r.reason,
        "duration_ms": r.duration_ms,
        "hang_timeout_ms": r.hang_timeout_ms,
        "started_unix_ms": r.started_unix_ms,
        "finished_unix_ms": r.finished_unix_ms,
        "world_size": r.world_size,
        "backend": r.backend,
        "nccl_version": r.nccl_version,
        "sdc_note": r.sdc_note,
        "notes": r.notes,
        "spec": r.spec.as_ref().map(spec),
        "findings": r.findings.iter().map(finding).collect::<Vec<_>>(),
        "nodes": r.nodes.iter().map(|n| json!({
            "name": n.name,
            "verdict": n.verdict().label(),
            "reason": n.reason,
            "findings": n.findings.iter().map(finding).collect::<Vec<_>>(),
            "ranks": n.ranks.iter().map(|x| rank_report(&n.name, x)).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "collectives": r.collectives.iter().map(collective_row).collect::<Vec<_>>(),
        "bisect": r.bisect.iter().map(|b| json!({
            "round": b.round,
            "decision": b.decision,
            "groups": b.groups.iter().map(|g| json!({
                "nodes": g.names,
                "busbw_gbps": g.busbw_gbps,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "links": r.links.iter().map(|l| json!({
            "a": l.a,
            "b": l.b,
            "op": l.op,
            "bytes": l.bytes,
            "dtype": l.dtype,
            "round": l.round,
            "busbw_gbps": l.busbw_gbps,
            "wrong": l.wrong,
            "reference_gbps": l.reference_gbps,
            "first_gbps": l.first_gbps,
            "repeat_gbps": l.repeat_gbps,
            "below_floor": l.below_floor,
            "verdict": l.verdict().label(),
        })).collect::<Vec<_>>(),
        "gpu_pairs": r.gpu_pairs.iter().map(|p| json!({
            "node": p.node,
            "src_rank": p.src_rank,
            "dst_rank": p.dst_rank,
            "src_local": p.src_local,
            "dst_local": p.dst_local,
            "src_gpu": p.src_gpu,
            "dst_gpu": p.dst_gpu,
            "bytes": p.bytes,
            "gbps": p.gbps,
            "first_gbps": p.first_gbps,
            "repeat_gbps": p.repeat_gbps,
            "wrong": p.wrong,
            "reference_gbps": p.reference_gbps,
            "verdict": p.verdict().label(),
        })).collect::<Vec<_>>(),
        "env": r.env.iter().map(env_var).collect::<Vec<_>>(),
        "telemetry": r.telemetry.iter().map(gpu_telemetry).collect::<Vec<_>>(),
        "health": r.health.iter().map(health_finding).collect::<Vec<_>>(),
        "preflight": r.preflight.iter().map(check).collect::<Vec<_>>(),
        "loader_gpu": super::loader::gpu_json(r),
    })
}

pub fn gpu_telemetry(t: &pb::GpuTelemetrySummary) -> Value {
    json!({
        "node": t.node,
        "index": t.index,
        "uuid": t.uuid,
        "verdict": t.verdict().label(),
        "samples": t.samples,
        "util_mean": t.util_mean,
        "util_max": t.util_max,
        "util_std": t.util_std,
        "util_low_share": t.util_low_share,
        "mem_used_max_bytes": t.mem_used_max_bytes,
        "temp_mean": t.temp_mean,
        "temp_max": t.temp_max,
        "temp_std": t.temp_std,
        "power_mean_w": t.power_mean_w,
        "power_max_w": t.power_max_w,
        "power_std_w": t.power_std_w,
        "sm_clock_mean_mhz": t.sm_clock_mean_mhz,
        "ecc_corrected_delta": t.ecc_corrected_delta,
        "ecc_uncorrected_delta": t.ecc_uncorrected_delta,
        "pcie_replays_delta": t.pcie_replays_delta,
        "nvlink_crc_delta": t.nvlink_crc_delta,
        "nvlink_crc_flit_delta": t.nvlink_crc_flit_delta,
        "nvlink_crc_data_delta": t.nvlink_crc_data_delta,
        "nvlink_replay_delta": t.nvlink_replay_delta,
        "nvlink_recovery_delta": t.nvlink_recovery_delta,
        "nvlink_down_samples": t.nvlink_down_samples,
        "measured_samples": t.measured_samples,
        "measured_util_low_share": t.measured_util_low_share,
        // null where the driver keeps no clock-event counters.
        "sw_thermal_slowdown_s": t.sw_thermal_slowdown_s,
        "hw_thermal_slowdown_s": t.hw_thermal_slowdown_s,
        "power_brake_slowdown_s": t.power_brake_slowdown_s,
        "xids": t.xids,
    })
}

/// A finding as `nodes[].findings[]` and `findings[]` carry it.
pub fn finding(f: &pb::Finding) -> Value {
    json!({
        "node": f.node,
        "rank": f.rank,
        "gpu_index": f.gpu_index,
        "gpu_uuid": f.gpu_uuid,
        "metric": f.metric,
        "key": f.key,
        "value": f.value,
        "missing": f.missing,
        "unit": f.unit,
        "reference": f.reference,
        "reference_kind": f.reference_kind,
        "rule": f.rule,
        "level": f.level().label(),
        "detail": f.detail,
        "phase": f.phase,
    })
}

/// A saved baseline, figure by figure.
pub fn baseline(b: &pb::Baseline) -> Value {
    json!({
        "name": b.name,
        "job_id": b.job_id,
        "workload": b.workload,
        "created_unix_ms": b.created_unix_ms,
        "figures": b.figures.iter().map(|f| json!({
            "device_class": f.device_class,
            "device_name": f.device_name,
            "metric": f.metric,
            "key": f.key,
            "value": f.value,
            "ranks": f.ranks,
        })).collect::<Vec<_>>(),
    })
}

pub fn health_finding(f: &pb::HealthFinding) -> Value {
    json!({
        "node": f.node,
        "gpu_index": f.gpu_index,
        "uuid": f.uuid,
        "verdict": f.verdict().label(),
        "rule": f.rule,
        "detail": f.detail,
    })
}

pub fn log_line(l: &pb::LogLine) -> Value {
    json!({ "rank": l.rank, "node": l.node, "line": l.line })
}

//! Reports the output tests share: built by hand, as the coordinator would
//! send them, so every format (table, JSON, CSV, Markdown, JUnit, HTML) is
//! checked against the same jobs. Test support only: compiled for tests.

use gpuctl_proto::pb::{self, rank_result::Detail};

fn rank(rank: u32, local: u32, verdict: pb::Verdict, detail: Option<Detail>) -> pb::RankReport {
    pb::RankReport {
        rank,
        local_rank: local,
        device: format!("cuda:{local}"),
        device_name: "NVIDIA H200".into(),
        gpu_uuid: format!("GPU-{rank}"),
        verdict: verdict as i32,
        reason: if verdict == pb::Verdict::Fail {
            "silent data corruption: result digest ffff differs from abcdef0123456789 shared by 1 of 2 ranks".into()
        } else {
            String::new()
        },
        result: detail
            .map(|d| pb::RankResult {
                rank,
                ok: true,
                nccl_version: "2.28.9".into(),
                detail: Some(d),
                ..Default::default()
            })
            .map(Box::new),
        gpu_index: Some(local),
        ..Default::default()
    }
}

pub(crate) fn stress(min: f64, digest: &str, self_mismatches: u64) -> Detail {
    Detail::Stress(pb::StressResult {
        dtype: "bf16".into(),
        matrix_size: 8192,
        tflops_min: min,
        tflops_median: min + 10.0,
        tflops_max: min + 20.0,
        digest: digest.into(),
        self_mismatches,
        checks: 12,
        device_class: "NVIDIA H200/cuBLAS".into(),
        ..Default::default()
    })
}

/// A stress job that failed: node-b's rank 1 outvoted on its digest, rank 2
/// never reported; telemetry, health findings and a preflight check of node-b.
pub(crate) fn stress_report() -> pb::Report {
    pb::Report {
        job_id: "job-000042".into(),
        workload: "stress".into(),
        state: pb::JobState::Failed as i32,
        verdict: pb::Verdict::Fail as i32,
        reason: "rank 1 (node-b cuda:0): digest differs".into(),
        duration_ms: 30_500,
        world_size: 3,
        backend: "nccl".into(),
        nccl_version: "2.28.9".into(),
        sdc_note: "compared within 1 device class".into(),
        nodes: vec![
            pb::NodeReport {
                name: "node-a".into(),
                verdict: pb::Verdict::Pass as i32,
                reason: String::new(),
                ranks: vec![rank(
                    0,
                    0,
                    pb::Verdict::Pass,
                    Some(stress(700.0, "abcdef0123456789", 0)),
                )],
                findings: vec![],
            },
            pb::NodeReport {
                name: "node-b".into(),
                verdict: pb::Verdict::Fail as i32,
                reason: "rank 1 failed".into(),
                ranks: vec![
                    rank(1, 0, pb::Verdict::Fail, Some(stress(650.5, "ffff", 0))),
                    rank(2, 1, pb::Verdict::Incomplete, None),
                ],
                findings: vec![],
            },
        ],
        env: vec![pb::EnvVar {
            name: "NCCL_IB_DISABLE".into(),
            value: "1".into(),
            reason: "no InfiniBand on node-b".into(),
        }],
        spec: Some(pb::JobSpec {
            workload: "stress".into(),
            node_count: 2,
            duration_ms: 30_000,
            ..Default::default()
        }),
        telemetry: vec![pb::GpuTelemetrySummary {
            node: "node-b".into(),
            index: 1,
            uuid: "GPU-2".into(),
            samples: 30,
            util_mean: 97.25,
            util_max: 100.0,
            util_std: 1.5,
            util_low_share: 0.1,
            mem_used_max_bytes: 70 << 30,
            temp_mean: 71.0,
            temp_max: 93.0,
            power_mean_w: 640.0,
            power_max_w: 700.0,
            sm_clock_mean_mhz: 1980.0,
            ecc_uncorrected_delta: 2,
            xids: vec![48, 79],
            verdict: pb::Verdict::Fail as i32,
            ..Default::default()
        }],
        health: vec![
            pb::HealthFinding {
                node: "node-b".into(),
                gpu_index: 1,
                verdict: pb::Verdict::Warn as i32,
                rule: "temperature".into(),
                detail: "reached 93 °C (warn at 90 °C)".into(),
                ..Default::default()
            },
            pb::HealthFinding {
                node: "node-b".into(),
                gpu_index: 1,
                verdict: pb::Verdict::Fail as i32,
                rule: "xid".into(),
                detail: "critical XID 48, 79 during the run".into(),
                ..Default::default()
            },
        ],
        preflight: vec![pb::PreflightCheck {
            node: "node-b".into(),
            name: "shm".into(),
            verdict: pb::Verdict::Pass as i32,
            detail: "/dev/shm is 16 GiB".into(),
            fix: String::new(),
        }],
        ..Default::default()
    }
}

/// An nccl job that passed: all_reduce at two sizes, one all_gather with
/// wrong values in place.
pub(crate) fn nccl_report() -> pb::Report {
    let row = |op: &str, bytes: u64, t: f64| pb::CollectiveRow {
        op: op.into(),
        bytes,
        count: bytes / 4,
        dtype: "float".into(),
        redop: if op == "all_gather" {
            String::new()
        } else {
            "sum".into()
        },
        root: -1,
        time_us: t,
        algbw_gbps: bytes as f64 / t / 1e3,
        busbw_gbps: bytes as f64 / t / 1e3,
        wrong: 0,
        time_us_ip: t,
        algbw_gbps_ip: bytes as f64 / t / 1e3,
        busbw_gbps_ip: bytes as f64 / t / 1e3,
        wrong_ip: if op == "all_gather" { 3 } else { 0 },
    };
    pb::Report {
        job_id: "job-000043".into(),
        workload: "nccl".into(),
        state: pb::JobState::Succeeded as i32,
        verdict: pb::Verdict::Pass as i32,
        world_size: 2,
        backend: "tcp-ring".into(),
        collectives: vec![
            row("all_reduce", 1 << 20, 39.49),
            row("all_reduce", 1 << 10, 12.5),
            row("all_gather", 1 << 20, 12345.0),
        ],
        nodes: vec![pb::NodeReport {
            name: "local-0".into(),
            verdict: pb::Verdict::Pass as i32,
            ranks: vec![rank(
                0,
                0,
                pb::Verdict::Pass,
                Some(Detail::Collectives(pb::CollectiveResult {
                    backend: "tcp-ring".into(),
                    world_size: 2,
                    rows: vec![],
                    ..Default::default()
                })),
            )],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Two ranks of an fsdp gpt run: rank 0 with overlap figures and shard
/// digests, rank 1 as a worker that measures neither.
pub(crate) fn train_report() -> pb::Report {
    let t = |comm: f64, exposed: f64, share: f64, own: &str, gathered: &[&str]| {
        Detail::Train(pb::TrainResult {
            model: "gpt".into(),
            variant: "1.3b".into(),
            mode: "fsdp".into(),
            unit: "tok".into(),
            samples_per_s: 1000.0,
            comm_ms_per_step: comm,
            comm_exposed_ms_per_step: exposed,
            overlap_share: share,
            shard_digest: own.into(),
            gathered_shard_digests: gathered.iter().map(|d| d.to_string()).collect(),
            ..Default::default()
        })
    };
    pb::Report {
        workload: "fsdp".into(),
        nodes: vec![pb::NodeReport {
            name: "node-a".into(),
            ranks: vec![
                rank(
                    0,
                    0,
                    pb::Verdict::Pass,
                    Some(t(12.0, 3.0, 0.75, "aa", &["aa", "bb"])),
                ),
                rank(1, 1, pb::Verdict::Pass, Some(t(9.0, 0.0, 0.0, "", &[]))),
            ],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// One node of four GPUs (rank = local = GPU index), 360 GB/s between
/// every pair but GPU 1 -> GPU 3, slow in both passes; host copies per
/// GPU, the second pass of GPU 2's H2D the better one.
pub(crate) fn p2p_report() -> pb::Report {
    let mut pairs = Vec::new();
    for s in 0..4u32 {
        for d in (0..4u32).filter(|d| *d != s) {
            let slow = (s, d) == (1, 3);
            let (first, repeat) = if slow { (150.0, 148.5) } else { (358.0, 360.0) };
            pairs.push(pb::GpuPair {
                node: "node-a".into(),
                src_rank: s,
                dst_rank: d,
                src_gpu: Some(s),
                dst_gpu: Some(d),
                src_local: s,
                dst_local: d,
                bytes: 1 << 28,
                gbps: f64::max(first, repeat),
                first_gbps: first,
                repeat_gbps: repeat,
                verdict: if slow {
                    pb::Verdict::Fail
                } else {
                    pb::Verdict::Pass
                } as i32,
                reference_gbps: 360.0,
                ..Default::default()
            });
        }
    }
    let rank = |r: u32| pb::RankReport {
        rank: r,
        local_rank: r,
        gpu_index: Some(r),
        device: "cuda:0".into(),
        device_name: "NVIDIA H100 80GB HBM3".into(),
        verdict: pb::Verdict::Pass as i32,
        result: Some(Box::new(pb::RankResult {
            rank: r,
            ok: true,
            detail: Some(Detail::P2p(pb::P2pResult {
                bytes: 1 << 28,
                iters: 10,
                method: "pinned".into(),
                backend: "nccl".into(),
                h2d_gbps: if r == 2 { 52.9 } else { 53.0 },
                h2d_repeat_gbps: if r == 2 { 53.1 } else { 52.0 },
                d2h_gbps: 50.0,
                d2h_repeat_gbps: 51.3,
                ..Default::default()
            })),
            ..Default::default()
        })),
        ..Default::default()
    };
    pb::Report {
        job_id: "job-000077".into(),
        workload: "p2p".into(),
        state: pb::JobState::Failed as i32,
        verdict: pb::Verdict::Fail as i32,
        world_size: 4,
        nodes: vec![pb::NodeReport {
            name: "node-a".into(),
            verdict: pb::Verdict::Fail as i32,
            ranks: (0..4).map(rank).collect(),
            ..Default::default()
        }],
        gpu_pairs: pairs,
        ..Default::default()
    }
}

/// One node's one-rank training job with a loader sweep of `settings`, and
/// the GPU windows the coordinator matched to them (none on a CPU rank).
pub fn loader_report(
    model: &str,
    settings: Vec<pb::LoaderSetting>,
    loader_gpu: Vec<pb::LoaderGpu>,
) -> pb::Report {
    pb::Report {
        nodes: vec![pb::NodeReport {
            name: "n1".into(),
            ranks: vec![pb::RankReport {
                rank: 0,
                result: Some(Box::new(pb::RankResult {
                    detail: Some(Detail::Train(pb::TrainResult {
                        model: model.into(),
                        loader: settings,
                        ..Default::default()
                    })),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        loader_gpu,
        ..Default::default()
    }
}

//! The report's rules, each checked through `build` as a whole.

use std::collections::BTreeMap;

use gpuctl_proto::pb::{
    rank_result::Detail, CollectiveResult, CollectiveRow, Job, JobState, Plan, RankPlacement,
    RankProcess, RankProgress, RankReport, RankResult, Report, StressResult, Verdict, WorkerExited,
};

use super::*;
use crate::judge::checks::health::HealthRules;
use crate::judge::checks::perf::rules::PerfRules;
use crate::judge::telemetry::Telemetry;

fn job(state: JobState, nodes: usize, per_node: u32) -> Job {
    let mut plan = Plan::default();
    for n in 0..nodes {
        plan.nodes.push(format!("node-{n}"));
        for l in 0..per_node {
            let rank = n as u32 * per_node + l;
            plan.ranks.push(RankPlacement {
                rank,
                local_rank: l,
                node_rank: n as u32,
                node: format!("node-{n}"),
                gpu_index: Some(l),
                ..Default::default()
            });
        }
    }
    plan.world_size = nodes as u32 * per_node;
    Job {
        id: "job-000007".into(),
        state: state as i32,
        spec: Some(gpuctl_proto::pb::JobSpec {
            workload: "stress".into(),
            ..Default::default()
        }),
        plan: Some(plan),
        started_unix_ms: 1_000,
        finished_unix_ms: 5_000,
        ..Default::default()
    }
}

fn stress(rank: u32, class: &str, digest: &str) -> RankResult {
    RankResult {
        rank,
        ok: true,
        detail: Some(Detail::Stress(StressResult {
            digest: digest.into(),
            device_class: class.into(),
            checks: 10,
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn build_with(job: &Job, results: Vec<RankResult>) -> Report {
    let results: BTreeMap<u32, RankResult> = results.into_iter().map(|r| (r.rank, r)).collect();
    build_at(job, &results, &BTreeMap::new(), 9_000)
}

/// The report of `job` with these results and exits, at `now_ms`, under
/// the default rules.
fn build_at(
    job: &Job,
    results: &BTreeMap<u32, RankResult>,
    exits: &BTreeMap<u32, WorkerExited>,
    now_ms: u64,
) -> Report {
    build(&Inputs {
        job,
        results,
        exits,
        progress: &BTreeMap::new(),
        watch: &hang::Watch::default(),
        telemetry: &Telemetry::default(),
        rules: &HealthRules::default(),
        perf: &PerfRules::default(),
        now_ms,
    })
}

fn rank(report: &Report, rank: u32) -> &RankReport {
    report
        .nodes
        .iter()
        .flat_map(|n| &n.ranks)
        .find(|r| r.rank == rank)
        .unwrap()
}

/// Issue 46: a node that offers many ranks has one vote on the digest, as
/// on the fleet median; with no majority of nodes no node fails another.
#[test]
fn sdc_is_one_vote_per_node() {
    let mut j = job(JobState::Succeeded, 3, 1);
    let plan = j.plan.as_mut().unwrap();
    for l in 1..8 {
        plan.ranks.push(RankPlacement {
            rank: 2 + l,
            local_rank: l,
            node_rank: 2,
            node: "node-2".into(),
            gpu_index: Some(l),
            ..Default::default()
        });
    }
    plan.world_size = 10;
    let on = |node: &str, mut r: RankResult| {
        r.node = node.into();
        r
    };
    let mut results = vec![
        on("node-0", stress(0, "H200", "aaaa")),
        on("node-1", stress(1, "H200", "aaaa")),
    ];
    results.extend((2..10).map(|r| on("node-2", stress(r, "H200", "ffff"))));
    let r = build_with(&j, results.clone());
    for honest in [0, 1] {
        assert_eq!(
            rank(&r, honest).verdict(),
            Verdict::Pass,
            "{}",
            rank(&r, honest).reason
        );
    }
    assert_eq!(rank(&r, 5).verdict(), Verdict::Fail);
    assert!(
        rank(&r, 5).reason.contains("2 of 3 nodes' majorities"),
        "{}",
        rank(&r, 5).reason
    );

    // Two nodes that disagree: neither fails the other; both are warned.
    let r = build_with(&j, results[1..].to_vec());
    assert_eq!(
        rank(&r, 1).verdict(),
        Verdict::Warn,
        "{}",
        rank(&r, 1).reason
    );
    assert!(rank(&r, 1).reason.contains("no majority of nodes"));
    assert_eq!(rank(&r, 4).verdict(), Verdict::Warn);
    // Inside one node its own ranks still outvote its odd one.
    let mut odd = results[1..].to_vec();
    odd[3] = on("node-2", stress(4, "H200", "eeee"));
    let r = build_with(&j, odd);
    assert_eq!(
        rank(&r, 4).verdict(),
        Verdict::Fail,
        "{}",
        rank(&r, 4).reason
    );
    assert!(rank(&r, 4)
        .reason
        .contains("the other ranks of node node-2"));
}

#[test]
fn sdc_majority_wins_within_a_class() {
    let j = job(JobState::Succeeded, 2, 2);
    let r = build_with(
        &j,
        vec![
            stress(0, "H200", "aaaa"),
            stress(1, "H200", "aaaa"),
            stress(2, "H200", "bbbb"),
            stress(3, "H100", "cccc"),
        ],
    );
    assert_eq!(rank(&r, 2).verdict(), Verdict::Fail);
    assert!(
        rank(&r, 2).reason.contains("silent data corruption"),
        "{}",
        rank(&r, 2).reason
    );
    assert!(rank(&r, 2).reason.contains("bbbb") && rank(&r, 2).reason.contains("aaaa"));
    // A class of one is not compared against the others.
    assert_eq!(rank(&r, 3).verdict(), Verdict::Pass);
    assert_eq!(rank(&r, 0).verdict(), Verdict::Pass);
    assert_eq!(r.nodes[0].verdict(), Verdict::Pass);
    assert_eq!(r.nodes[1].verdict(), Verdict::Fail);
    let (v, why) = ranks_verdict(&r);
    assert_eq!(v, Verdict::Fail);
    assert!(why.contains("rank 2 on node node-1 (cuda:0)"), "{why}");
    assert!(r.sdc_note.contains("2 device classes"), "{}", r.sdc_note);
    assert_eq!(r.duration_ms, 4_000);
}

#[test]
fn sdc_tie_fails_both_and_self_mismatch_fails() {
    let j = job(JobState::Succeeded, 1, 3);
    let mut drift = stress(2, "X", "");
    if let Some(Detail::Stress(s)) = &mut drift.detail {
        s.self_mismatches = 2;
    }
    let r = build_with(&j, vec![stress(0, "X", "aa"), stress(1, "X", "bb"), drift]);
    assert_eq!(rank(&r, 0).verdict(), Verdict::Fail);
    assert_eq!(rank(&r, 1).verdict(), Verdict::Fail);
    assert!(rank(&r, 0).reason.contains("no majority"));
    assert_eq!(rank(&r, 2).verdict(), Verdict::Fail);
    assert!(rank(&r, 2).reason.contains("2 of 10 checks"));
}

#[test]
fn all_agree_passes() {
    let j = job(JobState::Succeeded, 2, 1);
    let r = build_with(&j, vec![stress(0, "X", "aa"), stress(1, "X", "aa")]);
    assert_eq!(r.verdict(), Verdict::Pass);
    assert_eq!(ranks_verdict(&r).0, Verdict::Pass);
}

/// An fsdp rank: its gathered parameters' digest, its own shard's and the
/// shards as it gathered them.
fn fsdp(rank: u32, params: &str, own: &str, gathered: &[&str]) -> RankResult {
    RankResult {
        rank,
        ok: true,
        detail: Some(Detail::Train(gpuctl_proto::pb::TrainResult {
            model: "gpt".into(),
            mode: "fsdp".into(),
            param_digest: params.into(),
            shard_digest: own.into(),
            gathered_shard_digests: gathered.iter().map(|d| d.to_string()).collect(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

#[test]
fn fsdp_parameters_and_shards_name_the_rank_node_and_gpu() {
    let mut j = job(JobState::Succeeded, 2, 2);
    j.spec.as_mut().unwrap().workload = "fsdp".into();
    let all = ["s0", "s1", "s2", "s3"];
    let good: Vec<RankResult> = (0..4)
        .map(|r| fsdp(r, "p", all[r as usize], &all))
        .collect();
    let r = build_with(&j, good.clone());
    assert_eq!(ranks_verdict(&r).0, Verdict::Pass);
    assert!(r.findings.is_empty(), "{:?}", r.findings);
    assert!(
        r.notes
            .iter()
            .any(|n| n.contains("FSDP parameters after training")),
        "{:?}",
        r.notes
    );
    // Rank 3 (node-1, GPU 1) gathered rank 0's shard wrong, so its
    // parameters differ too; both checks name it and only it.
    let mut bad = good;
    bad[3] = fsdp(3, "q", "s3", &["x0", "s1", "s2", "s3"]);
    let r = build_with(&j, bad);
    assert_eq!(rank(&r, 3).verdict(), Verdict::Fail);
    for k in 0..3 {
        assert_eq!(rank(&r, k).verdict(), Verdict::Pass, "rank {k}");
    }
    assert!(
        rank(&r, 3).reason.contains("parameter digest"),
        "{}",
        rank(&r, 3).reason
    );
    let f = r
        .findings
        .iter()
        .find(|f| f.detail.contains("received something else"))
        .expect("a shard finding");
    assert_eq!(
        (f.node.as_str(), f.rank, f.gpu_index),
        ("node-1", Some(3), Some(1))
    );
    assert!(
        f.detail.starts_with("rank 3 on node node-1"),
        "{}",
        f.detail
    );
}

fn coll(rank: u32, world: u32, rows: Vec<(&str, u64, f64, u64)>) -> RankResult {
    RankResult {
        rank,
        ok: true,
        detail: Some(Detail::Collectives(CollectiveResult {
            backend: "tcp-ring".into(),
            world_size: world,
            rows: rows
                .into_iter()
                .map(|(op, bytes, t, wrong)| CollectiveRow {
                    op: op.into(),
                    bytes,
                    dtype: "float".into(),
                    time_us: t,
                    time_us_ip: t * 2.0,
                    wrong,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

#[test]
fn busbw_factors_match_nccl_tests() {
    assert!((busbw_factor("all_reduce", 4) - 1.5).abs() < 1e-12);
    assert!((busbw_factor("all_gather", 4) - 0.75).abs() < 1e-12);
    assert!((busbw_factor("reduce_scatter", 8) - 0.875).abs() < 1e-12);
    assert!((busbw_factor("alltoall", 2) - 0.5).abs() < 1e-12);
    for op in ["broadcast", "reduce", "sendrecv"] {
        assert_eq!(busbw_factor(op, 8), 1.0);
    }
    assert_eq!(busbw_factor("all_reduce", 1), 0.0);
}

#[test]
fn collectives_take_the_slowest_rank_and_sum_wrong() {
    let mb = 1_000_000;
    let results = [
        coll(
            0,
            4,
            vec![("all_reduce", mb, 100.0, 0), ("broadcast", mb, 50.0, 0)],
        ),
        coll(
            1,
            4,
            vec![("all_reduce", mb, 250.0, 0), ("broadcast", mb, 40.0, 1)],
        ),
        coll(
            2,
            4,
            vec![("all_reduce", mb, 200.0, 0), ("broadcast", mb, 40.0, 2)],
        ),
        coll(
            3,
            4,
            vec![("all_reduce", mb, 10.0, 0), ("broadcast", mb, 40.0, 0)],
        ),
    ];
    let rows = aggregate_collectives(results.iter());
    assert_eq!(rows.len(), 2);
    let ar = &rows[0];
    assert_eq!(ar.op, "all_reduce");
    assert_eq!(ar.time_us, 250.0);
    assert!(
        (ar.algbw_gbps - 4.0).abs() < 1e-9,
        "1e6 B / 250 us = 4 GB/s, got {}",
        ar.algbw_gbps
    );
    assert!((ar.busbw_gbps - 6.0).abs() < 1e-9, "4 GB/s x 2(3)/4");
    assert_eq!(ar.time_us_ip, 500.0);
    assert!((ar.busbw_gbps_ip - 3.0).abs() < 1e-9);
    let bc = &rows[1];
    assert_eq!((bc.time_us, bc.wrong), (50.0, 3));
    assert!((bc.busbw_gbps - bc.algbw_gbps).abs() < 1e-12);

    // Wrong elements fail the ranks that saw them.
    let j = job(JobState::Succeeded, 2, 2);
    let r = build_with(&j, results.to_vec());
    assert_eq!(r.collectives.len(), 2);
    assert_eq!(r.backend, "tcp-ring");
    assert_eq!(rank(&r, 1).verdict(), Verdict::Fail);
    assert_eq!(rank(&r, 0).verdict(), Verdict::Pass);
    assert_eq!(rank(&r, 3).verdict(), Verdict::Pass);
}

#[test]
fn failing_gpus_fail_their_ranks_and_nodes() {
    use gpuctl_proto::pb::{GpuSample, TelemetryBatch};
    let j = job(JobState::Succeeded, 2, 2);
    let mut t = Telemetry::default();
    let bad = |index: u32, xid: u32| GpuSample {
        uuid: String::new(),
        xids: vec![xid],
        ..gpuctl_testkit::gpu::healthy(index)
    };
    // node-0 GPU 1 (no UUIDs: matched by `cuda:1`); node-1 GPU 7 ran no rank.
    for (node, index, xid) in [("node-0", 1, 79), ("node-1", 7, 48), ("node-1", 0, 13)] {
        t.add(
            node,
            TelemetryBatch {
                node: node.into(),
                samples: vec![bad(index, xid)],
                ..Default::default()
            },
            1,
        );
    }
    let results: BTreeMap<u32, RankResult> = (0..4).map(|r| (r, stress(r, "X", "aa"))).collect();
    let r = build(&Inputs {
        job: &j,
        results: &results,
        exits: &BTreeMap::new(),
        progress: &BTreeMap::new(),
        watch: &hang::Watch::default(),
        telemetry: &t,
        rules: &HealthRules::default(),
        perf: &PerfRules::default(),
        now_ms: 9_000,
    });
    assert_eq!(rank(&r, 0).verdict(), Verdict::Pass);
    assert_eq!(rank(&r, 1).verdict(), Verdict::Fail);
    assert!(
        rank(&r, 1).reason.contains("GPU 1 health `xid`"),
        "{}",
        rank(&r, 1).reason
    );
    assert_eq!(r.nodes[0].verdict(), Verdict::Fail);
    // XID 13 only warns; GPU 7's XID 48 fails node-1 though its ranks pass.
    assert_eq!(rank(&r, 2).verdict(), Verdict::Pass);
    assert_eq!(rank(&r, 3).verdict(), Verdict::Pass);
    assert_eq!(r.nodes[1].verdict(), Verdict::Fail);
    assert!(r.nodes[1].reason.contains("GPU 7"), "{}", r.nodes[1].reason);
    assert_eq!(r.verdict(), Verdict::Fail);
    assert_eq!(r.health.len(), 3);
    assert_eq!(r.telemetry.len(), 3);

    // Only the GPU that no rank ran on: the job still fails, naming the node.
    let mut t2 = Telemetry::default();
    t2.add(
        "node-1",
        TelemetryBatch {
            samples: vec![bad(7, 48)],
            ..Default::default()
        },
        1,
    );
    let r = build(&Inputs {
        job: &j,
        results: &results,
        exits: &BTreeMap::new(),
        progress: &BTreeMap::new(),
        watch: &hang::Watch::default(),
        telemetry: &t2,
        rules: &HealthRules::default(),
        perf: &PerfRules::default(),
        now_ms: 9_000,
    });
    let (v, why) = ranks_verdict(&r);
    assert_eq!(v, Verdict::Fail);
    assert!(why.starts_with("node node-1: GPU 7"), "{why}");
}

#[test]
fn missing_results_are_incomplete_with_reasons() {
    let mut j = job(JobState::Running, 2, 1);
    j.finished_unix_ms = 0;
    let results: BTreeMap<u32, RankResult> = [(0, stress(0, "X", "aa"))].into_iter().collect();
    let r = build_at(&j, &results, &BTreeMap::new(), 3_000);
    assert_eq!(r.verdict(), Verdict::Incomplete);
    assert_eq!(rank(&r, 1).verdict(), Verdict::Incomplete);
    assert_eq!(rank(&r, 1).reason, "running, no result yet");
    assert_eq!(r.duration_ms, 2_000);
    assert!(r.notes.iter().any(|n| n.contains("partial report")));

    j.state = JobState::Failed as i32;
    j.message = "rank 1 on node node-1 (cuda:0) exited with code 1: boom".into();
    let exits: BTreeMap<u32, WorkerExited> = [(
        1,
        WorkerExited {
            rank: 1,
            exit_code: 1,
            stderr_tail: "first\nboom\n".into(),
            ..Default::default()
        },
    )]
    .into_iter()
    .collect();
    let r = build_at(&j, &results, &exits, 3_000);
    assert_eq!(r.verdict(), Verdict::Fail);
    assert_eq!(r.reason, j.message);
    assert_eq!(
        rank(&r, 1).reason,
        "no result: the worker exited with code 1: boom"
    );
    assert_eq!(r.nodes[1].verdict(), Verdict::Incomplete);

    // A job that never ran still gets a report.
    let mut never = job(JobState::Cancelled, 0, 0);
    never.plan = None;
    never.message = "cancelled by user".into();
    let r = build_with(&never, vec![]);
    assert_eq!(r.verdict(), Verdict::Incomplete);
    assert!(r.nodes.is_empty());
    assert_eq!(r.reason, "cancelled by user");
}

#[test]
fn a_hung_job_fails_only_the_blamed_rank_and_shows_where_each_rank_was() {
    let mut j = job(JobState::Failed, 2, 2);
    j.spec.as_mut().unwrap().hang_timeout_ms = 30_000;
    let h = hang::find(
        &[hang::RankClock {
            rank: 3,
            node: "node-1",
            last_growth_ms: 2_000,
            process: Some(&RankProcess {
                rank: 3,
                state: "T".into(),
                ..Default::default()
            }),
            waiting: false,
        }],
        40_000,
        30_000,
    )
    .unwrap();
    j.message = h.message.clone();
    let mut watch = hang::Watch {
        since_ms: 1_000,
        hung: Some(h),
        ..Default::default()
    };
    watch.grew_ms.insert(0, 4_000);
    watch.processes.insert(
        3,
        RankProcess {
            rank: 3,
            state: "T".into(),
            state_name: "stopped".into(),
            ..Default::default()
        },
    );
    let progress: BTreeMap<u32, RankProgress> = [(
        0,
        RankProgress {
            rank: 0,
            phase: "all_reduce 1MiB".into(),
            iterations: 42,
            ..Default::default()
        },
    )]
    .into_iter()
    .collect();
    // Rank 1's worker was stopped by its agent after the hang.
    let exits: BTreeMap<u32, WorkerExited> = [(
        1,
        WorkerExited {
            rank: 1,
            signal: "SIGTERM".into(),
            stopped_by: gpuctl_proto::pb::StopReason::Hang as i32,
            ..Default::default()
        },
    )]
    .into_iter()
    .collect();
    let r = build(&Inputs {
        job: &j,
        results: &BTreeMap::new(),
        exits: &exits,
        progress: &progress,
        watch: &watch,
        telemetry: &Telemetry::default(),
        rules: &HealthRules::default(),
        perf: &PerfRules::default(),
        now_ms: 40_000,
    });
    assert_eq!(r.hang_timeout_ms, 30_000);
    assert_eq!(r.verdict(), Verdict::Fail);
    assert!(
        r.reason.starts_with("rank 3 on node-1 hung"),
        "{}",
        r.reason
    );
    assert_eq!(rank(&r, 3).verdict(), Verdict::Fail);
    assert!(
        rank(&r, 3).reason.contains("stopped (SIGSTOP?)"),
        "{}",
        rank(&r, 3).reason
    );
    assert_eq!(rank(&r, 3).process_state, "stopped");
    assert_eq!(
        (
            rank(&r, 0).last_phase.as_str(),
            rank(&r, 0).iterations,
            rank(&r, 0).last_progress_unix_ms
        ),
        ("all_reduce 1MiB", 42, 4_000)
    );
    assert_eq!(rank(&r, 2).last_progress_unix_ms, 0);
    assert_eq!(r.nodes[1].verdict(), Verdict::Fail);
    assert_eq!(r.nodes[0].verdict(), Verdict::Pass);
    assert!(
        r.nodes[0]
            .reason
            .contains("stopped when the job failed on node-1"),
        "{}",
        r.nodes[0].reason
    );
    // A job without --hang-timeout reports the default that applied.
    let r = build_with(&job(JobState::Running, 1, 1), vec![]);
    assert_eq!(
        r.hang_timeout_ms,
        gpuctl_core::spec::DEFAULT_HANG_TIMEOUT_MS
    );
}

/// Issue 47: `--pattern search` on two nodes failed both healthy nodes. A
/// job that fails for its request judges no node, whatever its ranks said
/// after the one that found it, and leaves no run in the fleet history.
#[test]
fn a_job_that_failed_for_its_request_judges_no_node() {
    use gpuctl_core::request;
    let why = "node node-0 rank 0 (cuda:0): --pattern search needs 3 nodes or more";
    let failed = |rank: u32, error: String| RankResult {
        rank,
        ok: false,
        error,
        ..Default::default()
    };
    let results = vec![
        failed(0, request::rank_error(why)),
        failed(
            1,
            "node node-0 rank 1 (cuda:1): connection reset by peer".into(),
        ),
    ];
    // Ended by the scheduler at the first such result: ranks 2 and 3 were stopped.
    let mut ended = job(JobState::Failed, 2, 2);
    ended.message = request::job_message(why, "");
    // Every rank in and judged: the results alone say it.
    let mut complete = job(JobState::Running, 2, 2);
    complete.finished_unix_ms = 0;
    let all = [
        results.clone(),
        vec![
            failed(2, request::rank_error(why)),
            failed(3, request::rank_error(why)),
        ],
    ]
    .concat();
    for (j, results) in [(&ended, results), (&complete, all)] {
        let r = build_with(j, results);
        assert_eq!(r.verdict(), Verdict::Fail, "{r:#?}");
        assert!(request::is_job_message(&r.reason), "{}", r.reason);
        assert!(r.reason.contains("needs 3 nodes"), "{}", r.reason);
        let fails: Vec<_> = r
            .findings
            .iter()
            .filter(|f| f.level() == Verdict::Fail)
            .collect();
        assert_eq!(fails.len(), 1, "{:#?}", r.findings);
        assert_eq!(
            (fails[0].metric.as_str(), fails[0].node.as_str()),
            (request::FINDING_METRIC, "")
        );
        for n in &r.nodes {
            assert_eq!(n.verdict(), Verdict::Unspecified, "{n:#?}");
            assert!(n.reason.starts_with("not judged"), "{}", n.reason);
            assert!(n.ranks.iter().all(|k| k.verdict() == Verdict::Unspecified));
        }
        assert!(rank(&r, 1).reason.contains("connection reset"));
        assert!(crate::judge::fleet::runs_of(&r).is_empty());
    }
}

/// A pair's halved direction fails its sender's rank, and so its node.
#[test]
fn a_slow_p2p_direction_fails_its_senders_rank_and_node() {
    use gpuctl_proto::pb::{P2pResult, PeerCopy};
    let mut j = job(JobState::Succeeded, 1, 2);
    j.spec.as_mut().unwrap().workload = "p2p".into();
    let copy = |s: u32, d: u32, gbps: f64| PeerCopy {
        src_rank: s,
        dst_rank: d,
        src_local: s,
        dst_local: d,
        gbps,
        repeat_gbps: gbps,
        wrong: 0,
    };
    let results = (0..2)
        .map(|r| RankResult {
            rank: r,
            ok: true,
            device_name: "NVIDIA H200".into(),
            detail: Some(Detail::P2p(P2pResult {
                bytes: 1 << 28,
                method: "pinned".into(),
                peers: vec![copy(0, 1, 163.5), copy(1, 0, 314.0)],
                ..Default::default()
            })),
            ..Default::default()
        })
        .collect();
    let r = build_with(&j, results);
    assert_eq!(r.verdict(), Verdict::Fail, "{}", r.reason);
    assert_eq!(rank(&r, 0).verdict(), Verdict::Fail);
    assert!(rank(&r, 0).reason.contains("GPU 0 -> GPU 1 163.50 GB/s"));
    assert_eq!(r.nodes[0].verdict(), Verdict::Fail);
    assert!(r.findings.iter().any(|f| f.metric == "p2p_direction"));
}

/// Every finding is one check's answer and says the phase it judged: a
/// preflight check of the plan or of the agent at start, a GPU health rule
/// over the run, a rank's own result.
#[test]
fn every_finding_says_the_phase_it_judged() {
    use gpuctl_proto::pb::{GpuSample, PreflightCheck, TelemetryBatch};
    let mut j = job(JobState::Failed, 2, 1);
    let check = |node: &str, name: &str, verdict: Verdict| PreflightCheck {
        node: node.into(),
        name: name.into(),
        verdict: verdict as i32,
        detail: format!("{name} said so"),
        ..Default::default()
    };
    j.plan.as_mut().unwrap().checks = vec![check("node-0", "shm", Verdict::Warn)];
    j.start_checks = vec![check("node-1", "driver", Verdict::Fail)];
    let mut t = Telemetry::default();
    t.add(
        "node-0",
        TelemetryBatch {
            node: "node-0".into(),
            samples: vec![GpuSample {
                uuid: String::new(),
                xids: vec![79],
                ..gpuctl_testkit::gpu::healthy(0)
            }],
            ..Default::default()
        },
        1,
    );
    let crashed = RankResult {
        rank: 1,
        ok: false,
        error: "CUDA error: an illegal memory access".into(),
        ..Default::default()
    };
    let results: BTreeMap<u32, RankResult> = [(0, stress(0, "X", "aa")), (1, crashed)]
        .into_iter()
        .collect();
    let r = build(&Inputs {
        job: &j,
        results: &results,
        exits: &BTreeMap::new(),
        progress: &BTreeMap::new(),
        watch: &hang::Watch::default(),
        telemetry: &t,
        rules: &HealthRules::default(),
        perf: &PerfRules::default(),
        now_ms: 9_000,
    });
    let said: Vec<(&str, &str, &str)> = r
        .findings
        .iter()
        .map(|f| (f.metric.as_str(), f.rule.as_str(), f.phase.as_str()))
        .collect();
    for want in [
        ("preflight", "shm", "plan"),
        ("preflight", "driver", "start"),
        ("health", "xid", "run"),
        ("result", "", "result"),
    ] {
        assert!(said.contains(&want), "{want:?} not in {said:?}");
    }
    let xid = r.findings.iter().find(|f| f.metric == "health").unwrap();
    assert!(
        xid.detail
            .starts_with("node node-0 GPU 0: health `xid`: critical XID 79"),
        "{}",
        xid.detail
    );
    assert_eq!(
        r.health[0].detail,
        xid.detail.split_once("`xid`: ").unwrap().1
    );
}

/// Issue 51: a job that failed on thousands of nodes named every one of
/// them in the reason of each node it merely stopped: at 16,384 nodes the
/// report was gigabytes and the coordinator was killed for its memory.
#[test]
fn a_job_failed_on_thousands_of_nodes_keeps_each_reason_short() {
    let nodes = 2_000u32;
    let failed: Vec<RankResult> = (0..nodes / 2)
        .map(|rank| RankResult {
            rank,
            ok: false,
            error: "CUDA error: an illegal memory access was encountered".into(),
            ..Default::default()
        })
        .collect();
    // The other half's workers were stopped by their agents (a cancel).
    let exits: BTreeMap<u32, WorkerExited> = (nodes / 2..nodes)
        .map(|rank| {
            let ex = WorkerExited {
                rank,
                signal: "SIGTERM".into(),
                stopped_by: gpuctl_proto::pb::StopReason::Cancel as i32,
                ..Default::default()
            };
            (rank, ex)
        })
        .collect();
    let j = job(JobState::Failed, nodes as usize, 1);
    let results: BTreeMap<u32, RankResult> = failed.into_iter().map(|r| (r.rank, r)).collect();
    let r = build_at(&j, &results, &exits, 9_000);
    let stopped = &r.nodes[nodes as usize - 1];
    assert_eq!(stopped.verdict(), Verdict::Pass, "{}", stopped.reason);
    assert!(
        stopped.reason.ends_with(
            "failed on node-0, node-1, node-2, node-3, node-4, node-5, node-6, node-7 and 992 more"
        ),
        "{}",
        stopped.reason
    );
    let longest = r.nodes.iter().map(|n| n.reason.len()).max().unwrap();
    assert!(longest < 300, "a node's reason of {longest} bytes");
}

/// A coordinator too busy to take a result failed the healthy node whose
/// worker gave up waiting ("rank 27027 on node sim-03378 exited with code
/// 1", 16,384 × 8 on a starved host). The worker now says so by its exit
/// code: that rank is unknown, its node not judged and left out of the
/// fleet history, the job incomplete; every other node is judged as ever.
#[test]
fn a_result_that_did_not_reach_the_coordinator_blames_no_node() {
    use gpuctl_core::retry::outage::UNDELIVERED_EXIT;
    let gave_up = |rank: u32| WorkerExited {
        rank,
        exit_code: UNDELIVERED_EXIT,
        stderr_tail: "ERROR node node-1 rank 1: the result did not reach the coordinator\n".into(),
        ..Default::default()
    };
    let mut j = job(JobState::Running, 3, 1);
    j.finished_unix_ms = 0;
    let results: BTreeMap<u32, RankResult> = [(0, stress(0, "X", "aa")), (2, stress(2, "X", "aa"))]
        .into_iter()
        .collect();
    let exits: BTreeMap<u32, WorkerExited> = [(1, gave_up(1))].into_iter().collect();
    // As the scheduler ends it: failed, with the ranks' own words.
    let (_, why) = ranks_verdict(&build_at(&j, &results, &exits, 3_000));
    j.state = JobState::Failed as i32;
    j.finished_unix_ms = 3_000;
    j.message = why.clone();
    let r = build_at(&j, &results, &exits, 3_000);
    assert_eq!(r.verdict(), Verdict::Incomplete, "{}", r.reason);
    assert_eq!(r.reason, why);
    assert!(
        why.starts_with(
            "1 of 3 ranks' results did not reach the coordinator (rank 1 on node node-1"
        ),
        "{why}"
    );
    assert!(why.contains("no node is blamed"), "{why}");
    assert_eq!(rank(&r, 1).verdict(), Verdict::Unspecified);
    assert!(
        rank(&r, 1).reason.starts_with("unknown: "),
        "{}",
        rank(&r, 1).reason
    );
    let verdicts: Vec<Verdict> = r.nodes.iter().map(|n| n.verdict()).collect();
    assert_eq!(
        verdicts,
        [Verdict::Pass, Verdict::Unspecified, Verdict::Pass]
    );
    assert!(
        r.nodes[1].reason.starts_with("not judged"),
        "{}",
        r.nodes[1].reason
    );
    let unreached: Vec<bool> = r.nodes.iter().map(unreached).collect();
    assert_eq!(unreached, [false, true, false], "what a suite takes as out");
    let runs: Vec<String> = crate::judge::fleet::runs_of(&r)
        .into_iter()
        .map(|run| run.node)
        .collect();
    assert_eq!(runs, ["node-0", "node-2"]);

    // Beside a rank that did fail, the job fails on that one alone.
    let mut bad = stress(2, "X", "aa");
    (bad.ok, bad.error) = (false, "CUDA error: an illegal memory access".into());
    let results: BTreeMap<u32, RankResult> =
        [(0, stress(0, "X", "aa")), (2, bad)].into_iter().collect();
    j.message = String::new();
    let r = build_at(&j, &results, &exits, 3_000);
    assert_eq!(r.verdict(), Verdict::Fail);
    assert!(r.reason.contains("rank 2 on node node-2"), "{}", r.reason);
    assert!(!r.reason.contains("node-1"), "{}", r.reason);
    assert_eq!(r.nodes[1].verdict(), Verdict::Unspecified);

    // A worker its agent stopped, whatever its code, is no such rank.
    let mut stopped = gave_up(1);
    stopped.stopped_by = gpuctl_proto::pb::StopReason::Cancel as i32;
    let exits: BTreeMap<u32, WorkerExited> = [(1, stopped)].into_iter().collect();
    let r = build_at(&j, &results, &exits, 3_000);
    assert_eq!(rank(&r, 1).verdict(), Verdict::Incomplete);
}

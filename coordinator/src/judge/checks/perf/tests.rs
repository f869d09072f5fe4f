//! The three references together on made-up ranks: who is blamed, what is
//! only noted, and what fails by its absence.

use std::collections::BTreeMap;

use gpuctl_proto::pb::Verdict;

use super::finding::score;
use super::*;
use crate::judge::checks::perf::rules::Floor;
use crate::judge::figures::baseline_figures;

fn rank(rank: u32, node: &str, tflops: f64) -> RankFigures {
    RankFigures {
        rank,
        node: node.into(),
        gpu_index: Some(rank % 2),
        gpu_uuid: format!("GPU-{rank}"),
        model: "Test GPU".into(),
        class: "Test GPU · torch 2.11".into(),
        reported: true,
        figures: vec![Figure {
            metric: Metric::StressTflops,
            key: "bf16 8192".into(),
            value: tflops,
        }],
        intervals: 10,
    }
}

fn expected(pairs: &[(Metric, &str)]) -> Expected {
    pairs.iter().map(|(m, k)| (*m, k.to_string())).collect()
}

#[test]
fn fleet_names_the_slow_rank_only() {
    // Four nodes of two GPUs: one vote per node, the median of
    // 652.5, 484, 650.5 and 650.5.
    let ranks: Vec<_> = [650.0, 655.0, 648.0, 320.0, 650.0, 651.0, 649.0, 652.0]
        .iter()
        .enumerate()
        .map(|(i, v)| rank(i as u32, &format!("n{}", i / 2), *v))
        .collect();
    let j = judge(
        &ranks,
        &JobFigures::default(),
        &Expected::new(),
        &PerfRules::default(),
        None,
    );
    let fails: Vec<_> = j
        .findings
        .iter()
        .filter(|f| f.level.verdict() == Verdict::Fail)
        .collect();
    assert_eq!(fails.len(), 1, "{:#?}", j.findings);
    assert_eq!(fails[0].rank, Some(3));
    assert_eq!(fails[0].node, "n1");
    assert_eq!(fails[0].reference_kind, "fleet");
    assert!((fails[0].reference - 650.5).abs() < 1e-9);
    assert!(fails[0].detail.contains("rank 3 on node n1 (GPU 1)"));
    assert!(
        fails[0].rule.contains("4 nodes' medians"),
        "{}",
        fails[0].rule
    );
    assert!(j
        .notes
        .iter()
        .any(|n| n.contains("one vote per node (n0, n1, n2, n3)")));
}

/// What the README's local fleet saw: 8 CPU ranks on 2 cores, two of
/// them at 0.89x of the median. A CPU rank that far under passes, one
/// as slow as a CPU quota makes it fails, and a GPU that far under fails.
/// The with-comm spread measured on healthy H100s (0.896x at worst)
/// passes its own rule from the built-in rules; the same spread of
/// plain stress fails, and a with-comm rank far off still fails.
#[test]
fn stress_beside_an_all_reduce_is_judged_by_its_own_ratios() {
    let rules = PerfRules::default();
    let levels = |metric: Metric, values: [f64; 4]| {
        let ranks: Vec<_> = values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let mut r = rank(i as u32, "n0", *v);
                r.figures[0].metric = metric;
                r
            })
            .collect();
        let j = judge(
            &ranks,
            &JobFigures::default(),
            &Expected::new(),
            &rules,
            None,
        );
        j.findings
            .iter()
            .map(|f| (f.rank.unwrap(), f.level.verdict()))
            .collect::<Vec<_>>()
    };
    let healthy = [524.0, 584.0, 596.0, 585.0];
    assert_eq!(levels(Metric::StressTflopsComm, healthy), []);
    assert_eq!(levels(Metric::StressTflops, healthy), [(0, Verdict::Fail)]);
    assert_eq!(
        levels(Metric::StressTflopsComm, [480.0, 584.0, 596.0, 585.0]),
        [(0, Verdict::Warn)]
    );
    assert_eq!(
        levels(Metric::StressTflopsComm, [450.0, 584.0, 596.0, 585.0]),
        [(0, Verdict::Fail)]
    );
}

/// As measured on 4 x H100 (2026-11-27): another process's GEMMs on GPU
/// 3 took all four ranks to 263-265 TFLOP/s beside the all_reduce, alike;
/// alone, GPU 3's GEMMs are the slow ones. The phase alone names it, and
/// only it.
#[test]
fn stress_with_comm_names_a_slow_gpu_by_its_gemms_alone() {
    use crate::judge::figures::{intervals, rank_figures};
    use gpuctl_proto::pb::{rank_result::Detail, RankResult, StressResult};
    let rules = PerfRules::default();
    let ranks: Vec<RankFigures> = [662.0, 668.0, 665.0, 301.0]
        .iter()
        .enumerate()
        .map(|(i, alone)| {
            let res = RankResult {
                detail: Some(Detail::Stress(StressResult {
                    dtype: "bf16".into(),
                    matrix_size: 8192,
                    with_comm: true,
                    tflops_per_interval: vec![264.0; 9],
                    tflops_median: 264.0,
                    solo_tflops_per_interval: vec![*alone; 6],
                    solo_tflops_median: *alone,
                    ..Default::default()
                })),
                ..Default::default()
            };
            let mut r = rank(i as u32, "n0", 0.0);
            r.figures = rank_figures("stress", &res);
            r.intervals = intervals(&res);
            r
        })
        .collect();
    assert_eq!(ranks[0].intervals, 6);
    let j = judge(
        &ranks,
        &JobFigures::default(),
        &Expected::new(),
        &rules,
        None,
    );
    let named: Vec<_> = j
        .findings
        .iter()
        .map(|f| {
            (
                f.rank.unwrap(),
                f.level.verdict(),
                f.metric.as_str(),
                f.key.as_str(),
            )
        })
        .collect();
    assert_eq!(
        named,
        [
            (3, Verdict::Fail, "stress_tflops", "bf16 8192"),
            (3, Verdict::Fail, "stress_tflops_worst", "bf16 8192"),
        ],
        "{:#?}",
        j.findings
    );
}

#[test]
fn cpu_ranks_have_their_own_fleet_ratios() {
    let cpu = |mut r: RankFigures| {
        r.gpu_index = None;
        r.class = "AMD EPYC · torch 2.11".into();
        r
    };
    let judged = |ranks: &[RankFigures]| {
        let j = judge(
            ranks,
            &JobFigures::default(),
            &Expected::new(),
            &PerfRules::default(),
            None,
        );
        j.findings
            .iter()
            .filter(|f| f.level.verdict() == Verdict::Fail)
            .map(|f| f.rank)
            .collect::<Vec<_>>()
    };
    let speeds = [0.017, 0.017, 0.017, 0.017, 0.017, 0.017, 0.0151, 0.0149];
    let ranks: Vec<_> = speeds
        .iter()
        .enumerate()
        .map(|(i, v)| cpu(rank(i as u32, &format!("n{}", i / 2), *v)))
        .collect();
    assert!(judged(&ranks).is_empty(), "healthy CPU ranks failed");
    let mut slowed = ranks.clone();
    slowed[7].figures[0].value = 0.003;
    assert_eq!(judged(&slowed), [Some(7)]);
    let gpus: Vec<_> = speeds
        .iter()
        .enumerate()
        .map(|(i, v)| rank(i as u32, &format!("n{}", i / 2), *v))
        .collect();
    assert_eq!(judged(&gpus), [Some(6), Some(7)]);
}

#[test]
fn short_stress_runs_are_not_compared_and_the_report_says_so() {
    let mut ranks: Vec<_> = [650.0, 655.0, 648.0, 320.0]
        .iter()
        .enumerate()
        .map(|(i, v)| rank(i as u32, "n", *v))
        .collect();
    for r in &mut ranks {
        r.intervals = 2;
    }
    let j = judge(
        &ranks,
        &JobFigures::default(),
        &Expected::new(),
        &PerfRules::default(),
        None,
    );
    assert!(j.findings.is_empty(), "{:#?}", j.findings);
    assert!(j
        .notes
        .iter()
        .any(|n| n.contains("fewer than 5 sampling intervals")));
}

#[test]
fn fleet_needs_three_ranks_and_says_so() {
    let ranks = vec![rank(0, "a", 600.0), rank(1, "a", 100.0)];
    let j = judge(
        &ranks,
        &JobFigures::default(),
        &Expected::new(),
        &PerfRules::default(),
        None,
    );
    assert!(j.findings.is_empty());
    assert!(j
        .notes
        .iter()
        .any(|n| n.contains("fleet reference not used")));
    // Nothing else judged them: the first note says so, by name.
    assert!(
        j.notes[0].starts_with("judged against nothing")
            && j.notes[0].contains("stress_tflops `bf16 8192`"),
        "{:?}",
        j.notes
    );
    // Four nodes make a fleet reference: nothing is left unjudged.
    let ranks: Vec<_> = ["a", "b", "c", "d"]
        .iter()
        .enumerate()
        .map(|(i, n)| rank(i as u32, n, 600.0))
        .collect();
    let j = judge(
        &ranks,
        &JobFigures::default(),
        &Expected::new(),
        &PerfRules::default(),
        None,
    );
    assert!(
        !j.notes
            .iter()
            .any(|n| n.starts_with("judged against nothing")),
        "{:?}",
        j.notes
    );
}

/// A healthy one-GPU H200 failed `nccl` on its busbw floor (0 GB/s by
/// the formula with one rank).
#[test]
fn busbw_floors_need_two_ranks() {
    let rules = PerfRules {
        floors: vec![Floor {
            gpu: "test gpu".into(),
            metric: "busbw".into(),
            key: "all_reduce 1073741824 float".into(),
            fail: 280.0,
            warn: None,
            single_node: false,
            source: "test".into(),
        }],
        ..PerfRules::default()
    };
    let job = |busbw: f64| JobFigures {
        class: Some("Test GPU · torch 2.11".into()),
        model: Some("Test GPU".into()),
        single_node: Some("n".into()),
        figures: vec![Figure {
            metric: Metric::Busbw,
            key: "all_reduce 1073741824 float".into(),
            value: busbw,
        }],
    };
    let want = expected(&[(Metric::Busbw, "all_reduce 1073741824 float")]);
    let one = judge(&[rank(0, "n", 0.0)], &job(0.0), &want, &rules, None);
    assert!(one.findings.is_empty(), "{:#?}", one.findings);
    assert!(one
        .notes
        .iter()
        .any(|n| n.contains("one rank moves nothing")));
    let two = [rank(0, "n", 0.0), rank(1, "n", 0.0)];
    let slow = judge(&two, &job(100.0), &want, &rules, None);
    assert_eq!(slow.findings.len(), 1, "{:#?}", slow.findings);
}

#[test]
fn floors_fail_and_missing_figures_fail() {
    let rules = PerfRules {
        floors: vec![Floor {
            gpu: "test gpu".into(),
            metric: "stress_tflops".into(),
            key: "bf16 8192".into(),
            fail: 550.0,
            warn: Some(600.0),
            single_node: false,
            source: "test".into(),
        }],
        ..PerfRules::default()
    };
    let mut ranks = vec![
        rank(0, "a", 700.0),
        rank(1, "a", 580.0),
        rank(2, "b", 500.0),
    ];
    ranks.push(RankFigures {
        figures: vec![],
        ..rank(3, "b", 0.0)
    });
    let want = expected(&[(Metric::StressTflops, "bf16 8192")]);
    let j = judge(&ranks, &JobFigures::default(), &want, &rules, None);
    let by_rank: BTreeMap<u32, Verdict> = j
        .findings
        .iter()
        .filter(|f| f.reference_kind == "floor")
        .map(|f| (f.rank.unwrap(), f.level.verdict()))
        .collect();
    assert_eq!(by_rank.get(&0), None);
    assert_eq!(by_rank[&1], Verdict::Warn);
    assert_eq!(by_rank[&2], Verdict::Fail);
    assert_eq!(by_rank[&3], Verdict::Fail, "missing figure fails");
    let missing = j.findings.iter().find(|f| f.rank == Some(3)).unwrap();
    assert!(missing.missing && missing.detail.contains("no stress_tflops bf16 8192"));
    // Not asked for: the floor does not apply to a job of another size.
    let j = judge(
        &ranks[3..],
        &JobFigures::default(),
        &Expected::new(),
        &rules,
        None,
    );
    assert!(j.findings.is_empty());
}

#[test]
fn baseline_per_class_and_job_figures() {
    let healthy: Vec<_> = (0..4).map(|i| rank(i, "a", 650.0)).collect();
    let job = JobFigures {
        class: Some("Test GPU · torch 2.11".into()),
        model: Some("Test GPU".into()),
        single_node: None,
        figures: vec![Figure {
            metric: Metric::Busbw,
            key: "all_reduce 1073741824 float".into(),
            value: 330.0,
        }],
    };
    let b = Baseline {
        name: "h200".into(),
        job_id: "job-1".into(),
        figures: baseline_figures(&healthy, &job),
        ..Default::default()
    };
    assert_eq!(b.figures.len(), 2);
    let mut slow = healthy.clone();
    slow[2].figures[0].value = 500.0;
    let slow_job = JobFigures {
        figures: vec![Figure {
            value: 200.0,
            ..job.figures[0].clone()
        }],
        ..job.clone()
    };
    let j = judge(
        &slow,
        &slow_job,
        &Expected::new(),
        &PerfRules::default(),
        Some(&b),
    );
    let base: Vec<_> = j
        .findings
        .iter()
        .filter(|f| f.reference_kind == "baseline")
        .collect();
    assert_eq!(base.len(), 2, "{base:#?}");
    assert!(base
        .iter()
        .any(|f| f.rank == Some(2) && f.level.verdict() == Verdict::Fail));
    let link = base.iter().find(|f| f.metric == "busbw").unwrap();
    assert_eq!(link.node, "", "a multi-node job figure blames no node");
    // Another device class: the baseline does not apply, and the report says so.
    let mut other = healthy.clone();
    for r in &mut other {
        r.class = "NVIDIA H100 · torch 2.11".into();
    }
    let j = judge(
        &other,
        &JobFigures::default(),
        &Expected::new(),
        &PerfRules::default(),
        Some(&b),
    );
    assert!(j.findings.is_empty());
    assert!(j.notes.iter().any(|n| n.contains("does not apply")));
}

#[test]
fn step_time_is_better_low() {
    assert!(score(Metric::StepMsP99, 200.0, 100.0) < 0.9);
    assert!(score(Metric::StressTflops, 50.0, 100.0) < 0.9);
}

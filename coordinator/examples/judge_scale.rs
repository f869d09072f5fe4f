//! Judges one big healthy stress job as the coordinator does at its end,
//! alone, so that where the judge's time goes can be read without a fleet:
//! `cargo run --release -p gpuctl-coordinator --example judge_scale -- 16384 8`
//! (under `perf record -g` for the stacks). Prints each step's time; the
//! 16,384 × 8 bench (`bench/scale.sh`) is what publishes figures.

use std::collections::BTreeMap;
use std::time::Instant;

use gpuctl_coordinator::jobs::hang::Watch;
use gpuctl_coordinator::judge::checks::health::HealthRules;
use gpuctl_coordinator::judge::checks::perf::rules::PerfRules;
use gpuctl_coordinator::judge::telemetry::Telemetry;
use gpuctl_coordinator::judge::{fleet, report};
use gpuctl_coordinator::store::Batch;
use gpuctl_proto::pb::{
    rank_result::Detail, Job, JobSpec, JobState, PhaseKind, PhaseMark, Plan, RankPlacement,
    RankProgress, RankResult, StressResult,
};

// As the coordinator's binary: glibc's malloc puts other costs on the same work.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const START_MS: u64 = 1_764_800_000_000;
const SECONDS: u64 = 90;

fn main() {
    let mut args = std::env::args().skip(1);
    let nodes: u32 = args.next().map_or(16_384, |a| a.parse().expect("nodes"));
    let per_node: u32 = args.next().map_or(8, |a| a.parse().expect("GPUs a node"));
    let repeats: u32 = args.next().map_or(3, |a| a.parse().expect("repeats"));
    let made = Instant::now();
    let job = job(nodes, per_node);
    let results: BTreeMap<u32, RankResult> = (0..nodes * per_node)
        .map(|r| (r, result(r, per_node)))
        .collect();
    let progress: BTreeMap<u32, RankProgress> = (0..nodes * per_node)
        .map(|r| (r, progress(r, per_node)))
        .collect();
    let telemetry = telemetry(nodes, per_node);
    eprintln!(
        "inputs: {} ranks, {} GPUs' telemetry, made in {} ms",
        results.len(),
        telemetry.gpus(),
        made.elapsed().as_millis()
    );
    let (health, perf) = (HealthRules::default(), PerfRules::default());
    for _ in 0..repeats {
        // The two halves that run side by side in a build, each alone, in
        // this thread's CPU time (the host's other work left out).
        let cpu = gpuctl_core::cpu_time::thread_cpu_us;
        let began = cpu();
        let windows = gpuctl_coordinator::judge::checks::idle::measured_windows(
            "stress",
            job.plan.as_ref().expect("a plan"),
            &results,
        );
        let summarised = telemetry.summarise(&health, &windows);
        let summary_ms = (cpu() - began) / 1000;
        drop((summarised, windows));
        let began = cpu();
        let ranks_alone = report::build_bare(&report::Inputs {
            job: &job,
            results: &results,
            exits: &BTreeMap::new(),
            progress: &progress,
            watch: &Watch::default(),
            telemetry: &Telemetry::default(),
            rules: &health,
            perf: &perf,
            now_ms: START_MS + SECONDS * 1000,
        });
        eprintln!(
            "alone, CPU: telemetry summary {summary_ms} ms, the rest without telemetry {} ms",
            (cpu() - began) / 1000
        );
        drop(ranks_alone);
        let began = Instant::now();
        let (mut report, figures) = report::build_bare(&report::Inputs {
            job: &job,
            results: &results,
            exits: &BTreeMap::new(),
            progress: &progress,
            watch: &Watch::default(),
            telemetry: &telemetry,
            rules: &health,
            perf: &perf,
            now_ms: START_MS + SECONDS * 1000,
        });
        let built = began.elapsed();
        let runs = fleet::runs(&report, &figures);
        let history = runs.iter().fold(Batch::default(), Batch::run);
        let ran = began.elapsed();
        let batch = Batch::default().bare_report(&report);
        let encoded = began.elapsed();
        report::attach(&mut report, results.clone());
        let attached = began.elapsed();
        let verdict = report.verdict;
        drop((report, figures, runs, history, batch));
        eprintln!(
            "verdict {verdict}: built {} ms, runs {} ms, encoded {} ms, attached (with a copy of the results) {} ms, dropped {} ms",
            built.as_millis(),
            (ran - built).as_millis(),
            (encoded - ran).as_millis(),
            (attached - encoded).as_millis(),
            (began.elapsed() - attached).as_millis()
        );
    }
}

fn node(n: u32) -> String {
    format!("sim-{n:05}")
}

fn job(nodes: u32, per_node: u32) -> Job {
    let names: Vec<String> = (0..nodes).map(node).collect();
    let ranks = (0..nodes * per_node)
        .map(|rank| RankPlacement {
            rank,
            local_rank: rank % per_node,
            node_rank: rank / per_node,
            node: names[(rank / per_node) as usize].clone(),
            gpu_index: Some(rank % per_node),
            gpu_uuid: format!("GPU-sim-{:05}-{}", rank / per_node, rank % per_node),
            device_name: "NVIDIA H200".into(),
        })
        .collect();
    Job {
        id: "job-000001".into(),
        state: JobState::Succeeded as i32,
        spec: Some(JobSpec {
            workload: "stress".into(),
            ..Default::default()
        }),
        plan: Some(Plan {
            nodes: names,
            ranks,
            world_size: nodes * per_node,
            ..Default::default()
        }),
        started_unix_ms: START_MS,
        finished_unix_ms: START_MS + SECONDS * 1000,
        attempt: 1,
        ..Default::default()
    }
}

/// A healthy H200's result as `gpuctl-sim` sends it.
fn result(rank: u32, per_node: u32) -> RankResult {
    let tflops: Vec<f64> = (0..16).map(|i| 650.0 + (i % 5) as f64).collect();
    let mark = |phase: &str, s: u64, kind: PhaseKind| PhaseMark {
        phase: phase.into(),
        unix_ms: START_MS + s * 1000,
        iterations: s * 80,
        kind: kind as i32,
    };
    RankResult {
        job_id: "job-000001".into(),
        attempt: 1,
        rank,
        node: node(rank / per_node),
        device: format!("cuda:{}", rank % per_node),
        device_name: "NVIDIA H200".into(),
        gpu_uuid: format!("GPU-sim-{:05}-{}", rank / per_node, rank % per_node),
        ok: true,
        peak_memory_bytes: 3 << 30,
        elapsed_ms: SECONDS * 1000,
        torch_version: "2.11.0+cu130".into(),
        nccl_version: "2.28.3".into(),
        detail: Some(Detail::Stress(StressResult {
            dtype: "bf16".into(),
            matrix_size: 8192,
            iterations: SECONDS * 80,
            tflops_min: 648.0,
            tflops_median: 652.0,
            tflops_max: 655.0,
            tflops_per_interval: tflops,
            digest: "9d3b1f0c5e7a2468".into(),
            checks: SECONDS * 8,
            device_class: "NVIDIA H200 · torch 2.11.0+cu130 · nccl 2.28.3".into(),
            interval_s: SECONDS as f64 / 16.0,
            ..Default::default()
        })),
        phases: vec![
            mark("setup", 0, PhaseKind::Setup),
            mark("warmup", 2, PhaseKind::Warmup),
            mark("measure", 5, PhaseKind::Measured),
            mark("done", SECONDS, PhaseKind::Measured),
        ],
        ..Default::default()
    }
}

fn progress(rank: u32, per_node: u32) -> RankProgress {
    RankProgress {
        rank,
        node: node(rank / per_node),
        phase: "measure".into(),
        fraction: 0.99,
        metrics: [("tflops".to_string(), 652.0)].into_iter().collect(),
        unix_ms: START_MS + (SECONDS - 1) * 1000,
        iterations: SECONDS * 80,
        ..Default::default()
    }
}

/// A sample a second of each GPU through the job, as the agents send it.
fn telemetry(nodes: u32, per_node: u32) -> Telemetry {
    let mut t = Telemetry::default();
    let mut rng = fastrand::Rng::with_seed(7);
    for n in 0..nodes {
        let name = node(n);
        let mut samples = Vec::new();
        for s in 0..SECONDS {
            for g in 0..per_node {
                samples.push(gpuctl_proto::pb::GpuSample {
                    uuid: format!("GPU-sim-{n:05}-{g}"),
                    unix_ms: START_MS + s * 1000,
                    util_gpu: 97.0 + rng.f64() * 3.0,
                    temperature_c: 62.0 + rng.f64() * 6.0,
                    power_w: 680.0 + rng.f64() * 20.0,
                    sm_clock_mhz: 1_830 + rng.u32(0..150),
                    ..gpuctl_testkit::gpu::healthy(g)
                });
            }
        }
        let batch = gpuctl_testkit::gpu::batch(&name, "job-000001", samples);
        t.add(&name, batch, START_MS + SECONDS * 1000);
    }
    t
}

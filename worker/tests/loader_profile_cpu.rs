//! The loader sweep and the operator profile on CPU ranks that are threads
//! of this process (TCP backend, no coordinator): one sweep row per worker
//! count with its host figures, and a profile whose tables name libtorch's
//! operators and whose Chrome trace parses. The profiler is one per process,
//! so the profiled runs here have one rank (the CLI tests profile real
//! processes of several ranks).

mod common;

use common::with_ranks;
use gpuctl_worker::workloads::memory::Memory;
use gpuctl_worker::workloads::models::{gpt::GptConfig, ModelConfig, Precision};
use gpuctl_worker::workloads::train::{
    train, LoaderSweep, Mode, ProfileRun, Quiet, TrainConfig, TrainOutput,
};
use tch::Device;

fn cfg(mode: Mode, dir: Option<&std::path::Path>) -> TrainConfig {
    TrainConfig {
        mode,
        model: ModelConfig {
            name: "cnn".into(),
            precision: Precision::Fp32,
            channels_last: false,
            gpt: GptConfig::cpu(16),
        },
        batch_size: 8,
        steps: 2,
        warmup_steps: 1,
        baseline_steps: 0,
        bucket_bytes: 16 << 10,
        lr: TrainConfig::default_lr("cnn"),
        momentum: 0.9,
        seed: 5,
        data_ranks: 0,
        keep_params: false,
        variant: String::new(),
        loader: (mode == Mode::Ddp).then(|| LoaderSweep {
            workers: vec![0, 2],
            work: 1,
            cpu_us: 0,
            steps: 3,
        }),
        profile: dir.map(|d| ProfileRun {
            steps: 2,
            dir: d.to_path_buf(),
        }),
    }
}

fn run(world: usize, c: TrainConfig) -> Vec<TrainOutput> {
    with_ranks(world, move |comm| {
        let mem = Memory::cpu();
        train(&c, Device::Cpu, Some(comm), &mem, &Quiet)
            .unwrap_or_else(|e| panic!("rank {}: {e:#}", comm.rank()))
    })
}

#[test]
fn ddp_sweeps_the_loader_on_every_rank() {
    let outs = run(2, cfg(Mode::Ddp, None));
    assert_eq!(outs[0].result.param_digest, outs[1].result.param_digest);
    for (r, o) in outs.iter().enumerate() {
        let rows = &o.result.loader;
        assert_eq!(
            rows.iter().map(|s| s.workers).collect::<Vec<_>>(),
            vec![0, 2]
        );
        for s in rows {
            assert!(s.samples_per_s > 0.0, "rank {r}: {s:?}");
            assert!((0.0..=1.0).contains(&s.data_wait_share));
            assert!(s.cpu_cores > 0.0 && s.end_unix_ms >= s.start_unix_ms);
        }
        // With no workers the training thread makes every batch: it waits.
        assert!(rows[0].data_wait_share > 0.0);
        assert!(o.result.profile.is_none());
    }
}

#[test]
fn a_profile_names_operators_and_keeps_a_chrome_trace() {
    let dir = std::env::temp_dir().join(format!("gpuctl-loader-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for mode in [Mode::Ddp, Mode::Fsdp] {
        let o = &run(1, cfg(mode, Some(&dir)))[0];
        let p = o.result.profile.as_ref().expect("a profile");
        assert!(p.error.is_empty(), "{}", p.error);
        let names: Vec<&str> = p.top_cpu.iter().map(|o| o.name.as_str()).collect();
        assert!(names.iter().any(|n| n.starts_with("aten::")), "{names:?}");
        assert!(p.top_cpu.len() <= 10 && p.top_cuda.is_empty());
        assert!(!p.top_memory.is_empty());
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&p.trace_path).unwrap()).unwrap();
        assert!(v["traceEvents"].as_array().is_some_and(|a| a.len() > 10));
        assert!(
            p.trace_path
                .ends_with(&format!("profile-{}-cnn-rank0.json", mode.name())),
            "{}",
            p.trace_path
        );
        assert_eq!(o.result.loader.is_empty(), mode == Mode::Fsdp);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

//! The cap on CPU tensors' host memory (the C++ shim around libtorch's CPU
//! allocator) that keeps maxbatch's search on CPU ranks inside its budget:
//! an allocation past it fails as out of memory instead of growing the
//! process, what is freed is room again, and a search under it ends with the
//! largest batch that fit. Its own test binary: the cap is the process's.

use std::sync::Mutex;

use gpuctl_worker::shim::{cpu_cap_install, cpu_cap_reset_peak, cpu_cap_set, cpu_cap_stats};
use gpuctl_worker::workloads::budget::is_budget;
use gpuctl_worker::workloads::maxbatch::{is_oom, run_search};
use gpuctl_worker::workloads::memory::Memory;
use gpuctl_worker::workloads::models::{gpt::GptConfig, ModelConfig, Precision};
use gpuctl_worker::workloads::train::{Mode, TrainConfig};
use tch::{Device, Kind, Tensor};

/// One test at a time: the cap holds for every thread of the process.
static CAP: Mutex<()> = Mutex::new(());

fn cap() -> std::sync::MutexGuard<'static, ()> {
    CAP.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn an_allocation_past_the_cap_fails_as_out_of_memory_and_frees_are_room_again() {
    let _g = cap();
    cpu_cap_install().unwrap();
    cpu_cap_install().unwrap();
    let (held, _) = cpu_cap_stats();
    cpu_cap_set(held + (64 << 20));
    cpu_cap_reset_peak();
    let a = Tensor::f_zeros([8 << 20], (Kind::Float, Device::Cpu)).unwrap();
    let (with_a, _) = cpu_cap_stats();
    assert!(with_a >= held + (32 << 20), "{held} {with_a}");
    let e = Tensor::f_zeros([16 << 20], (Kind::Float, Device::Cpu))
        .unwrap_err()
        .to_string();
    assert!(is_oom(&e) && is_budget(&e), "{e}");
    // The failed allocation took nothing.
    assert_eq!(cpu_cap_stats().0, with_a);
    drop(a);
    let (after, peak) = cpu_cap_stats();
    assert!(after < with_a && peak >= with_a, "{after} {peak} {with_a}");
    let b = Tensor::f_zeros([12 << 20], (Kind::Float, Device::Cpu)).unwrap();
    assert!(cpu_cap_stats().0 >= held + (48 << 20));
    drop(b);
    cpu_cap_set(0);
    // No cap: anything the host gives.
    let _c = Tensor::f_zeros([32 << 20], (Kind::Float, Device::Cpu)).unwrap();
}

#[test]
fn a_search_under_the_cap_ends_at_the_largest_batch_that_fit() {
    let _g = cap();
    tch::set_num_threads(1);
    cpu_cap_install().unwrap();
    let cfg = TrainConfig {
        mode: Mode::Ddp,
        model: ModelConfig {
            name: "gpt".into(),
            precision: Precision::Fp32,
            channels_last: false,
            gpt: GptConfig::cpu(256),
        },
        batch_size: 1,
        steps: 2,
        warmup_steps: 0,
        baseline_steps: 0,
        bucket_bytes: 1 << 20,
        lr: TrainConfig::default_lr("gpt"),
        momentum: 0.9,
        seed: 7,
        data_ranks: 0,
        keep_params: false,
        variant: "toy".into(),
        loader: None,
        profile: None,
    };
    let (held, _) = cpu_cap_stats();
    cpu_cap_set(held + (96 << 20));
    let s = run_search(&cfg, Device::Cpu, 1, 4096, &Memory::cpu(), &|_, _, _| {});
    cpu_cap_set(0);
    let s = s.unwrap();
    let tried: Vec<(u32, bool)> = s.points.iter().map(|p| (p.batch_size, p.fits)).collect();
    assert!(!s.capped, "{tried:?}");
    assert!(s.max_batch >= 1 && s.max_batch < 4096, "{tried:?}");
    // Each failure was the cap's, and the edge is found: the largest fit
    // is the batch just below the smallest failure (to 1%).
    let failed: Vec<_> = s.points.iter().filter(|p| !p.fits).collect();
    assert!(!failed.is_empty(), "{tried:?}");
    assert!(failed.iter().all(|p| is_budget(&p.error)), "{failed:?}");
    let first_fail = failed.iter().map(|p| p.batch_size).min().unwrap();
    assert!(first_fail > s.max_batch, "{tried:?}");
    assert!(
        first_fail - s.max_batch <= (s.max_batch / 100).max(1),
        "{tried:?}"
    );
}

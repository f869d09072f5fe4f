//! ddp, fsdp and maxbatch on CPU ranks that are threads of this process,
//! talking through the TCP backend (no coordinator): every rank ends with the
//! same parameters, the loss goes down, fsdp computes what ddp computes, and
//! the batch search applies its margin.

mod common;

use common::with_ranks;
use gpuctl_worker::workloads::maxbatch::{recommended, run_search};
use gpuctl_worker::workloads::memory::Memory;
use gpuctl_worker::workloads::models::{gpt::GptConfig, ModelConfig, Precision};
use gpuctl_worker::workloads::train::{train, Mode, Quiet, TrainConfig, TrainOutput};
use tch::{Device, Kind};

fn cfg(mode: Mode, model: &str, precision: Precision, baseline: u64) -> TrainConfig {
    TrainConfig {
        mode,
        model: ModelConfig {
            name: model.into(),
            precision,
            channels_last: false,
            gpt: GptConfig::cpu(16),
        },
        batch_size: if model == "gpt" { 2 } else { 8 },
        steps: 4,
        warmup_steps: 2,
        baseline_steps: baseline,
        bucket_bytes: 16 << 10, // several buckets for the small models
        lr: TrainConfig::default_lr(model),
        momentum: 0.9,
        seed: 99,
        data_ranks: 0,
        keep_params: true,
        variant: String::new(),
        loader: None,
        profile: None,
    }
}

/// Runs `c` on `world` ranks; returns each rank's (digest, params, losses, baseline).
fn run(world: usize, c: TrainConfig) -> Vec<TrainOutput> {
    with_ranks(world, move |comm| {
        let mem = Memory::cpu();
        let out = train(&c, Device::Cpu, Some(comm), &mem, &Quiet)
            .unwrap_or_else(|e| panic!("rank {}: {e:#}", comm.rank()));
        out
    })
}

fn check_trained(outs: &[TrainOutput], what: &str) {
    let d0 = &outs[0].result.param_digest;
    assert_eq!(d0.len(), 16);
    for (r, o) in outs.iter().enumerate() {
        assert_eq!(&o.result.param_digest, d0, "{what}: rank {r} diverged");
        let (first, last) = (o.losses[0], *o.losses.last().unwrap());
        assert!(
            last.is_finite() && last < first,
            "{what}: rank {r} loss did not go down: {:?}",
            o.losses
        );
        assert!(o.result.samples_per_s > 0.0 && o.result.step_ms_p50 > 0.0);
        assert!(o.result.step_ms_p99 >= o.result.step_ms_p50);
        assert_eq!(o.result.final_loss, last);
    }
    // Ranks had different data: their first losses differ, their params do not.
    assert_ne!(
        outs[0].losses[0], outs[1].losses[0],
        "{what}: ranks saw the same batch"
    );
}

#[test]
fn ddp_cnn_ranks_agree_and_learn() {
    let outs = run(3, cfg(Mode::Ddp, "cnn", Precision::Fp32, 2));
    check_trained(&outs, "ddp cnn 3 ranks");
    for o in &outs {
        assert_eq!(o.result.mode, "ddp");
        assert_eq!(o.result.unit, "img");
        assert!(o.baseline_per_s.unwrap() > 0.0);
        assert!(o.scaling_efficiency.unwrap() > 0.0);
        assert!(o.result.comm_ms_per_step > 0.0);
    }
}

#[test]
fn fsdp_matches_ddp_bit_for_bit_on_two_ranks() {
    // ddp with a baseline phase (which must leave no trace) against fsdp without.
    let ddp = run(2, cfg(Mode::Ddp, "cnn", Precision::Fp32, 2));
    let fsdp = run(2, cfg(Mode::Fsdp, "cnn", Precision::Fp32, 0));
    check_trained(&fsdp, "fsdp cnn");
    assert_eq!(fsdp[0].result.mode, "fsdp");
    assert!(
        ddp[0].params.equal(&fsdp[0].params),
        "fsdp and ddp parameters differ"
    );
    assert_eq!(ddp[0].result.param_digest, fsdp[0].result.param_digest);
    assert_eq!(ddp[0].losses, fsdp[0].losses);
}

#[test]
fn fsdp_matches_ddp_on_three_ranks_with_uneven_shards() {
    // Three ranks: sums may be added in another order, so within tolerance.
    let ddp = run(3, cfg(Mode::Ddp, "gpt", Precision::Fp32, 0));
    let fsdp = run(3, cfg(Mode::Fsdp, "gpt", Precision::Fp32, 0));
    check_trained(&ddp, "ddp gpt");
    check_trained(&fsdp, "fsdp gpt");
    assert_eq!(ddp[0].result.unit, "tok");
    let diff = (&ddp[0].params - &fsdp[0].params)
        .abs()
        .max()
        .double_value(&[]);
    assert!(diff < 1e-5, "max |ddp - fsdp| = {diff}");
    // and training moved them: not the initial parameters of a fresh model
    assert!(fsdp[0].params.abs().sum(Kind::Float).double_value(&[]) > 0.0);
}

#[test]
fn bf16_with_fp32_masters_trains_and_agrees() {
    let outs = run(2, cfg(Mode::Ddp, "gpt", Precision::Bf16, 0));
    check_trained(&outs, "ddp gpt bf16");
    assert_eq!(outs[0].result.precision, "bf16");
    assert_eq!(outs[0].params.kind(), Kind::Float);
    let fsdp = run(2, cfg(Mode::Fsdp, "gpt", Precision::Bf16, 0));
    check_trained(&fsdp, "fsdp gpt bf16");
    assert!(outs[0].params.equal(&fsdp[0].params));
}

/// The mean loss over ranks at every step.
fn mean_losses(outs: &[TrainOutput]) -> Vec<f64> {
    let n = outs[0].losses.len();
    (0..n)
        .map(|i| outs.iter().map(|o| o.losses[i]).sum::<f64>() / outs.len() as f64)
        .collect()
}

#[test]
fn ddp_and_fsdp_train_as_one_rank_on_the_whole_batch() {
    // Block-wise backward, buckets per unit, gathers and reduce-scatters
    // change nothing numerically: W ranks of batch b train as one rank on
    // the W batches end to end (gpt: no batch statistics).
    // Four layers: fsdp keeps the last two blocks gathered, so the first two
    // are gathered again for backward, which two layers would never do.
    let four = |mut c: TrainConfig| {
        c.model.gpt.layers = 4;
        c
    };
    for world in [2, 3] {
        let mut single = four(cfg(Mode::Ddp, "gpt", Precision::Fp32, 0));
        single.data_ranks = world;
        single.steps = 6;
        let one = with_ranks(1, move |_| {
            train(&single, Device::Cpu, None, &Memory::cpu(), &Quiet).unwrap()
        });
        let want = &one[0].losses;
        assert!(
            want.last().unwrap() < &want[0],
            "the reference did not learn: {want:?}"
        );
        for mode in [Mode::Ddp, Mode::Fsdp] {
            let mut c = four(cfg(mode, "gpt", Precision::Fp32, 0));
            c.steps = 6;
            let outs = run(world, c);
            check_trained(&outs, &format!("{} on {world}", mode.name()));
            let got = mean_losses(&outs);
            assert_eq!(got.len(), want.len());
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5 * w.abs(),
                    "{} on {world} ranks, step {i}: loss {g} against one rank's {w}",
                    mode.name()
                );
            }
        }
    }
}

#[test]
fn communication_time_and_shard_digests_are_reported() {
    let ddp = run(2, cfg(Mode::Ddp, "gpt", Precision::Fp32, 0));
    let fsdp = run(3, cfg(Mode::Fsdp, "gpt", Precision::Fp32, 0));
    for o in ddp.iter().chain(&fsdp) {
        let r = &o.result;
        assert!(r.comm_ms_per_step > 0.0, "{r:?}");
        // The TCP backend runs collectives when called: nothing is hidden.
        assert!(r.comm_exposed_ms_per_step > 0.0);
        assert!(r.comm_exposed_ms_per_step <= r.comm_ms_per_step);
        assert!((0.0..=1.0).contains(&r.overlap_share));
    }
    assert!(ddp[0].result.shard_digest.is_empty());
    let g0 = &fsdp[0].result.gathered_shard_digests;
    assert_eq!(g0.len(), 3);
    for (r, o) in fsdp.iter().enumerate() {
        assert_eq!(
            &o.result.gathered_shard_digests, g0,
            "rank {r} gathered other shards"
        );
        assert_eq!(o.result.shard_digest, g0[r], "rank {r}'s own shard");
    }
    assert_ne!(g0[0], g0[1]);
}

#[test]
fn maxbatch_on_cpu_stops_at_the_limit_with_margin() {
    let mut c = cfg(Mode::Ddp, "cnn", Precision::Fp32, 0);
    c.steps = 2;
    tch::set_num_threads(1);
    let mem = Memory::cpu();
    let s = run_search(&c, Device::Cpu, 2, 12, &mem, &|_, _, _| {}).unwrap();
    let batches: Vec<u32> = s.points.iter().map(|p| p.batch_size).collect();
    assert_eq!(batches, vec![2, 4, 8, 12]);
    assert!(s
        .points
        .iter()
        .all(|p| p.fits && p.error.is_empty() && p.peak_memory_bytes > 0));
    assert!(s.capped);
    assert_eq!(s.max_batch, 12);
    assert_eq!(recommended(s.max_batch, 0.1), 10);
}

//! The models' tests: parameter counts, stages and units, seeds, layouts.

use super::*;

fn cfg(name: &str) -> ModelConfig {
    ModelConfig {
        name: name.into(),
        precision: Precision::Fp32,
        channels_last: false,
        gpt: gpt::GptConfig::cpu(16),
    }
}

/// Every model (gpt at its toy size).
const ALL: [&str; 5] = ["cnn", "gpt", "mobilenet_v2", "resnet18", "resnet50"];

/// `f` with libtorch's global generator seeded and held (dropout draws).
fn seeded<T>(seed: i64, f: impl FnOnce() -> T) -> T {
    let _rng = BUILD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    tch::manual_seed(seed);
    f()
}

#[test]
fn same_seed_same_model_and_batch() {
    for name in ALL {
        let a = Model::build(&cfg(name), Device::Cpu, 7).unwrap();
        let b = Model::build(&cfg(name), Device::Cpu, 7).unwrap();
        let (va, vb) = (a.vs.variables(), b.vs.variables());
        assert_eq!(va.len(), vb.len(), "{name}");
        for (n, x) in &va {
            assert!(x.equal(&vb[n]), "{name}: {n}");
        }
        let (ba, bb) = (a.batch(2, 3).unwrap(), a.batch(2, 3).unwrap());
        assert!(ba.x.equal(&bb.x) && ba.y.equal(&bb.y));
        assert!(!ba.x.equal(&a.batch(2, 4).unwrap().x));
        let la = seeded(5, || a.loss(&ba).unwrap().double_value(&[]));
        let lb = seeded(5, || b.loss(&bb).unwrap().double_value(&[]));
        assert!(la.is_finite() && la > 0.0, "{name}: {la}");
        assert_eq!(la, lb, "{name}");
        let c = Model::build(&cfg(name), Device::Cpu, 8).unwrap();
        let vc = c.vs.variables();
        assert!(
            va.iter().any(|(n, x)| !x.equal(&vc[n])),
            "{name}: another seed, the same model"
        );
    }
}

#[test]
fn parameter_counts_are_the_catalogues() {
    // The planner's memory check weighs the catalogue's counts.
    for name in [
        "mobilenet_v2",
        "resnet18",
        "resnet50",
        "resnet101",
        "resnet152",
    ] {
        let m = Model::build(&cfg(name), Device::Cpu, 1).unwrap();
        let want = gpuctl_core::catalogue::model_parameters(name).unwrap();
        assert_eq!(m.parameter_count() as u64, want, "{name}");
    }
    assert_eq!(
        gpuctl_core::catalogue::model_parameters("mobilenet_v2"),
        Some(3_504_872)
    );
    // cnn: convs 27·32 + 288·64 + 576·128, BNs 2·(32+64+128), fc 128·10 + 10.
    let m = Model::build(&cfg("cnn"), Device::Cpu, 1).unwrap();
    assert_eq!(m.parameter_count(), 94_762);
    let m = Model::build(&cfg("mobilenet_v2"), Device::Cpu, 1).unwrap();
    let b = m.batch(1, 2).unwrap();
    let l = seeded(2, || m.loss(&b).unwrap().double_value(&[]));
    assert!(l.is_finite() && l > 0.0, "{l}");
}

#[test]
fn staged_vision_models_are_tchs() {
    // Same names, values and forward (train mode, running statistics
    // included) as tch's vision models from the same seed.
    type Tch = fn(&nn::Path) -> Box<dyn nn::ModuleT>;
    let models: [(&str, Tch); 3] = [
        ("resnet18", |p| {
            Box::new(tch::vision::resnet::resnet18(p, 1000))
        }),
        ("resnet50", |p| {
            Box::new(tch::vision::resnet::resnet50(p, 1000))
        }),
        ("mobilenet_v2", |p| {
            Box::new(tch::vision::mobilenet::v2(p, 1000))
        }),
    ];
    for (name, theirs) in models {
        let (vt, net) = seeded(3, || {
            let vs = nn::VarStore::new(Device::Cpu);
            let net = theirs(&vs.root());
            (vs, net)
        });
        let ours = Model::build(&cfg(name), Device::Cpu, 3).unwrap();
        let (a, b) = (vt.variables(), ours.vs.variables());
        assert_eq!(a.len(), b.len(), "{name}");
        for (n, x) in &a {
            let y = b.get(n).unwrap_or_else(|| panic!("{name}: no {n}"));
            assert!(x.equal(y), "{name}: {n}");
        }
        let x = seeded(4, || {
            Tensor::randn([2, 3, 64, 64], (Kind::Float, Device::Cpu))
        });
        let want = seeded(6, || net.forward_t(&x, true));
        let got = seeded(6, || match &ours.net {
            Net::Vision(v) => v.forward(&x).unwrap(),
            Net::Gpt(_) => unreachable!(),
        });
        assert_eq!(got.size(), [2, 1000]);
        assert!(got.allclose(&want, 1e-5, 1e-6, false), "{name}");
        for (n, x) in &a {
            assert!(x.allclose(&b[n], 1e-5, 1e-6, false), "{name}: {n}");
        }
    }
}

/// Gradients are undefined or zero outside unit `used`, nonzero for every
/// variable of it (`whole`, a block) or for some (the stem and the head share
/// the root unit); then zeroed.
fn check_grads(m: &Model, used: usize, whole: bool, what: &str) {
    for (u, vars) in m.units().iter().enumerate() {
        let mut some = false;
        for (i, v) in vars.iter().enumerate() {
            let g = v.grad();
            let nonzero = g.defined() && g.abs().sum(Kind::Double).double_value(&[]) > 0.0;
            some |= nonzero;
            if u != used || whole {
                assert_eq!(nonzero, u == used, "{what}: unit {u} variable {i}");
            }
            if g.defined() {
                let _ = g.shallow_clone().zero_();
            }
        }
        assert!(u != used || some, "{what}: no gradient in unit {u}");
    }
}

/// `(y · r).sum()` for a seeded random `r`: a plain sum would give no
/// gradient through a train-mode BatchNorm.
fn weighted_sum(y: &Tensor) -> Tensor {
    let r = seeded(9, || Tensor::randn(y.size(), (Kind::Float, Device::Cpu)));
    (y * r).sum(Kind::Float)
}

#[test]
fn units_partition_the_variables_and_blocks_use_only_theirs() {
    let blocks = [3, 2, 17, 8, 16];
    for (name, n) in ALL.into_iter().zip(blocks) {
        let m = Model::build(&cfg(name), Device::Cpu, 2).unwrap();
        assert_eq!(m.blocks(), n, "{name}");
        let units = m.units();
        assert_eq!(units.len(), n + 1, "{name}");
        assert!(units.iter().all(|u| !u.is_empty()), "{name}: an empty unit");
        let mut ptrs: Vec<usize> = units
            .iter()
            .flatten()
            .map(|t| t.data_ptr() as usize)
            .collect();
        let all = m.vs.trainable_variables().len();
        ptrs.sort();
        ptrs.dedup();
        assert_eq!(ptrs.len(), all, "{name}: each trainable variable once");
        let n_units: usize = units.iter().map(Vec::len).sum();
        assert_eq!(n_units, all, "{name}");

        // Small images keep the CPU time down (every model pools globally).
        let b = if m.is_gpt() {
            m.batch(2, 1).unwrap()
        } else {
            let side = if name == "cnn" { 32 } else { 64 };
            Batch {
                x: seeded(1, || {
                    Tensor::randn([2, 3, side, side], (Kind::Float, Device::Cpu))
                }),
                y: Tensor::from_slice(&[1i64, 2]),
                size: 2,
            }
        };
        let mut x = m.stem(&b).unwrap();
        if name == "cnn" {
            assert!(x.equal(&b.x) && !x.requires_grad(), "the identity stem");
        } else {
            weighted_sum(&x).backward();
            check_grads(&m, 0, false, &format!("{name} stem"));
        }
        for k in 0..n {
            let input = x.detach().set_requires_grad(true);
            let y = m.block(k, &input).unwrap();
            weighted_sum(&y).backward();
            check_grads(&m, k + 1, true, &format!("{name} block {k}"));
            assert!(
                input.grad().defined(),
                "{name} block {k}: no input gradient"
            );
            x = y.detach();
        }
        let input = x.set_requires_grad(true);
        // Under the lock: mobilenet_v2's dropout draws.
        seeded(2, || m.head_loss(&input, &b).unwrap()).backward();
        check_grads(&m, 0, false, &format!("{name} head"));
        assert!(input.grad().defined(), "{name} head: no input gradient");
    }
}

#[test]
fn gpt_sizes_count_their_parameters() {
    use gpt::GptConfig;
    for size in gpuctl_core::catalogue::GPT_SIZES {
        assert!(GptConfig::sized(size, 64).is_ok(), "{size}");
    }
    let e = GptConfig::sized("7b", 64).unwrap_err().to_string();
    assert!(e.contains("7b") && e.contains("1.3b"), "{e}");
    assert_eq!(
        GptConfig::sized("124m", 1024).unwrap(),
        GptConfig::gpu(1024)
    );
    assert_eq!(GptConfig::sized("toy", 32).unwrap(), GptConfig::cpu(32));
    for (size, seq) in [("toy", 16), ("124m", 64)] {
        let mut c = cfg("gpt");
        c.gpt = GptConfig::sized(size, seq).unwrap();
        let m = Model::build(&c, Device::Cpu, 1).unwrap();
        // The planner weighs gpt by the catalogue's formula: it must count
        // what the worker builds.
        let want = gpuctl_core::catalogue::gpt_parameters(size, seq as u64).unwrap();
        assert_eq!(m.parameter_count() as u64, want, "{size}");
    }
    // By the formula, at 1024 positions (too large to build here).
    let p = |s| gpuctl_core::catalogue::gpt_parameters(s, 1024).unwrap();
    assert_eq!(p("350m"), 354_871_296);
    assert_eq!(p("1.3b"), 1_313_722_368);
    assert_eq!(p("2.7b"), 2_649_052_160);
}

#[test]
fn mobilenet_v2_keeps_the_compute_type_to_the_classifier() {
    // tch's own v2 pooled into fp32 and failed in bf16 on H200s.
    let _rng = BUILD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    tch::manual_seed(0);
    let mut vs = nn::VarStore::new(Device::Cpu);
    let net = mobilenet::v2(&vs.root(), 1000);
    vs.bfloat16();
    let x = Tensor::randn([2, 3, 64, 64], (Kind::BFloat16, Device::Cpu));
    let y = net.forward(&x).unwrap();
    assert_eq!(y.kind(), Kind::BFloat16);
    assert_eq!(y.size(), vec![2, 1000]);
}

#[test]
fn channels_last_keeps_values_and_changes_strides() {
    let mut c = cfg("cnn");
    c.channels_last = true;
    let m = Model::build(&c, Device::Cpu, 7).unwrap();
    let plain = Model::build(&cfg("cnn"), Device::Cpu, 7).unwrap();
    let w4: Vec<_> =
        m.vs.trainable_variables()
            .into_iter()
            .filter(|t| t.dim() == 4)
            .collect();
    assert!(!w4.is_empty());
    for w in &w4 {
        assert!(!w.is_contiguous(), "{:?}", w.stride());
    }
    let b = m.batch(2, 1).unwrap();
    let (l1, l2) = (
        m.loss(&b).unwrap().double_value(&[]),
        plain
            .loss(&plain.batch(2, 1).unwrap())
            .unwrap()
            .double_value(&[]),
    );
    assert!((l1 - l2).abs() < 1e-4, "{l1} vs {l2}");
}

#[test]
fn normals_look_normal() {
    let mut r = SplitMix64::new(1);
    let v: Vec<f32> = (0..5000)
        .flat_map(|_| {
            let (a, b) = r.normal_pair();
            [a, b]
        })
        .collect();
    let mean = v.iter().sum::<f32>() / v.len() as f32;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / v.len() as f32;
    assert!(
        mean.abs() < 0.05 && (var - 1.0).abs() < 0.05,
        "{mean} {var}"
    );
}

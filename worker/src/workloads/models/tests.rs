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

#[test]
fn same_seed_same_model_and_batch() {
    for name in ["cnn", "gpt"] {
        let a = Model::build(&cfg(name), Device::Cpu, 7).unwrap();
        let b = Model::build(&cfg(name), Device::Cpu, 7).unwrap();
        for (x, y) in
            a.vs.trainable_variables()
                .iter()
                .zip(b.vs.trainable_variables())
        {
            assert!(x.equal(&y), "{name}");
        }
        let (ba, bb) = (a.batch(2, 3).unwrap(), a.batch(2, 3).unwrap());
        assert!(ba.x.equal(&bb.x) && ba.y.equal(&bb.y));
        assert!(!ba.x.equal(&a.batch(2, 4).unwrap().x));
        let l = a.loss(&ba).unwrap().double_value(&[]);
        assert!(l.is_finite() && l > 0.0, "{name}: {l}");
    }
}

#[test]
fn mobilenet_v2_has_torchvisions_parameter_count() {
    // The planner's memory check weighs the catalogue's counts.
    for name in ["mobilenet_v2", "resnet18"] {
        let m = Model::build(&cfg(name), Device::Cpu, 1).unwrap();
        let want = gpuctl_proto::catalogue::model_parameters(name).unwrap();
        assert_eq!(m.parameter_count() as u64, want, "{name}");
    }
    assert_eq!(
        gpuctl_proto::catalogue::model_parameters("mobilenet_v2"),
        Some(3_504_872)
    );
    let m = Model::build(&cfg("mobilenet_v2"), Device::Cpu, 1).unwrap();
    let l = m.loss(&m.batch(1, 2).unwrap()).unwrap().double_value(&[]);
    assert!(l.is_finite() && l > 0.0, "{l}");
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

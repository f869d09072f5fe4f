//! Figures read out of made-up results: device classes, keys and the models
//! of a list, each as a baseline or floor would look them up.

use gpuctl_proto::pb::TrainResult;

use super::train::train_key_of;
use super::*;

#[test]
fn a_device_class_names_the_model_and_its_libraries() {
    let r = |torch: &str, nccl: &str| RankResult {
        device_name: "NVIDIA H200".into(),
        torch_version: torch.into(),
        nccl_version: nccl.into(),
        ..Default::default()
    };
    assert_eq!(
        device_class(&r("2.11.0", "2.28.3")),
        "NVIDIA H200 · torch 2.11.0 · 2.28.3"
    );
    assert_eq!(device_class(&r("", "")), "NVIDIA H200");
    assert_eq!(device_class(&r("", "2.28.3")), "NVIDIA H200 · 2.28.3");
    assert_eq!(slow_tenth(&[5.0, 1.0, 4.0]), 1.0);
    let mut v: Vec<f64> = (0..20).map(|i| 600.0 + i as f64).collect();
    v[7] = 300.0; // one interval's dip among 20 is not the figure
    assert_eq!(slow_tenth(&v), 600.0);
    v[3] = 310.0; // a tenth of them is
    assert_eq!(slow_tenth(&v), 310.0);
    assert_eq!(stress_key("bf16", 8192, false), "bf16 8192");
    assert_eq!(stress_key("bf16", 8192, true), "bf16 8192 with_comm");
}

#[test]
fn a_loader_sweep_is_judged_on_its_best_setting() {
    let setting = |workers, per_s| gpuctl_proto::pb::LoaderSetting {
        workers,
        work: 2,
        samples_per_s: per_s,
        ..Default::default()
    };
    let t = TrainResult {
        model: "mobilenet_v2".into(),
        mode: "ddp".into(),
        precision: "bf16".into(),
        batch_size: 64,
        loader: vec![setting(0, 300.0), setting(4, 900.0), setting(8, 850.0)],
        ..Default::default()
    };
    let r = RankResult {
        detail: Some(Detail::Train(t)),
        ..Default::default()
    };
    assert_eq!(
        rank_figures("ddp", &r),
        vec![Figure {
            metric: Metric::LoaderSamplesPerS,
            key: "loader ddp mobilenet_v2 bf16 batch 64 work 2".into(),
            value: 900.0,
        }]
    );
    assert!(Metric::LoaderSamplesPerS.per_rank());
    let spec = JobSpec {
        workload: "ddp".into(),
        params: [
            ("model", "mobilenet_v2"),
            ("batch_size", "64"),
            ("loader_workers", "0,4,8"),
            ("loader_work", "2"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        ..Default::default()
    };
    assert!(expected(&spec, true, 1).contains(&(
        Metric::LoaderSamplesPerS,
        "loader ddp mobilenet_v2 bf16 batch 64 work 2".to_string()
    )));
}

#[test]
fn every_model_of_a_list_has_its_figures() {
    let train = |model: &str, per_s: f64| TrainResult {
        model: model.into(),
        mode: "ddp".into(),
        precision: "fp32".into(),
        batch_size: 2,
        samples_per_s: per_s,
        step_ms_p99: 10.0,
        baseline_samples_per_s: per_s * 1.1,
        scaling_efficiency: 0.9,
        ..Default::default()
    };
    let results: BTreeMap<u32, RankResult> = (0..2)
        .map(|rank| {
            let r = RankResult {
                rank,
                ok: true,
                detail: Some(Detail::Train(train("cnn", 100.0))),
                more_train: vec![train("mobilenet_v2", 5.0)],
                ..Default::default()
            };
            (rank, r)
        })
        .collect();
    let keys = |figs: &[Figure]| -> BTreeSet<(Metric, String)> {
        figs.iter().map(|f| (f.metric, f.key.to_string())).collect()
    };
    let solo = keys(&rank_figures("ddp", &results[&0]));
    assert_eq!(
        solo,
        [
            (Metric::SoloSamplesPerS, "ddp cnn fp32 batch 2".to_string()),
            (
                Metric::SoloSamplesPerS,
                "ddp mobilenet_v2 fp32 batch 2".to_string()
            ),
        ]
        .into()
    );
    let job = job_figures(
        "ddp",
        &results.values().collect::<Vec<_>>(),
        &[],
        &["a".into()],
    );
    let spec = JobSpec {
        workload: "ddp".into(),
        params: [
            ("model".to_string(), "cnn,mobilenet_v2".to_string()),
            ("batch_size".to_string(), "2".to_string()),
        ]
        .into(),
        ..Default::default()
    };
    // What the spec asks for is what the job produced, model by model.
    let mut made = keys(&job.figures);
    made.extend(solo);
    assert_eq!(made, expected(&spec, false, 2));
    let rate = |model: &str| {
        job.figures
            .iter()
            .find(|f| f.metric == Metric::SamplesPerS && f.key.contains(model))
            .map(|f| f.value)
    };
    assert_eq!(
        (rate("cnn"), rate("mobilenet_v2")),
        (Some(100.0), Some(5.0))
    );
}

#[test]
fn a_gpt_is_keyed_by_its_size() {
    let t = TrainResult {
        model: "gpt".into(),
        variant: "1.3b".into(),
        mode: "fsdp".into(),
        precision: "bf16".into(),
        batch_size: 8,
        ..Default::default()
    };
    assert_eq!(train_key_of(&t, "fsdp"), "fsdp gpt 1.3b bf16 batch 8");
    let spec = |size: &str| JobSpec {
        workload: "fsdp".into(),
        params: [
            ("model".to_string(), "gpt".to_string()),
            ("gpt_size".to_string(), size.to_string()),
        ]
        .into(),
        ..Default::default()
    };
    let keys = |size| -> BTreeSet<String> {
        expected(&spec(size), true, 2)
            .into_iter()
            .map(|(_, k)| k)
            .collect()
    };
    assert_eq!(keys("1.3b"), [train_key_of(&t, "fsdp")].into());
    assert_eq!(
        keys("2.7b"),
        ["fsdp gpt 2.7b bf16 batch 4".to_string()].into()
    );
}

#[test]
fn judged_sizes_take_the_large_ones_or_the_largest() {
    assert_eq!(
        judged_sizes(&[1 << 20, 64 << 20, 128 << 20]),
        vec![64 << 20, 128 << 20]
    );
    assert_eq!(judged_sizes(&[1 << 20, 16 << 20]), vec![16 << 20]);
    assert!(judged_sizes(&[]).is_empty());
}

//! The typed parameters' tests: defaults per device, model lists, GPT's
//! sizes, and errors that name the flag.

use super::*;

fn build(workload: &str, pairs: &[(&str, &str)], gpu: bool) -> Result<TypedParams, SpecError> {
    let given = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    TypedParams::build(workload, &given, gpu)
}

#[test]
fn every_workload_builds_from_defaults_on_both_devices() {
    for w in ["stress", "nccl", "ddp", "fsdp", "maxbatch", "p2p"] {
        for gpu in [true, false] {
            build(w, &[], gpu).unwrap_or_else(|e| panic!("{w} gpu={gpu}: {e}"));
        }
    }
}

#[test]
fn defaults_depend_on_the_device() {
    let TypedParams::Stress(s) = build("stress", &[], true).unwrap() else {
        panic!()
    };
    assert_eq!((s.size, s.precision.as_str()), (8192, "bf16"));
    assert_eq!(s.interval, Duration::from_secs(1));
    let TypedParams::Stress(s) = build("stress", &[], false).unwrap() else {
        panic!()
    };
    assert_eq!(
        (s.size, s.precision.as_str(), s.check_every),
        (256, "fp32", 10)
    );
    let TypedParams::Nccl(n) = build("nccl", &[], false).unwrap() else {
        panic!()
    };
    assert_eq!(
        (n.min_bytes, n.max_bytes, n.ops.len()),
        (1 << 20, 16 << 20, 7)
    );
    assert_eq!(n.pattern, NcclPattern::All);
    let TypedParams::Nccl(n) = build("nccl", &[("pattern", "pairs")], true).unwrap() else {
        panic!()
    };
    assert_eq!(n.pattern, NcclPattern::Pairs);
    let TypedParams::Nccl(n) = build("nccl", &[("pattern", "bisect")], true).unwrap() else {
        panic!()
    };
    assert_eq!(n.pattern, NcclPattern::Bisect);
    assert!(build("nccl", &[("pattern", "bisect"), ("max_bytes", "64K")], true).is_ok());
    // min_bytes does not apply to pairs: below it is fine there only.
    let small = [("pattern", "pairs"), ("max_bytes", "64K")];
    assert!(build("nccl", &small, true).is_ok());
    assert_eq!(
        build("nccl", &small[1..], true).unwrap_err().field,
        "--min-bytes"
    );
    assert_eq!(
        build("nccl", &[("pattern", "ring")], true)
            .unwrap_err()
            .field,
        "--pattern"
    );
    let TypedParams::Ddp(t) = build("ddp", &[], true).unwrap() else {
        panic!()
    };
    assert_eq!(t.models.len(), 1);
    assert_eq!(
        (
            t.models[0].model.model.as_str(),
            t.models[0].batch_size,
            t.steps
        ),
        ("resnet50", 256, 30)
    );
    assert!(t.channels_last);
    let TypedParams::Fsdp(t) = build("fsdp", &[("model", "gpt")], false).unwrap() else {
        panic!()
    };
    let m = &t.models[0];
    assert_eq!((m.batch_size, t.steps, m.model.seq_len), (4, 5, 32));
    let TypedParams::MaxBatch(m) = build("maxbatch", &[], false).unwrap() else {
        panic!()
    };
    assert_eq!((m.limit, m.start, m.margin), (64, 8, 0.1));
}

#[test]
fn model_lists_keep_their_order_and_batches() {
    let TypedParams::Ddp(t) =
        build("ddp", &[("model", "cnn, resnet18,mobilenet_v2")], false).unwrap()
    else {
        panic!()
    };
    let got: Vec<(&str, u64)> = t
        .models
        .iter()
        .map(|m| (m.model.model.as_str(), m.batch_size))
        .collect();
    assert_eq!(got, [("cnn", 8), ("resnet18", 2), ("mobilenet_v2", 2)]);
    let TypedParams::Fsdp(t) =
        build("fsdp", &[("model", "cnn,gpt"), ("batch_size", "32")], true).unwrap()
    else {
        panic!()
    };
    assert!(t.models.iter().all(|m| m.batch_size == 32));
    assert_eq!(t.models[1].model.model, "gpt");
    for (list, why) in [
        ("cnn,nope", "`nope` is not one of"),
        ("cnn,cnn", "given twice"),
        ("cnn,", "`` is not one of"),
        ("all", "`all` is not one of"),
    ] {
        let e = build("ddp", &[("model", list)], true).unwrap_err();
        assert_eq!(e.field, "--model", "{e}");
        assert!(e.message.contains(why), "{list}: {e}");
    }
    let nine = [crate::catalogue::MODELS, &["resnet18", "cnn"]]
        .concat()
        .join(",");
    let e = build("ddp", &[("model", &nine)], true).unwrap_err();
    assert!(e.message.contains("given twice"), "{e}");
    // maxbatch keeps one model.
    assert_eq!(
        build("maxbatch", &[("model", "cnn,gpt")], true)
            .unwrap_err()
            .field,
        "--model"
    );
    assert!(build("maxbatch", &[("model", "mobilenet_v2")], true).is_ok());
}

#[test]
fn loader_workers_auto_is_left_to_the_rank() {
    let sweep = |v: &str| match build("ddp", &[("loader_workers", v)], true).unwrap() {
        TypedParams::Ddp(t) => (t.loader_workers, t.loader_auto),
        _ => panic!(),
    };
    assert_eq!(sweep("0,2,8"), (vec![0, 2, 8], false));
    assert_eq!(sweep("auto"), (vec![], true));
}

#[test]
fn gpt_is_weighed_and_batched_by_its_size() {
    let TypedParams::Fsdp(t) = build(
        "fsdp",
        &[("model", "gpt,resnet50"), ("gpt_size", "1.3b")],
        true,
    )
    .unwrap() else {
        panic!()
    };
    let (gpt, resnet) = (&t.models[0], &t.models[1]);
    assert_eq!((gpt.batch_size, gpt.model.seq_len), (8, 1024));
    let n = gpt.model.parameters().unwrap();
    assert!((1_300_000_000..1_330_000_000).contains(&n), "{n}");
    // 1.3b's root (embeddings of 51328 tokens and positions) outweighs a block.
    assert_eq!(
        gpt.model.largest_unit_parameters(),
        Some((50304 + 1024) * 2048 + 2 * 2048)
    );
    // The size is gpt's alone.
    assert_eq!(resnet.batch_size, 256);
    assert_eq!(resnet.model.parameters(), Some(25_557_032));
    assert_eq!(resnet.model.largest_unit_parameters(), None);
    let TypedParams::Ddp(t) = build("ddp", &[("model", "cnn,gpt")], false).unwrap() else {
        panic!()
    };
    assert_eq!(t.models[0].model.parameters(), None);
    assert_eq!(t.models[1].model.gpt_size, "toy");
    assert_eq!(t.models[1].model.parameters(), gpt_parameters("toy", 32));
    // The toy's blocks outweigh its root.
    assert_eq!(
        t.models[1].model.largest_unit_parameters(),
        Some(12 * 64 * 64 + 13 * 64)
    );
    assert_eq!(
        build("ddp", &[("model", "gpt"), ("gpt_size", "7b")], true)
            .unwrap_err()
            .field,
        "--gpt-size"
    );
}

#[test]
fn errors_name_the_flag() {
    let e = build("nccl", &[("min_bytes", "32M")], false).unwrap_err();
    assert_eq!(e.field, "--min-bytes", "{e}");
    assert!(build("nccl", &[("min_bytes", "32M")], true).is_ok());
    assert_eq!(
        build("stress", &[("size", "8")], true).unwrap_err().field,
        "--size"
    );
    assert_eq!(
        build("stress", &[("factor", "2")], true).unwrap_err().field,
        "--param factor"
    );
    let TypedParams::Stress(s) = build("stress", &[("with_comm", "yes")], true).unwrap() else {
        panic!()
    };
    assert!(s.with_comm);
}

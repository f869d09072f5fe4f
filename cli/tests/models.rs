//! `ddp --model a,b` on a real local fleet (CPU): both models train one after
//! another in the same workers, every rank reports each with its own figures
//! (parameters, peaks, every step time) and its phase timeline, and the table
//! report compares them. A model the build does not know is refused at submit.

mod common;

use common::*;
use serde_json::Value;

/// Trainable parameters: the small CNN (3 conv+BN layers, a 128→10 linear)
/// and torchvision's MobileNetV2 with 1000 classes.
const CNN_PARAMETERS: u64 = 94_762;
const MOBILENET_V2_PARAMETERS: u64 = 3_504_872;
const STEPS: usize = 3;

fn u64_at(v: &Value, path: &str) -> u64 {
    v.pointer(path)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no {path} in {v}"))
}

/// One model's result of one rank, checked.
fn check_model(t: &Value, model: &str, parameters: u64) {
    assert_eq!(t["model"], model, "{t}");
    assert_eq!(t["mode"], "ddp", "{t}");
    assert_eq!(t["batch_size"], 2, "{t}");
    assert_eq!(u64_at(t, "/parameters"), parameters, "{model}");
    let steps = t["step_ms"].as_array().expect("step_ms[]");
    assert_eq!(steps.len(), STEPS, "{model}: {t}");
    assert!(
        steps.iter().all(|s| s.as_f64().is_some_and(|x| x > 0.0)),
        "{t}"
    );
    assert!(u64_at(t, "/peak_memory_bytes") > 0, "{t}");
    assert!(u64_at(t, "/driver_peak_memory_bytes") > 0, "{t}");
    assert!(t["samples_per_s"].as_f64().is_some_and(|x| x > 0.0), "{t}");
}

#[test]
fn two_models_train_in_turn_and_the_report_compares_them() {
    let c = Cluster::start(2, 1);
    let args = [
        "submit",
        "ddp",
        "--nodes",
        "2",
        "--model",
        "cnn,mobilenet_v2",
        "--batch-size",
        "2",
        "--steps",
        "3",
        "--warmup-steps",
        "1",
        "--wait",
        "--output",
        "json",
    ];
    let out = c.gpuctl(&args);
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", stderr(&out), c.logs()));
    // Two CPU ranks sharing the machine's cores may judge each other slow (a
    // performance finding); what this test pins is that every rank trained
    // both models and reported them.
    let state = report["state"].as_str().unwrap_or("");
    assert!(
        state == "succeeded" || state == "failed",
        "{report:#}\n{}",
        c.logs()
    );
    // Each model's parameters are compared across ranks on their own.
    assert!(
        !report.to_string().contains("silent data corruption"),
        "{report:#}"
    );
    let mut ranks = 0;
    for n in report["nodes"].as_array().expect("nodes[]") {
        for r in n["ranks"].as_array().expect("ranks[]") {
            ranks += 1;
            assert_eq!(r["ok"], true, "{r}");
            check_model(&r["train"], "cnn", CNN_PARAMETERS);
            let more = r["more_train"].as_array().expect("more_train[]");
            assert_eq!(more.len(), 1, "{r}");
            check_model(&more[0], "mobilenet_v2", MOBILENET_V2_PARAMETERS);

            let phases = r["phases"].as_array().expect("phases[]");
            assert!(!phases.is_empty(), "{r}");
            let times: Vec<u64> = phases.iter().map(|p| u64_at(p, "/unix_ms")).collect();
            assert!(times.windows(2).all(|w| w[1] >= w[0]), "{phases:?}");
            assert!(times.last() > times.first(), "{phases:?}");
            let names: Vec<&str> = phases
                .iter()
                .map(|p| p["phase"].as_str().unwrap())
                .collect();
            assert!(names.windows(2).any(|w| w[0] != w[1]), "{names:?}");
            // Each model's steps are a phase of their own, the cnn's first.
            let at = |name: &str| names.iter().position(|p| *p == name);
            let (cnn, mobile) = (at("cnn: train step"), at("mobilenet_v2: train step"));
            assert!(
                cnn.is_some() && mobile.is_some() && cnn < mobile,
                "{names:?}"
            );
            let iterations: Vec<u64> = phases.iter().map(|p| u64_at(p, "/iterations")).collect();
            assert!(
                iterations.windows(2).all(|w| w[1] >= w[0]),
                "{iterations:?}"
            );
        }
    }
    assert_eq!(ranks, 2, "{report:#}");

    let id = report["job_id"].as_str().unwrap();
    let table = c.gpuctl(&["report", id]);
    let text = String::from_utf8_lossy(&table.stdout);
    let section = text
        .split("\nMODELS (")
        .nth(1)
        .unwrap_or_else(|| panic!("no MODELS section:\n{text}"));
    let rows: Vec<&str> = section.lines().skip(2).take(2).collect();
    assert!(rows[0].starts_with("cnn "), "{section}");
    assert!(rows[1].starts_with("mobilenet_v2 "), "{section}");
    assert!(rows[1].contains("3504872"), "{section}");

    let md = c.gpuctl(&["report", id, "--output", "md"]);
    let md = String::from_utf8_lossy(&md.stdout);
    assert!(
        md.contains("### models") && md.contains("| mobilenet_v2 |"),
        "{md}"
    );

    let bad = c.gpuctl(&["submit", "ddp", "--nodes", "2", "--model", "cnn,nope"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    let why = stderr(&bad);
    assert!(why.contains("model") && why.contains("`nope`"), "{why}");
}

//! The suite's tests: the shipped levels, a user's file, and every refusal
//! with its field and fix. In their own file so that the suite's code reads
//! without them.

use super::*;
use crate::catalogue::{NcclParams, StressParams, TypedParams};
use crate::spec::normalize;
use gpuctl_proto::pb::JobSpec;

/// A suite of one stage: `stage` is the body of its `[[stage]]` table.
fn one(stage: &str) -> Result<Suite, SpecError> {
    Suite::parse(&format!("name = \"t\"\n[[stage]]\n{stage}\n"))
}

fn refused(text: &str) -> SpecError {
    Suite::parse(text).expect_err(text)
}

/// What a worker builds from a spec on that device.
fn typed(spec: &JobSpec, gpu: bool) -> TypedParams {
    TypedParams::build(&spec.workload, &spec.params, gpu)
        .unwrap_or_else(|e| panic!("{} gpu={gpu}: {e}", spec.name))
}

#[test]
fn the_levels_parse_and_take_about_their_time() {
    for level in LEVELS {
        let s = Suite::builtin(level).unwrap_or_else(|e| panic!("{level}: {e}"));
        assert_eq!(s.name, *level);
        assert!(s.stages[0].is_preflight(), "{level}");
        let (est, nominal) = (s.estimate_ms(None), s.duration_ms);
        assert!(
            est.abs_diff(nominal) <= nominal / 3,
            "{level}: estimate {est} ms, stated {nominal} ms"
        );
    }
    let quick = Suite::builtin("quick").unwrap();
    assert_eq!(quick.duration_ms, 120_000);
    let names: Vec<&str> = quick.stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["preflight", "stress", "all_reduce", "links", "p2p"]);
    let standard = Suite::builtin("standard").unwrap();
    assert_eq!(standard.duration_ms, 15 * 60_000);
    assert_eq!(standard.stages.len(), 6);
}

#[test]
fn burn_in_is_standard_then_memory_for_the_rest() {
    let standard = Suite::builtin("standard").unwrap();
    let burn = Suite::builtin("burn-in").unwrap();
    assert_eq!(burn.duration_ms, 2 * 3_600_000);
    let (last, first) = burn.stages.split_last().unwrap();
    assert_eq!(
        first,
        &standard.stages[..],
        "burn-in repeats standard's stages"
    );
    assert!(last.rest && last.workload == "stress");
    assert_eq!(burn.estimate_ms(None), burn.duration_ms);
    let specs = burn.job_specs(None, true).unwrap();
    let memory = specs.last().unwrap().1.as_ref().unwrap();
    let TypedParams::Stress(StressParams { target_memory, .. }) = typed(memory, true) else {
        panic!()
    };
    assert_eq!(
        target_memory,
        Some(crate::catalogue::MemoryTarget::Fraction(0.9))
    );
}

#[test]
fn every_level_gives_specs_a_worker_runs_on_either_device() {
    for level in LEVELS {
        let s = Suite::builtin(level).unwrap();
        for gpu in [false, true] {
            let specs = s.job_specs(None, gpu).unwrap();
            assert_eq!(specs.len(), s.stages.len());
            for ((name, spec), stage) in specs.iter().zip(&s.stages) {
                assert_eq!(name, &stage.name);
                match spec {
                    None => assert!(stage.is_preflight()),
                    Some(spec) => {
                        assert!(spec.all_nodes);
                        assert_eq!(normalize(spec).as_ref(), Ok(spec), "already normal");
                        typed(spec, gpu);
                    }
                }
            }
        }
    }
}

#[test]
fn quick_runs_cpu_sizes_on_a_cpu_and_gpu_sizes_on_a_gpu() {
    let quick = Suite::builtin("quick").unwrap();
    let cpu = quick.job_specs(None, false).unwrap();
    let gpu = quick.job_specs(None, true).unwrap();
    assert!(
        cpu[0].1.is_none() && gpu[0].1.is_none(),
        "preflight runs no job"
    );
    let stress = cpu[1].1.as_ref().unwrap();
    assert_eq!(
        (stress.workload.as_str(), stress.duration_ms),
        ("stress", 30_000)
    );
    assert_eq!(stress.name, "quick/stress");
    let TypedParams::Stress(s) = typed(stress, false) else {
        panic!()
    };
    assert_eq!(s.size, 256, "a CPU rank's own size");
    let TypedParams::Stress(s) = typed(gpu[1].1.as_ref().unwrap(), true) else {
        panic!()
    };
    assert_eq!(s.size, 8192);
    for (specs, on_gpu, max) in [(&cpu, false, 16u64 << 20), (&gpu, true, 256 << 20)] {
        let TypedParams::Nccl(NcclParams { ops, max_bytes, .. }) =
            typed(specs[2].1.as_ref().unwrap(), on_gpu)
        else {
            panic!()
        };
        assert_eq!((ops, max_bytes), (vec!["all_reduce".to_string()], max));
        let TypedParams::Nccl(p) = typed(specs[3].1.as_ref().unwrap(), on_gpu) else {
            panic!()
        };
        assert_eq!((p.pattern, p.max_bytes), (NcclPattern::Search, max));
        assert_eq!(p.slow_ratio, if on_gpu { 0.8 } else { 0.5 });
    }
    // Two nodes measure their link as pairs.
    assert_eq!(quick.stages[3].min_nodes(true), 2, "links");
    assert_eq!(quick.stages[1].min_nodes(false), 1);
}

#[test]
fn rest_is_what_the_other_stages_leave() {
    let burn = Suite::builtin("burn-in").unwrap();
    let others: u64 = burn.stage_estimates_ms(None)[..burn.stages.len() - 1]
        .iter()
        .sum();
    // preflight 5 s; stress 5 m; nccl 2 m; links 1 m; ddp 2 m; maxbatch 1.5 m; five job starts.
    assert_eq!(
        others,
        5_000 + (300 + 120 + 60 + 120 + 90) * 1_000 + 5 * JOB_START_MS
    );
    let three_h = 3 * 3_600_000;
    let specs = burn.job_specs(Some(three_h), true).unwrap();
    let memory = specs.last().unwrap().1.as_ref().unwrap();
    assert_eq!(memory.duration_ms, three_h - others - JOB_START_MS);
    assert_eq!(burn.estimate_ms(Some(three_h)), three_h);
    assert_eq!(
        specs[1].1.as_ref().unwrap().duration_ms,
        300_000,
        "others keep theirs"
    );
    let e = burn.job_specs(Some(10 * 60_000), true).unwrap_err();
    assert_eq!(e.field, "--duration");
    assert!(
        e.message
            .contains("10m 00s leaves nothing for stage `memory`")
            && e.message.contains("about 12m 25s and its own job 10.0s")
            && e.message.contains("at least 12m 36s"),
        "{e}"
    );
    let e = burn.job_specs(Some(8 * 86_400_000), true).unwrap_err();
    assert!(e.message.contains("a week or less"), "{e}");
    // A suite without a rest stage has no use for a total.
    let quick = Suite::builtin("quick").unwrap();
    let e = quick.job_specs(Some(three_h), false).unwrap_err();
    assert_eq!(e.field, "--duration");
    assert!(e.message.contains("leave --duration out"), "{e}");
    assert_eq!(quick.estimate_ms(Some(three_h)), quick.estimate_ms(None));
    // The file's own duration must leave something too.
    let e = refused(
        "name = \"t\"\nduration = \"20s\"\n[[stage]]\nname = \"a\"\nworkload = \"stress\"\nduration = \"30s\"\n\
         [[stage]]\nname = \"b\"\nworkload = \"stress\"\nduration = \"rest\"\n",
    );
    assert_eq!(e.field, "duration");
    assert!(
        e.message.contains("20.0s leaves nothing for stage `b`"),
        "{e}"
    );
}

#[test]
fn a_users_file_replaces_a_level() {
    let text = r#"
        name = "quick-ib"
        about = "quick with pairs at 1 GiB on one rail"
        [[stage]]
        name = "stress"
        workload = "stress"
        duration = "10s"
        params = { with-comm = "yes", check_every = 5 }
        gpu_params = { size = 16384 }
        [[stage]]
        name = "pairs"
        workload = "nccl"
        params = { pattern = "pairs", max_bytes = "1G", slow_ratio = 0.7 }
    "#;
    let s = Suite::parse(text).unwrap();
    let stress = &s.stages[0];
    assert_eq!(stress.params["with_comm"], "yes");
    assert_eq!(stress.params["check_every"], "5");
    assert_eq!(stress.gpu_params["size"], "16384");
    assert_eq!(s.stages[1].params["slow_ratio"], "0.7");
    // No duration given: the estimate, 10 s + 60 s and two job starts.
    assert_eq!(s.duration_ms, 10_000 + 60_000 + 2 * JOB_START_MS);
    let specs = s.job_specs(None, true).unwrap();
    let spec = specs[0].1.as_ref().unwrap();
    assert_eq!(spec.params["with_comm"], "true", "normalized");
    let TypedParams::Stress(p) = typed(spec, true) else {
        panic!()
    };
    assert_eq!((p.size, p.check_every, p.with_comm), (16384, 5, true));
    let TypedParams::Stress(p) = typed(
        s.job_specs(None, false).unwrap()[0].1.as_ref().unwrap(),
        false,
    ) else {
        panic!()
    };
    assert_eq!(p.size, 256, "gpu_params stay off a CPU");
}

#[test]
fn the_examples_in_the_docs_parse() {
    let doc = include_str!("../../../docs/acceptance.md");
    let blocks: Vec<&str> = doc
        .split("```toml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .collect();
    assert_eq!(blocks.len(), 2);
    for b in blocks {
        Suite::parse(b).unwrap_or_else(|e| panic!("{e}\n{b}"));
    }
}

#[test]
fn unknown_levels_name_the_three() {
    let e = Suite::builtin("thorough").unwrap_err();
    assert_eq!(e.field, "--level");
    assert!(
        e.message.contains("`thorough`") && e.message.contains("quick, standard, burn-in"),
        "{e}"
    );
    assert!(Suite::builtin_text("burn-in")
        .unwrap()
        .contains("target_memory"));
}

#[test]
fn bad_stages_are_refused_with_the_field_and_the_fix() {
    let cases: &[(&str, &str, &str)] = &[
        ("name = \"a\"\nworkload = \"burn\"", "stage `a` workload", "choose preflight or one of stress"),
        ("name = \"a\"\nworkload = \"stress\"", "stage `a` duration", "e.g. duration = \"5m\""),
        ("name = \"a\"\nworkload = \"stress\"\nduration = \"soon\"", "stage `a` duration", "`soon` is not a duration"),
        ("name = \"a\"\nworkload = \"stress\"\nduration = \"500ms\"", "stage `a` duration", "give 1s or more"),
        ("name = \"a\"\nworkload = \"stress\"\nduration = \"8d\"", "stage `a` duration", "a week or less"),
        ("name = \"a\"\nworkload = \"nccl\"\nduration = \"1m\"", "stage `a` duration", "remove duration"),
        ("name = \"a\"\nworkload = \"stress\"\nduration = \"1m\"\nestimate = \"2m\"", "stage `a` estimate", "remove estimate"),
        ("name = \"a\"\nworkload = \"stress\"\nduration = \"1m\"\nparams = { factor = 2 }", "stage `a` params.factor", "has no parameter `factor`; it takes size"),
        ("name = \"a\"\nworkload = \"stress\"\nduration = \"1m\"\nparams = { size = 8 }", "stage `a` params.size", "give 16..=65536"),
        ("name = \"a\"\nworkload = \"stress\"\nduration = \"1m\"\ngpu_params = { precision = \"fp64\" }", "stage `a` gpu_params.precision", "not one of bf16"),
        ("name = \"a\"\nworkload = \"stress\"\nduration = \"1m\"\nparams = { size = [1] }", "stage `a` params.size", "give a string, number or true/false"),
        ("name = \"a\"\nworkload = \"stress\"\nduration = \"1m\"\nparams = { with_comm = 1, with-comm = 0 }", "stage `a` params.with_comm", "given twice"),
        // A CPU's default max_bytes (16M) is below this min_bytes.
        ("name = \"a\"\nworkload = \"nccl\"\nparams = { min_bytes = \"64M\" }", "stage `a` params.min_bytes", "swap them"),
        ("name = \"a\"\nworkload = \"preflight\"\nparams = { size = 1 }", "stage `a` params", "takes no parameters"),
        ("name = \"a\"\nworkload = \"stress\"\nduration = \"rest\"", "duration", "give the suite one, e.g. duration = \"2h\""),
        ("name = \"a b\"\nworkload = \"preflight\"", "stage 1 name", "letters, digits"),
        ("name = \"a\"\nworkload = \"preflight\"\nsize = 3", "suite", "unknown field `size`"),
    ];
    for (stage, field, fix) in cases {
        let e = one(stage).expect_err(stage);
        assert_eq!(&e.field, field, "{stage}: {e}");
        assert!(e.message.contains(fix), "{stage}: {e}");
    }
}

#[test]
fn bad_suites_are_refused_with_the_field_and_the_fix() {
    let stage = |name: &str, duration: &str| {
        format!("[[stage]]\nname = \"{name}\"\nworkload = \"stress\"\nduration = \"{duration}\"\n")
    };
    let head = "name = \"t\"\nduration = \"1h\"\n";
    let e = refused(&format!(
        "{head}{}{}",
        stage("a", "rest"),
        stage("b", "rest")
    ));
    assert_eq!(e.field, "stage `b` duration");
    assert!(
        e.message.contains("stage `a` already takes the rest"),
        "{e}"
    );
    let e = refused(&format!("{head}{}{}", stage("a", "1m"), stage("a", "2m")));
    assert_eq!(e.field, "stage 2 name");
    assert!(e.message.contains("`a` names two stages"), "{e}");
    let many: String = (0..=MAX_STAGES)
        .map(|i| stage(&format!("s{i}"), "1s"))
        .collect();
    let e = refused(&format!("{head}{many}"));
    assert_eq!(e.field, "stage");
    assert!(e.message.contains("33 stages; at most 32"), "{e}");
    let e = refused(head);
    assert!(e.message.contains("add one or more [[stage]]"), "{e}");
    let big = format!(
        "{head}# {}\n{}",
        "x".repeat(MAX_SUITE_BYTES),
        stage("a", "1m")
    );
    let e = refused(&big);
    assert_eq!(e.field, "suite");
    assert!(e.message.contains("at most 64 KiB"), "{e}");
    let e = refused(&format!("name = \"\"\n{}", stage("a", "1m")));
    assert_eq!(e.field, "name");
    let e = refused("name = \"t\"\n[[stage]]\nname = \"a\"\n");
    assert_eq!(e.field, "suite");
    assert!(e.message.contains("missing field `workload`"), "{e}");
    // Exactly 32 stages are fine.
    let many: String = (0..MAX_STAGES)
        .map(|i| stage(&format!("s{i}"), "1s"))
        .collect();
    assert_eq!(
        Suite::parse(&format!("{head}{many}")).unwrap().stages.len(),
        32
    );
}

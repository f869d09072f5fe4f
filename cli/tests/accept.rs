//! Acceptance suites on real processes: `gpuctl accept --level quick` on a
//! local fleet of 4 agents (one CPU rank each) passes every node and leaves
//! each node's acceptance state for `gpuctl fleet`; with one node slowed for
//! real by a CPU quota on its process tree, that node fails at the stress
//! stage, sits out the later stages, which run on the other three, and the
//! report, the exit code and `gpuctl fleet` say so.

mod common;

use common::cgroup::CpuQuota;
use common::*;
use serde_json::Value;

/// Runs `gpuctl accept` to its end; the exit code and the JSON report.
fn accept(c: &Cluster, extra: &[&str]) -> (i32, Value) {
    let rules = c.cpu_rules();
    let mut args = vec!["accept", "--rules", &rules, "--output", "json"];
    // The quick level on every node unless the test names its own.
    if !extra.contains(&"--nodes") {
        args.extend(["--nodes", "all"]);
    }
    if !extra.contains(&"--suite") {
        args.extend(["--level", "quick"]);
    }
    args.extend(extra);
    let out = c.gpuctl(&args);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no suite JSON ({e}): {}\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            stderr(&out),
            c.logs()
        )
    });
    (out.status.code().unwrap_or(-1), v)
}

fn node<'a>(suite: &'a Value, name: &str) -> &'a Value {
    suite["nodes"]
        .as_array()
        .expect("nodes[]")
        .iter()
        .find(|n| n["name"] == name)
        .unwrap_or_else(|| panic!("{name} not in {suite:#}"))
}

fn stage<'a>(suite: &'a Value, name: &str) -> &'a Value {
    suite["stages"]
        .as_array()
        .expect("stages[]")
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("stage {name} not in {suite:#}"))
}

fn fleet_acceptance(c: &Cluster) -> Vec<(String, Value)> {
    let v = c.json(&["fleet"]);
    let rows = v["nodes"].as_array().cloned().unwrap_or_default();
    assert_eq!(rows.len(), 4, "one row per node: {v:#}");
    rows.iter()
        .map(|r| {
            (
                r["node"].as_str().unwrap().to_string(),
                r["acceptance"].clone(),
            )
        })
        .collect()
}

#[test]
fn quick_accepts_a_healthy_fleet_and_fleet_shows_it() {
    let _g = serial();
    let c = Cluster::start(4, 1);
    let (code, s) = accept(&c, &[]);
    assert_eq!(s["verdict"], "pass", "{s:#}");
    assert_eq!(code, 0, "{s:#}");
    assert_eq!(s["level"], "quick");
    for i in 0..4 {
        let n = node(&s, &Cluster::agent_name(i));
        assert!(n["verdict"] == "pass" || n["verdict"] == "warn", "{n:#}");
        assert_eq!(n["stage"], "", "{n:#}");
    }
    // Every stage ran on all four nodes, each a job with its own report.
    for name in ["preflight", "stress", "all_reduce", "links"] {
        let st = stage(&s, name);
        assert_eq!(st["nodes"].as_array().unwrap().len(), 4, "{st:#}");
        if name != "preflight" {
            assert_eq!(st["state"], "succeeded", "{st:#}");
            assert_eq!(st["report"]["nodes"].as_array().unwrap().len(), 4, "{st:#}");
        }
    }
    let fleet = fleet_acceptance(&c);
    assert_eq!(fleet.len(), 4, "{fleet:?}");
    for (name, a) in fleet {
        assert_eq!(a["verdict"], "pass", "{name}: {a:#}");
        assert_eq!(a["level"], "quick", "{name}: {a:#}");
        assert_eq!(a["suite"], s["suite"], "{name}: {a:#}");
    }
    // A person's table leads with the verdict and shows the acceptance age.
    let table = c.gpuctl(&["fleet"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("accepted") && text.contains("at quick"),
        "{text}"
    );
}

#[test]
fn a_slowed_node_fails_at_stress_and_the_later_stages_run_on_the_others() {
    let _g = serial();
    let c = Cluster::start(4, 1);
    let slow = Cluster::agent_name(2);
    let quota = CpuQuota::apply("gpuctl-test-accept", c.agent_pid(2), 0.08);
    let (code, s) = accept(&c, &[]);
    drop(quota);
    assert_eq!(code, 1, "{s:#}");
    assert_eq!(s["verdict"], "fail", "{s:#}");
    let n = node(&s, &slow);
    assert_eq!(n["verdict"], "fail", "{n:#}");
    assert_eq!(n["stage"], "stress", "{n:#}");
    for i in [0, 1, 3] {
        let n = node(&s, &Cluster::agent_name(i));
        assert!(
            n["verdict"] == "pass" || n["verdict"] == "warn",
            "healthy blamed: {n:#}"
        );
    }
    // The stress stage judged all four; the later stages ran without the slow one.
    assert_eq!(stage(&s, "stress")["nodes"].as_array().unwrap().len(), 4);
    for name in ["all_reduce", "links"] {
        let st = stage(&s, name);
        let nodes: Vec<&str> = st["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(nodes.len(), 3, "{st:#}");
        assert!(!nodes.contains(&slow.as_str()), "{st:#}");
        let in_report: Vec<&str> = st["report"]["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["name"].as_str().unwrap())
            .collect();
        assert!(!in_report.contains(&slow.as_str()), "{st:#}");
        assert_eq!(st["state"], "succeeded", "{st:#}");
    }
    // The table report leads with the verdict naming the node and the stage.
    let table = c.gpuctl(&["report", stage(&s, "stress")["job_id"].as_str().unwrap()]);
    assert!(!table.status.success());
    for (name, a) in fleet_acceptance(&c) {
        if name == slow {
            assert_eq!(a["verdict"], "fail", "{a:#}");
            assert_eq!(a["stage"], "stress", "{a:#}");
        } else {
            assert_eq!(a["verdict"], "pass", "{name}: {a:#}");
        }
    }
    let text = String::from_utf8_lossy(&c.gpuctl(&["fleet"]).stdout).to_string();
    assert!(text.contains("failed quick at stress"), "{text}");
}

/// Issue 36: the suites' fleet stage is the search, which needs a third node
/// to confirm with; on two nodes it measures their one link as pairs and
/// says so in the stage's note.
#[test]
fn the_links_stage_searches_three_nodes_and_pairs_two() {
    let _g = serial();
    let c = Cluster::start(3, 1);
    let suite = c.dir.path().join("links.toml");
    std::fs::write(
        &suite,
        "name = \"links-only\"\n[[stage]]\nname = \"links\"\nworkload = \"nccl\"\n\
         params = { pattern = \"search\", slow_ratio = 0.5, max_bytes = \"1M\", iters = \"5\", warmup = \"2\" }\n",
    )
    .unwrap();
    let suite = suite.to_str().unwrap().to_string();
    for (nodes, pattern) in [("all", "search"), ("2", "pairs")] {
        let (code, s) = accept(&c, &["--suite", &suite, "--nodes", nodes]);
        assert_eq!(code, 0, "{nodes}: {s:#}");
        let st = stage(&s, "links");
        assert_eq!(st["state"], "succeeded", "{st:#}");
        let report = &st["report"];
        assert_eq!(report["spec"]["params"]["pattern"], pattern, "{st:#}");
        if pattern == "pairs" {
            assert!(
                st["note"]
                    .as_str()
                    .unwrap()
                    .contains("--pattern pairs measured them instead of search"),
                "{st:#}"
            );
            assert_eq!(report["links"].as_array().unwrap().len(), 2, "{st:#}");
        } else {
            assert_eq!(st["note"], "", "{st:#}");
            assert!(!report["bisect"].as_array().unwrap().is_empty(), "{st:#}");
        }
    }
}

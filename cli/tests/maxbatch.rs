//! `maxbatch` on CPU ranks stays inside host memory (issue 47): a real fleet
//! whose agent (and so its workers) sits in a memory cgroup this test limits
//! to 1 GiB searches a GPT whose batches outgrow that limit long before
//! `--limit`. Without a budget the workers would grow until the kernel's OOM
//! killer ended one; with it every rank ends with the largest batch that fit
//! and says that the host-memory budget stopped it, and the kernel killed
//! nothing in the group.

mod common;

use std::time::Duration;

use common::cgroup::MemoryLimit;
use common::*;

const LIMIT: u64 = 1 << 30;

#[test]
fn the_search_on_cpu_ends_at_the_memory_budget_with_a_figure_not_a_kill() {
    let c = Cluster::start(1, 2);
    let group = MemoryLimit::apply("gpuctl-test-maxbatch", c.agent_pid(0), LIMIT);
    let r = run_job(
        &c,
        &[
            "maxbatch",
            "--nodes",
            "1",
            "--model",
            "gpt",
            "--gpt-size",
            "toy",
            "--seq-len",
            "256",
            "--start",
            "8",
            "--limit",
            "4096",
        ],
        Duration::from_secs(300),
    );
    assert_eq!(
        group.oom_kills(),
        0,
        "the kernel killed in the group: {r:#}"
    );
    assert_eq!(r["state"], "succeeded", "{r:#}\n{}", c.logs());
    passed(&r);
    let ranks = r["nodes"][0]["ranks"].as_array().expect("ranks[]");
    assert_eq!(ranks.len(), 2, "{r:#}");
    for k in ranks {
        let m = &k["maxbatch"];
        let max = m["max_batch"].as_u64().unwrap_or(0);
        assert!((8..4096).contains(&max), "a figure below --limit: {k:#}");
        assert_eq!(m["capped"], false, "{k:#}");
        let note = m["note"].as_str().unwrap_or_default();
        // The budget came from the group this test made, shared by the
        // agent's two ranks.
        assert!(
            note.contains("stopped by the host-memory budget")
                && note.contains(&format!("memory cgroup {}", group.path))
                && note.contains("/ 2 rank(s) in it"),
            "{note}"
        );
        let points = m["points"].as_array().expect("points[]");
        let failed: Vec<_> = points.iter().filter(|p| p["fits"] == false).collect();
        assert!(!failed.is_empty(), "{k:#}");
        for p in &failed {
            let e = p["error"].as_str().unwrap_or_default();
            assert!(e.contains("host-memory budget"), "{p}");
            assert!(p["batch_size"].as_u64().unwrap() > max, "{p}");
        }
        // Every trial that fit stayed under the group's limit, the process's
        // resident peak included.
        for p in points.iter().filter(|p| p["fits"] == true) {
            assert!(p["peak_memory_bytes"].as_u64().unwrap() < LIMIT, "{p}");
        }
    }
}

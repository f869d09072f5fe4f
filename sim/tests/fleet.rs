//! The coordinator at a simulated 200 nodes × 8 GPUs, as CI can afford: a
//! real coordinator process, 200 fake agents over their own connections,
//! 1,600 fake ranks sending progress and results, one short stress job.
//! Every rank's result must be in the stored report, and the coordinator's
//! memory must come back to about where it was before the job (a generous
//! margin: this checks for retention that grows with the job, not for bytes).

use std::path::PathBuf;
use std::time::Duration;

use gpuctl_sim::bench::{self, BenchConfig};

/// gpuctl-coordinator from the same build (`cargo build --workspace` first).
fn coordinator_bin() -> PathBuf {
    let me = std::env::current_exe().unwrap();
    let dir = me.parent().unwrap().parent().unwrap();
    let bin = dir.join("gpuctl-coordinator");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --workspace` before the tests",
        bin.display()
    );
    bin
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_nodes_report_every_rank_and_memory_comes_back() {
    let nodes = 200;
    let gpus = 8;
    let cfg = BenchConfig {
        coordinator_bin: coordinator_bin(),
        nodes,
        gpus,
        idle: Duration::from_secs(2),
        long: Duration::from_secs(5),
        short_jobs: 0,
        short: Duration::from_secs(5),
        interval: Duration::from_secs(1),
        connections: nodes,
        cli_every: Duration::from_millis(200),
        coordinator_log: bench::COORDINATOR_LOG.into(),
    };
    let dir = tempfile_dir();
    let r = bench::run(&cfg, dir.clone()).await.expect("the bench ran");
    let _ = std::fs::remove_dir_all(&dir);
    r.print();
    let job = &r.jobs[0];
    assert_eq!(job.state, "succeeded", "{:#}", r.to_json());
    assert_eq!(job.ranks, (nodes as u32) * gpus);
    assert_eq!(job.results_in_report, job.ranks, "{:#}", r.to_json());
    // Every GPU's telemetry stored, within the per-job budget.
    assert!(
        job.telemetry_bytes > 0 && job.telemetry_bytes <= 64 << 20,
        "telemetry stored: {} bytes",
        job.telemetry_bytes
    );
    let before = r.rss_before_jobs as f64;
    let after = job.rss_after as f64;
    assert!(before > 0.0 && after > 0.0);
    assert!(
        after <= before * 1.5 + 64e6,
        "resident memory {:.0} MB after the job, {:.0} MB before it",
        after / 1e6,
        before / 1e6
    );
    // The allocator's live bytes: objects kept past the job, apart from
    // pages the allocator holds on to.
    let (before, after) = (r.heap_before_jobs as f64, job.heap_after as f64);
    assert!(
        before > 0.0 && after > 0.0,
        "the coordinator's /metrics has no gpuctl_coordinator_heap_bytes"
    );
    assert!(
        after <= before * 1.5 + 32e6,
        "live heap {:.0} MB after the job, {:.0} MB before it",
        after / 1e6,
        before / 1e6
    );
    // Every CLI call answered (an error is counted under its own key).
    for p in &r.phases {
        assert!(
            p.cli.keys().all(|k| !k.contains("error")),
            "{}: {:?}",
            p.name,
            p.cli
        );
    }
}

fn tempfile_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpuctl-sim-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

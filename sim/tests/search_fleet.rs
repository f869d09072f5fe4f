//! `gpuctl-sim search-fleet` small: a real coordinator process plans and
//! judges `nccl --pattern search` on 16 simulated nodes × 2 GPUs with a slow
//! node and a slow link placed. Its report must name both, with nothing
//! else failed; on the healthy fleet it must blame nobody.

use std::path::PathBuf;
use std::time::Duration;

use gpuctl_sim::bench::search_fleet::{self, SearchFleetConfig};
use gpuctl_sim::culprits::Culprits;

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

async fn search(
    culprits: Culprits,
    only_nodes: Vec<String>,
    test: &str,
) -> search_fleet::SearchFleetReport {
    let nodes = 16;
    let cfg = SearchFleetConfig {
        coordinator_bin: coordinator_bin(),
        nodes,
        gpus: 2,
        interval: Duration::from_secs(1),
        connections: nodes,
        culprits,
        only_nodes,
        seed: 5,
        round: Duration::from_millis(300),
        round_model: Duration::from_secs(30),
        coordinator_log: "warn".into(),
    };
    let dir = std::env::temp_dir().join(format!(
        "gpuctl-sim-test-search-{test}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let r = search_fleet::run(&cfg, dir.clone())
        .await
        .expect("the search ran");
    let _ = std::fs::remove_dir_all(&dir);
    r.print();
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinator_names_every_culprit_placed_and_no_healthy_node() {
    let culprits = Culprits::drawn(16, 2, 5).unwrap();
    assert_eq!((culprits.nodes.len(), culprits.links.len()), (1, 1));
    let r = search(culprits, vec![], "two").await;
    assert_eq!(r.verdict, "fail", "{:#}", r.to_json());
    assert_eq!(r.found.len(), 2, "{:#}", r.to_json());
    assert!(r.missed.is_empty(), "{:#}", r.to_json());
    assert!(r.false_blames.is_empty(), "{:#}", r.to_json());
    assert!(r.other_fails.is_empty(), "{:#}", r.to_json());
    assert_eq!(r.ranks_judged, 32, "{:#}", r.to_json());
    assert!(r.rounds > 1 && r.tests > r.rounds, "{:#}", r.to_json());

    let healthy = search(Culprits::default(), vec![], "none").await;
    assert_eq!(healthy.verdict, "pass", "{:#}", healthy.to_json());
    assert!(
        healthy.false_blames.is_empty() && healthy.other_fails.is_empty(),
        "{:#}",
        healthy.to_json()
    );
    assert!(
        healthy.search_notes.iter().any(|n| n.contains("0 blamed")),
        "{:#}",
        healthy.to_json()
    );
}

/// A job on half the fleet, culprits named: the job's node ranks are not
/// the fleet's (sim-00007 is node rank 3), so the simulator must place the
/// culprits by the names the assignments carry. A culprit outside the job
/// is not the job's to find, and nothing of it may be blamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn culprits_are_found_by_name_in_a_job_on_part_of_the_fleet() {
    let only: Vec<String> = (0..16)
        .filter(|i| i % 2 == 1)
        .map(|i| format!("sim-{i:05}"))
        .collect();
    // Node ranks 4 and 5 of the job: neighbours in a first-round group.
    let culprits = Culprits::named(
        &["sim-00007".into(), "sim-00002".into()],
        &["sim-00009:sim-00011".into()],
        5,
    )
    .unwrap();
    let r = search(culprits, only, "part").await;
    let mut found = r.found.clone();
    found.sort();
    assert_eq!(
        found,
        ["sim-00007", "sim-00009:sim-00011"],
        "{:#}",
        r.to_json()
    );
    assert!(r.missed.is_empty(), "{:#}", r.to_json());
    assert_eq!(r.outside, ["sim-00002"], "{:#}", r.to_json());
    assert!(r.false_blames.is_empty(), "{:#}", r.to_json());
    assert_eq!(r.ranks, 16, "{:#}", r.to_json());
}

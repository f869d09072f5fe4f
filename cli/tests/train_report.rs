//! fsdp of the GPT on a real local fleet (2 agents, one CPU rank each): the
//! report passes, shows every rank's communication, its exposed part and the
//! overlap share, the parameters gathered after training are the same on
//! every rank, and each rank's shard is what every rank gathered of it.

mod common;

use common::*;
use serde_json::Value;

/// Every rank's training result, by rank.
fn train_by_rank(report: &Value) -> Vec<(u64, Value)> {
    let mut out: Vec<(u64, Value)> = report["nodes"]
        .as_array()
        .expect("nodes[]")
        .iter()
        .flat_map(|n| n["ranks"].as_array().expect("ranks[]").iter())
        .map(|r| (r["rank"].as_u64().expect("rank"), r["train"].clone()))
        .collect();
    out.sort_by_key(|(r, _)| *r);
    out
}

#[test]
fn fsdp_of_the_gpt_reports_overlap_and_shards_that_agree() {
    let c = Cluster::start(2, 1);
    let submit = "submit fsdp --nodes 2 --model gpt --steps 3 --warmup-steps 1 --wait -o json";
    let out = c.gpuctl(&submit.split(' ').collect::<Vec<_>>());
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", stderr(&out), c.logs()));
    assert_eq!(report["state"], "succeeded", "{report:#}\n{}", c.logs());
    passed(&report);
    let ranks = train_by_rank(&report);
    assert_eq!(ranks.len(), 2, "{report:#}");
    for (rank, t) in &ranks {
        assert_eq!(t["model"], "gpt", "rank {rank}: {t}");
        assert_eq!(t["mode"], "fsdp", "rank {rank}: {t}");
        // The catalogue weighs the toy as the worker builds it.
        let toy = gpuctl_core::catalogue::gpt_parameters("toy", 32).unwrap();
        assert_eq!(t["parameters"].as_u64(), Some(toy), "rank {rank}: {t}");
        let share = t["overlap_share"].as_f64().expect("overlap_share");
        assert!((0.0..=1.0).contains(&share), "rank {rank}: {t}");
        let comm = t["comm_ms_per_step"].as_f64().expect("comm_ms_per_step");
        let exposed = t["comm_exposed_ms_per_step"]
            .as_f64()
            .expect("comm_exposed_ms_per_step");
        assert!(comm > 0.0 && exposed >= 0.0, "rank {rank}: {t}");
        assert!(exposed <= comm * 1.0001, "rank {rank}: {t}");
    }
    // The parameters gathered after training: one digest on every rank,
    // compared by the coordinator (a note says so).
    let digest = |t: &Value| t["param_digest"].as_str().unwrap_or("").to_string();
    assert!(!digest(&ranks[0].1).is_empty(), "{:#}", ranks[0].1);
    assert!(
        ranks.iter().all(|(_, t)| digest(t) == digest(&ranks[0].1)),
        "{report:#}"
    );
    assert!(
        report
            .to_string()
            .contains("FSDP parameters after training"),
        "{report:#}"
    );

    // The table shows the communication columns and the model by name.
    let id = report["job_id"].as_str().unwrap();
    let table = c.gpuctl(&["report", id]);
    let text = String::from_utf8_lossy(&table.stdout);
    for header in ["COMM MS", "EXPOSED MS", "OVERLAP"] {
        assert!(text.contains(header), "{header}: {text}");
    }
    let models = text
        .split("\nMODELS (")
        .nth(1)
        .unwrap_or_else(|| panic!("no MODELS section:\n{text}"));
    assert!(
        models.lines().nth(2).is_some_and(|l| l.starts_with("gpt")),
        "{models}"
    );

    // Needs the worker's fsdp shard digests and size (the lead's change of
    // issue 15): every rank gathered one digest per rank, the same list on
    // every rank, and each rank's own shard is its entry of that list.
    let gathered = |t: &Value| -> Vec<String> {
        t["gathered_shard_digests"]
            .as_array()
            .map(|a| a.iter().map(|d| d.as_str().unwrap().to_string()).collect())
            .unwrap_or_default()
    };
    let first = gathered(&ranks[0].1);
    assert_eq!(first.len(), ranks.len(), "one shard per rank: {report:#}");
    for (rank, t) in &ranks {
        assert_eq!(gathered(t), first, "rank {rank}: {report:#}");
        assert_eq!(
            t["shard_digest"].as_str(),
            Some(first[*rank as usize].as_str()),
            "rank {rank}'s own shard: {report:#}"
        );
        assert_eq!(t["variant"], "toy", "rank {rank}: {t}");
    }
    assert!(
        report.to_string().contains("FSDP shards compared"),
        "{report:#}"
    );
    assert!(models.contains("gpt toy"), "{models}");
}

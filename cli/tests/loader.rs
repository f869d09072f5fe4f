//! The loader sweep and the operator profile on a real local fleet (three
//! agents, one CPU rank each; real coordinator, agents and workers): every
//! rank reports one sweep row per worker count and a profile whose tables
//! name libtorch's operators, whose Chrome trace parses and is fetched by
//! `gpuctl profile --trace` through the coordinator; fsdp ranks profile between their collectives;
//! and a node whose CPU is throttled fails on its loader rate against its
//! peers', named, and no other node does.

mod common;

use std::time::Duration;

use common::cgroup::CpuQuota;
use common::*;
use serde_json::Value;

// One fleet at a time (`serial()`): the throttled node is judged against
// its peers, and a second fleet on the same two cores starved the healthy
// ranks as well (a full CI run, 2026-11-30, blamed a healthy rank as hung).

const SWEEP: &[&str] = &[
    "ddp",
    "--nodes",
    "3",
    "--model",
    "cnn",
    "--batch-size",
    "16",
    "--steps",
    "2",
    "--warmup-steps",
    "1",
    "--loader-workers",
    "0,2",
    "--loader-work",
    "2",
    "--loader-steps",
    "4",
];

fn ranks(report: &Value) -> Vec<(String, Value)> {
    report["nodes"]
        .as_array()
        .expect("nodes[]")
        .iter()
        .flat_map(|n| {
            n["ranks"]
                .as_array()
                .expect("ranks[]")
                .iter()
                .map(|r| (n["name"].as_str().unwrap().to_string(), r.clone()))
        })
        .collect()
}

#[test]
fn every_rank_sweeps_its_loader_and_profiles_its_operators() {
    let _g = serial();
    let c = Cluster::start(3, 1);
    let mut args = SWEEP.to_vec();
    // Each sample also costs its loader thread at least 1 ms of CPU.
    args.extend([
        "--profile",
        "--profile-steps",
        "2",
        "--loader-cpu-us",
        "1000",
    ]);
    let r = run_job(&c, &args, Duration::from_secs(300));
    assert_eq!(r["state"], "succeeded", "{r:#}\n{}", c.logs());
    passed(&r);
    let all = ranks(&r);
    assert_eq!(all.len(), 3, "{r:#}");
    for (node, rank) in &all {
        let t = &rank["train"];
        let rows = t["loader"].as_array().expect("loader[]");
        let workers: Vec<u64> = rows
            .iter()
            .map(|s| s["workers"].as_u64().unwrap())
            .collect();
        assert_eq!(workers, vec![0, 2], "{node}: {t:#}");
        assert_eq!(
            rows.iter().filter(|s| s["best"] == true).count(),
            1,
            "{node}: {t:#}"
        );
        for s in rows {
            assert!(s["samples_per_s"].as_f64().unwrap() > 0.0, "{node}: {s}");
            let wait = s["data_wait_share"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&wait), "{node}: {s}");
            assert!(s["cpu_cores"].as_f64().unwrap() > 0.0, "{node}: {s}");
            assert_eq!(s["work"], 2);
            assert_eq!(s["sample_cpu_us"], 1000, "{node}: {s}");
        }
        let p = &t["profile"];
        assert_eq!(p["error"], "", "{node}: {p:#}");
        let names: Vec<&str> = ["top_cpu", "top_memory"]
            .iter()
            .flat_map(|k| p[k].as_array().unwrap())
            .map(|o| o["name"].as_str().unwrap())
            .collect();
        assert!(p["top_cpu"].as_array().unwrap().len() <= 10, "{p:#}");
        assert!(
            names.iter().any(|n| n.starts_with("aten::")),
            "{node}: {names:?}"
        );
        assert!(p["top_cuda"].as_array().unwrap().is_empty(), "{p:#}");
        let path = p["trace_path"].as_str().unwrap();
        let name = format!("/profile-ddp-cnn-rank{}.json", rank["rank"]);
        assert!(path.ends_with(&name), "{path}");
        let trace: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let events = trace["traceEvents"].as_array().expect("traceEvents");
        assert!(
            events.iter().any(|e| e["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("aten::conv"))),
            "{node}: no convolution in the trace"
        );
    }
    let id = r["job_id"].as_str().unwrap();
    let text = String::from_utf8_lossy(&c.gpuctl(&["report", id]).stdout).to_string();
    assert!(text.contains("\nLOADER ("), "{text}");
    assert!(text.contains("top 10 by self CPU time"), "{text}");
    let html = String::from_utf8_lossy(&c.gpuctl(&["report", id, "-o", "html"]).stdout).to_string();
    assert!(
        html.contains("plot-loader-rate"),
        "no loader plot in the page"
    );
    assert!(
        html.contains("GPU utilisation per loader setting"),
        "no GPU note"
    );
    let csv = String::from_utf8_lossy(&c.gpuctl(&["report", id, "-o", "csv"]).stdout).to_string();
    assert!(
        csv.contains("# loader") && csv.contains("# profile"),
        "{csv}"
    );

    let one = c.json(&["profile", id, "--rank", "1"]);
    assert_eq!(one.as_array().map(Vec::len), Some(1), "{one:#}");
    assert_eq!(one[0]["rank"], 1);
    fetches_every_trace_through_the_coordinator(c, id, &all);
}

/// `gpuctl profile --trace` brings each rank's trace from its agent through
/// the coordinator, byte for byte (in 4 KiB pieces too); a rank whose agent
/// is gone fails named, with where its trace stays, and the others still
/// come.
fn fetches_every_trace_through_the_coordinator(mut c: Cluster, id: &str, all: &[(String, Value)]) {
    let trace_of = |rank: &Value| {
        rank["train"]["profile"]["trace_path"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let dir = tempfile::tempdir().unwrap();
    let dir_s = dir.path().to_str().unwrap();
    let out = c.gpuctl(&["profile", id, "--trace", dir_s]);
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    assert_eq!(shown.matches("PROFILE rank").count(), 3, "{shown}");
    let said = stderr(&out);
    for (node, rank) in all {
        let src = trace_of(rank);
        let name = std::path::Path::new(&src).file_name().unwrap();
        let got = std::fs::read(dir.path().join(name))
            .unwrap_or_else(|e| panic!("{name:?}: {e}\n{said}"));
        assert_eq!(
            got,
            std::fs::read(&src).unwrap(),
            "{node}: the fetched trace differs"
        );
        let line = format!("rank {} on {node}: ", rank["rank"]);
        assert!(said.contains(&line), "no line `{line}` in:\n{said}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3, "{said}");

    // In pieces of 4 KiB: many requests to the agent, one file.
    let (node, rank) = &all[0];
    let src = trace_of(rank);
    let want = std::fs::read(&src).unwrap();
    assert!(
        want.len() > 3 * 4096,
        "{src}: {} bytes is too small to test pieces",
        want.len()
    );
    let pieces = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut client =
            gpuctl_proto::pb::job_service_client::JobServiceClient::connect(c.url.clone())
                .await
                .unwrap();
        let req = gpuctl_proto::pb::GetTraceRequest {
            job_id: id.into(),
            rank: rank["rank"].as_u64().unwrap() as u32,
            path: src.clone(),
            chunk_bytes: 4096,
        };
        let mut s = client.get_trace(req).await.unwrap().into_inner();
        let mut pieces = Vec::new();
        while let Some(p) = s.message().await.unwrap() {
            pieces.push(p);
        }
        pieces
    });
    let mut got = Vec::new();
    for p in &pieces {
        assert_eq!(p.offset, got.len() as u64);
        let mut d = flate2::read::GzDecoder::new(&p.gzip[..]);
        std::io::Read::read_to_end(&mut d, &mut got).unwrap();
    }
    assert_eq!(pieces.len(), want.len().div_ceil(4096), "{node}");
    assert!(pieces.last().unwrap().eof);
    assert_eq!(got, want, "{node}: the trace in 4 KiB pieces differs");

    // The agent of the second node goes away: its rank fails, named.
    let gone = (1..all.len())
        .find(|&i| all[i].0 == Cluster::agent_name(1))
        .expect("a rank on the second agent");
    c.kill_agent(1);
    let dir2 = tempfile::tempdir().unwrap();
    let out = c.gpuctl(&["profile", id, "--trace", dir2.path().to_str().unwrap()]);
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    let (node, rank) = &all[gone];
    // Told at once or mid-fetch, by when the coordinator saw the session end.
    let named = format!("rank {} on node {node}: ", rank["rank"]);
    let stays = format!("its trace stays there at {}", trace_of(rank));
    let line = said
        .lines()
        .find(|l| l.contains(&named))
        .unwrap_or_else(|| panic!("no `{named}` in:\n{said}"));
    assert!(
        line.contains(&stays) && line.contains(&format!("scp {node}:")),
        "{line}"
    );
    assert_eq!(said.matches("trace stays there").count(), 1, "{said}");
    assert_eq!(std::fs::read_dir(dir2.path()).unwrap().count(), 2, "{said}");
}

#[test]
fn a_node_that_cannot_feed_its_device_fails_on_its_loader_rate_named() {
    let _g = serial();
    // Four nodes: a fleet reference needs three besides the node judged
    // (one vote per node, issue 46).
    let c = Cluster::start(4, 1);
    let slow = Cluster::agent_name(2);
    // 8% of one core for the node's rank, its agent left free. At 3% for
    // agent and rank together, a debug worker on CI's host of 2026-11-30
    // went 120 s between progress reports while building its model and was
    // judged hung, never reaching its loader sweep.
    let _quota = CpuQuota::on_ranks("gpuctl-test-loader", c.agent_pid(2), 0.08);
    let mut args = SWEEP.to_vec();
    args[2] = "4";
    let r = run_job(&c, &args, Duration::from_secs(300));
    let loader: Vec<&Value> = fails(&r["findings"])
        .into_iter()
        .filter(|f| f["metric"] == "loader_samples_per_s")
        .collect();
    let rates: Vec<(String, Value)> = ranks(&r)
        .into_iter()
        .map(|(n, rk)| (n, rk["train"]["loader"].clone()))
        .collect();
    assert_eq!(
        loader.len(),
        1,
        "{:#}\n{rates:#?}\n{:#}",
        r["findings"],
        r["notes"]
    );
    assert_eq!(loader[0]["node"], slow.as_str(), "{:#}", loader[0]);
    eprintln!("{}", loader[0]["detail"]);
    for n in r["nodes"].as_array().unwrap() {
        if n["name"] != slow.as_str() {
            assert_ne!(n["verdict"], "fail", "healthy {} blamed: {n:#}", n["name"]);
        }
    }
}

#[test]
fn fsdp_profiles_every_rank_between_its_collectives() {
    let _g = serial();
    let c = Cluster::start(2, 1);
    let args = [
        "fsdp",
        "--nodes",
        "2",
        "--model",
        "cnn",
        "--steps",
        "2",
        "--warmup-steps",
        "1",
        "--profile",
        "--profile-steps",
        "2",
    ];
    let r = run_job(&c, &args, Duration::from_secs(300));
    assert_eq!(r["state"], "succeeded", "{r:#}\n{}", c.logs());
    let all = ranks(&r);
    assert_eq!(all.len(), 2, "{r:#}");
    for (node, rank) in &all {
        let p = &rank["train"]["profile"];
        assert_eq!(p["error"], "", "{node}: {p:#}");
        assert_eq!(p["steps"], 2, "{node}: {p:#}");
        assert!(
            !p["top_cpu"].as_array().unwrap().is_empty(),
            "{node}: {p:#}"
        );
        assert!(
            p["trace_path"]
                .as_str()
                .unwrap()
                .ends_with(&format!("/profile-fsdp-cnn-rank{}.json", rank["rank"])),
            "{p:#}"
        );
        assert!(rank["train"]["loader"].as_array().unwrap().is_empty());
    }
}

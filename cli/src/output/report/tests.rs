//! The table report's layout and the JSON keys scripts rely on, on the
//! shared fixtures.

use super::ranks::ranks_grid;
use super::*;
use crate::output::fixtures::{nccl_report, stress_report, train_report};

#[test]
fn telemetry_health_and_preflight_in_table_and_json() {
    let r = stress_report();
    let s = render(&r);
    let health = s.find("GPU HEALTH\n").expect(&s);
    let xid = s.find("xid ").expect(&s);
    let temp = s.find("temperature ").expect(&s);
    assert!(health < xid && xid < temp, "failures first:\n{s}");
    let row = s
        .lines()
        .find(|l| l.starts_with("node-b") && l.contains("97.2%"))
        .expect(&s);
    for cell in [
        "fail", "30", "100%", "10%", "70 GiB", "93°C", "640 W", "0/2", "48,79",
    ] {
        assert!(row.contains(cell), "`{cell}` missing in {row}");
    }
    assert!(s.contains("PREFLIGHT (at job start)\n"), "{s}");
    // A passing check is folded into one line; its detail is in the JSON.
    assert!(s.contains("1 check pass"), "{s}");
    assert!(!s.contains("/dev/shm is 16 GiB"), "{s}");

    let v = output::json::report(&r);
    assert_eq!(v["telemetry"][0]["node"], "node-b");
    assert_eq!(v["telemetry"][0]["verdict"], "fail");
    assert_eq!(v["telemetry"][0]["util_mean"], 97.25);
    assert_eq!(v["telemetry"][0]["xids"], serde_json::json!([48, 79]));
    assert_eq!(v["telemetry"][0]["ecc_uncorrected_delta"], 2);
    assert_eq!(v["health"].as_array().unwrap().len(), 2);
    assert_eq!(v["health"][1]["rule"], "xid");
    assert_eq!(v["health"][1]["verdict"], "fail");
    assert_eq!(v["health"][1]["gpu_index"], 1);
    assert_eq!(v["preflight"][0]["name"], "shm");
    assert_eq!(v["preflight"][0]["verdict"], "pass");
    // A report without telemetry still has the keys, empty.
    let v = output::json::report(&nccl_report());
    assert_eq!(v["telemetry"], serde_json::json!([]));
    assert_eq!(v["health"], serde_json::json!([]));
}

#[test]
fn report_json_has_the_documented_keys() {
    let v = output::json::report(&stress_report());
    assert_eq!(v["job_id"], "job-000042");
    assert_eq!(v["state"], "failed");
    assert_eq!(v["verdict"], "fail");
    assert_eq!(v["workload"], "stress");
    assert_eq!(v["duration_ms"], 30_500);
    assert_eq!(v["world_size"], 3);
    assert!(v["reason"].as_str().unwrap().contains("digest differs"));
    let nodes = v["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2);
    assert_eq!(nodes[1]["name"], "node-b");
    assert_eq!(nodes[1]["verdict"], "fail");
    let r1 = &nodes[1]["ranks"][0];
    assert_eq!(r1["rank"], 1);
    assert_eq!(r1["local_rank"], 0);
    assert_eq!(r1["device"], "cuda:0");
    assert_eq!(r1["device_name"], "NVIDIA H200");
    assert_eq!(r1["verdict"], "fail");
    assert_eq!(r1["stress"]["tflops_min"], 650.5);
    assert_eq!(r1["stress"]["tflops_median"], 660.5);
    assert_eq!(r1["stress"]["tflops_max"], 670.5);
    assert_eq!(r1["stress"]["digest"], "ffff");
    assert_eq!(r1["stress"]["self_mismatches"], 0);
    let r2 = &nodes[1]["ranks"][1];
    assert_eq!(r2["verdict"], "incomplete");
    assert_eq!(r2["reported"], false);
    assert!(r2.get("stress").is_none());
    assert_eq!(v["env"][0]["name"], "NCCL_IB_DISABLE");
    assert_eq!(v["env"][0]["reason"], "no InfiniBand on node-b");
    assert_eq!(v["collectives"].as_array().unwrap().len(), 0);
}

#[test]
fn training_shows_communication_overlap_and_shards_per_rank() {
    let r = train_report();
    let g = ranks_grid(&r);
    let col = |h: &str| g.headers().iter().position(|x| x == h).unwrap();
    let cells = |row: usize| -> Vec<&str> {
        ["COMM MS", "EXPOSED MS", "OVERLAP"]
            .iter()
            .map(|h| g.rows()[row][col(h)].as_str())
            .collect()
    };
    assert_eq!(cells(0), ["12.0", "3.0", "75%"]);
    // No overlap measured: everything waited.
    assert_eq!(cells(1), ["9.0", "9.0", "0%"]);
    assert!(col("OVERLAP") > col("SCALING"));
    let v = output::json::report(&r);
    let t0 = &v["nodes"][0]["ranks"][0]["train"];
    assert_eq!(t0["variant"], "1.3b");
    assert_eq!(t0["comm_ms_per_step"], 12.0);
    assert_eq!(t0["comm_exposed_ms_per_step"], 3.0);
    assert_eq!(t0["overlap_share"], 0.75);
    assert_eq!(t0["shard_digest"], "aa");
    assert_eq!(
        t0["gathered_shard_digests"],
        serde_json::json!(["aa", "bb"])
    );
    let t1 = &v["nodes"][0]["ranks"][1]["train"];
    assert_eq!(t1["gathered_shard_digests"], serde_json::json!([]));
    let text = render(&r);
    assert!(text.contains("gpt 1.3b"), "{text}");
}

#[test]
fn collectives_json_rows() {
    let v = output::json::report(&nccl_report());
    let c = &v["collectives"][0];
    for key in [
        "op",
        "bytes",
        "count",
        "dtype",
        "time_us",
        "algbw_gbps",
        "busbw_gbps",
        "wrong",
        "time_us_ip",
        "algbw_gbps_ip",
        "busbw_gbps_ip",
        "wrong_ip",
    ] {
        assert!(c.get(key).is_some(), "missing {key}");
    }
    assert_eq!(c["op"], "all_reduce");
    assert_eq!(c["bytes"], 1 << 20);
    assert_eq!(v["collectives"][2]["wrong_ip"], 3);
    assert_eq!(
        v["nodes"][0]["ranks"][0]["collectives"]["backend"],
        "tcp-ring"
    );
}

#[test]
fn stress_table_shows_figures_and_names_the_failure() {
    let s = render(&stress_report());
    assert!(s.contains("job-000042"), "{s}");
    assert!(s.contains("VERDICT     FAIL"), "{s}");
    assert!(s.starts_with("VERDICT  FAIL"), "{s}");
    assert!(
        s.trim_end()
            .lines()
            .last()
            .unwrap()
            .starts_with("VERDICT  FAIL"),
        "{s}"
    );
    assert!(s.contains("BACKEND     nccl 2.28.9"), "{s}");
    assert!(s.contains("DURATION    30.5s"), "{s}");
    let rank1 = s
        .lines()
        .find(|l| l.trim_start().starts_with("1   node-b"))
        .expect(&s);
    assert!(
        rank1.contains("650.5") && rank1.contains("660.5") && rank1.contains("670.5"),
        "{rank1}"
    );
    assert!(rank1.contains("differs from group"), "{rank1}");
    let rank0 = s
        .lines()
        .find(|l| l.trim_start().starts_with("0   node-a"))
        .expect(&s);
    assert!(
        rank0.contains("abcdef012345 ") && !rank0.contains("abcdef0123456"),
        "{rank0}"
    );
    assert!(rank0.contains("ok (12 checks)"), "{rank0}");
    let rank2 = s
        .lines()
        .find(|l| l.trim_start().starts_with("2   node-b"))
        .expect(&s);
    assert!(rank2.contains("incomplete"), "{rank2}");
    assert!(
        s.contains("node-b   fail      0/2 pass   rank 1 failed"),
        "{s}"
    );
    assert!(
        s.contains("NCCL_IB_DISABLE   1       no InfiniBand on node-b"),
        "{s}"
    );
    assert!(!s.contains("COLLECTIVES"));
}

#[test]
fn collectives_table_is_laid_out_like_nccl_tests() {
    let s = render(&nccl_report());
    assert!(s.contains("BACKEND     tcp-ring\n"), "{s}");
    let ar = s.find("# all_reduce").expect(&s);
    let ag = s.find("# all_gather").expect(&s);
    assert!(ar < ag, "ops keep their order");
    // nccl-tests' row format: %12li  %12li  %8s  %6s  %6i  %7s  %6.2f  %6.2f  %5s ...
    let line = "     1048576        262144     float     sum      -1    39.49   26.55   26.55      0    39.49   26.55   26.55      0";
    assert!(s.contains(line), "{s}");
    // Sizes sorted within an op.
    assert!(
        s.find("        1024           256     float     sum")
            .unwrap()
            < s.find(line).unwrap()
    );
    // Large times lose decimals; unrooted redop-less ops print `none`.
    assert!(
        s.contains("     1048576        262144     float    none      -1    12345   "),
        "{s}"
    );
    assert!(s.contains("# Out of bounds values : 3 FAILED"), "{s}");
    // Header columns line up with the rows.
    let hdr = s
        .lines()
        .find(|l| l.starts_with("#") && l.contains("#wrong"))
        .unwrap();
    let row = s.lines().find(|l| l.starts_with("     1048576")).unwrap();
    assert_eq!(hdr.len(), row.len(), "\n{hdr}\n{row}");
    assert_eq!(
        hdr.find("busbw").unwrap() + 5,
        row.find("26.55   26.55").unwrap() + 13
    );
}

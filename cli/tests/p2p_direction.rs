//! `p2p` holds a pair's two directions against each other (issue 47: a
//! halved NVLink direction passed on a 2-GPU host, which has no third pair
//! to compare with). On CPU ranks the directions are TCP on loopback
//! between processes sharing cores, so the built-in rules do not compare
//! them; a rules file that compares them at 1.0 makes the lower direction
//! of a real run the slow one, and the report must name it, fail its
//! sender, and say first what two pairs were judged against.

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;

fn findings<'a>(r: &'a Value, metric: &str) -> Vec<&'a Value> {
    r["findings"]
        .as_array()
        .expect("findings[]")
        .iter()
        .filter(|f| f["metric"] == metric)
        .collect()
}

#[test]
fn two_ranks_say_what_they_were_judged_against_and_a_slower_direction_is_named() {
    let c = Cluster::start(1, 2);
    let p2p = ["p2p", "--nodes", "1", "--bytes", "4M"];
    let r = run_job(&c, &p2p, Duration::from_secs(240));
    passed(&r);
    assert!(findings(&r, "p2p_direction").is_empty(), "{r:#}");
    let said = findings(&r, "p2p_pairs");
    assert_eq!(said.len(), 1, "{r:#}");
    assert_eq!(said[0]["level"], "pass");
    let detail = said[0]["detail"].as_str().unwrap();
    assert!(
        detail.contains("2 pairs, fewer than three")
            && detail.contains("not compared on CPU ranks"),
        "{detail}"
    );
    assert!(
        !r["notes"].to_string().contains("fewer than three"),
        "{r:#}"
    );
    // The table report leads with it, under the verdict.
    let id = r["job_id"].as_str().unwrap();
    let text = String::from_utf8_lossy(&c.gpuctl(&["report", id]).stdout).to_string();
    let at = text.find("FINDINGS (").expect(&text);
    let heading = text[at..].lines().next().unwrap_or("");
    assert!(
        heading.starts_with("FINDINGS (0 fail") && heading.ends_with("1 note)"),
        "{text}"
    );
    assert!(at < text.find("NODES").expect(&text), "{text}");

    let rules = c.dir.path().join("directions.toml");
    std::fs::write(&rules, "[p2p]\ncpu_direction = 1.0\n").unwrap();
    let args = [&p2p[..], &["--rules", rules.to_str().unwrap()]].concat();
    let r = run_job(&c, &args, Duration::from_secs(240));
    let pairs = r["gpu_pairs"].as_array().expect("gpu_pairs[]");
    assert_eq!(pairs.len(), 2, "{r:#}");
    let gbps = |p: &Value| p["gbps"].as_f64().unwrap();
    let (lo, hi) = if gbps(&pairs[0]) < gbps(&pairs[1]) {
        (&pairs[0], &pairs[1])
    } else {
        (&pairs[1], &pairs[0])
    };
    if gbps(lo) == gbps(hi) {
        eprintln!("both directions read {} GB/s: nothing to name", gbps(lo));
        return;
    }
    assert_eq!(r["verdict"], "fail", "{r:#}");
    let named = findings(&r, "p2p_direction");
    assert_eq!(named.len(), 1, "{r:#}");
    let f = named[0];
    assert_eq!(f["level"], "fail");
    assert_eq!(
        f["rank"], lo["src_rank"],
        "the slower direction's sender: {f:#}"
    );
    let (s, d) = (
        lo["src_rank"].as_u64().unwrap(),
        lo["dst_rank"].as_u64().unwrap(),
    );
    let detail = f["detail"].as_str().unwrap();
    let want_lo = format!("rank {s} -> rank {d} {:.2} GB/s", gbps(lo));
    let want_hi = format!("against {:.2} GB/s rank {d} -> rank {s}", gbps(hi));
    assert!(
        detail.contains(&want_lo) && detail.contains(&want_hi),
        "{detail}"
    );
    assert_eq!(
        (&lo["verdict"], &hi["verdict"]),
        (&"fail".into(), &"pass".into())
    );
    let node = &r["nodes"][0];
    assert_eq!(node["verdict"], "fail", "{node:#}");
}

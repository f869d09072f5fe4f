//! `gpuctl local up --netns` as an operator runs it: real network namespaces,
//! veth pairs and a bridge (root and iproute2 needed; a machine without them
//! fails these tests saying what is missing, never skips them). The fleet's
//! traffic stays on the private 10.213.0.0/24 that exists only on gpl-br0.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

// Both tests own the `gpl-` names of the machine: one at a time (`serial()`).

/// Runs a command that must succeed; the panic says what it needs.
fn must(prog: &str, args: &[&str]) -> String {
    let out = Command::new(prog).args(args).output().unwrap_or_else(|e| {
        panic!(
            "cannot run `{prog} {}`: {e}; these tests need root and iproute2 (ip, tc)",
            args.join(" ")
        )
    });
    assert!(
        out.status.success(),
        "`{prog} {}` failed ({}): {}; these tests need root, iproute2 and a kernel with network namespaces, veth, bridge and the tbf qdisc",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every `gpl-` link and namespace on the machine.
fn gpl_names() -> Vec<String> {
    let mut names: Vec<String> = must("ip", &["-o", "link", "show"])
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_string())
        .collect();
    names.extend(
        must("ip", &["netns", "list"])
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .map(|n| format!("netns {n}")),
    );
    names.retain(|n| n.trim_start_matches("netns ").starts_with("gpl-"));
    names
}

/// A running `gpuctl local up --netns`.
struct Fleet {
    child: Child,
    url: String,
    dir: tempfile::TempDir,
}

impl Fleet {
    fn start(agents: u32) -> Fleet {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut child = Command::new(bin("gpuctl"))
            .args(["local", "up", "--netns", "--port", "0", "--cpu-ranks", "1"])
            .args(["--agents", &agents.to_string()])
            .arg("--data-dir")
            .arg(dir.path())
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start gpuctl local up");
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("coordinator: ") {
                    let _ = tx.send(url.trim().to_string());
                }
            }
        });
        let stderr = child.stderr.take().unwrap();
        let (etx, erx) = mpsc::channel();
        std::thread::spawn(move || {
            let text: Vec<String> = BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
                .collect();
            let _ = etx.send(text.join("\n"));
        });
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(url) => Fleet { child, url, dir },
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                let err = erx.recv_timeout(Duration::from_secs(5)).unwrap_or_default();
                panic!("gpuctl local up --netns printed no coordinator URL:\n{err}");
            }
        }
    }

    fn gpuctl(&self, args: &[&str]) -> std::process::Output {
        gpuctl_at(&self.url, args)
    }

    fn json(&self, args: &[&str]) -> Value {
        json_at(&self.url, args)
    }

    /// `gpuctl ARGS --output json` (a `submit ... --wait`), and the report
    /// it prints, also for a failed job; `what` heads the panic without one.
    fn report(&self, what: &str, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["--output", "json"]);
        let out = self.gpuctl(&all);
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{what}: no report ({e}): {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                self.logs()
            )
        })
    }

    /// A rules file that calls a link slow under 0.3x the reference, not
    /// 0.8x: CPU-bound TCP links on two shared cores vary by about ±40 %.
    fn loose_link_rules(&self) -> String {
        let rules = self.dir.path().join("links.toml");
        std::fs::write(&rules, "[links]\nslow = 0.3\n").unwrap();
        rules.to_str().unwrap().to_string()
    }

    fn logs(&self) -> String {
        let mut s = String::new();
        for e in std::fs::read_dir(self.dir.path().join("logs"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            s += &format!("--- {}\n", e.path().display());
            for l in tail.into_iter().rev() {
                s += l;
                s.push('\n');
            }
        }
        s
    }

    /// SIGTERM, as an operator's `kill` or a service manager sends it; the
    /// exit status.
    fn stop(mut self) -> std::process::ExitStatus {
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "local up did not stop within 60 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
            let _ = self.child.wait();
        }
    }
}

/// The operator's command from docs/operations.md: a token bucket on a
/// host-side link.
fn throttle(link: &str, rate: &str, burst: &str) {
    must(
        "tc",
        &[
            "qdisc", "add", "dev", link, "root", "tbf", "rate", rate, "burst", burst, "latency",
            "50ms",
        ],
    );
}

/// Throttles the link between nodes `a` and `b` alone, both ways: on each
/// one's host-side link, what comes from the other's address goes through
/// an htb class whose leaf is a token bucket; the rest passes untouched.
fn throttle_link(a: u32, b: u32, rate: &str) {
    for (from, to) in [(a, b), (b, a)] {
        let dev = format!("gpl-local-{to}");
        let src = format!("10.213.0.{}/32", 10 + from);
        let d = dev.as_str();
        must(
            "tc",
            &[
                "qdisc", "add", "dev", d, "root", "handle", "1:", "htb", "default", "10",
            ],
        );
        for (class, rate) in [("1:10", "40gbit"), ("1:20", "40gbit")] {
            must(
                "tc",
                &[
                    "class", "add", "dev", d, "parent", "1:", "classid", class, "htb", "rate", rate,
                ],
            );
        }
        must(
            "tc",
            &[
                "qdisc", "add", "dev", d, "parent", "1:20", "handle", "20:", "tbf", "rate", rate,
                "burst", "32kb", "latency", "50ms",
            ],
        );
        must(
            "tc",
            &[
                "filter", "add", "dev", d, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
                "match", "ip", "src", &src, "flowid", "1:20",
            ],
        );
    }
}

/// Bytes both ways through a host-side link.
fn link_bytes(link: &str) -> u64 {
    ["rx_bytes", "tx_bytes"]
        .iter()
        .map(|f| {
            std::fs::read_to_string(format!("/sys/class/net/{link}/statistics/{f}"))
                .unwrap_or_else(|e| panic!("reading {f} of {link}: {e}"))
                .trim()
                .parse::<u64>()
                .unwrap()
        })
        .sum()
}

fn wait_ready(f: &Fleet, n: usize) -> Vec<Value> {
    let start = Instant::now();
    loop {
        let nodes = nodes_array(&f.json(&["nodes"]));
        if nodes.iter().filter(|n| n["state"] == "ready").count() >= n {
            return nodes;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "not ready: {nodes:?}\n{}",
            f.logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn four_agents_in_namespaces_run_nccl_over_their_links_and_leave_nothing() {
    let _g = serial();
    // A leftover as a crashed run would leave it; `local up` must remove it.
    let _ = Command::new("ip")
        .args(["netns", "del", "gpl-local-7"])
        .output();
    must("ip", &["netns", "add", "gpl-local-7"]);

    let fleet = Fleet::start(4);
    assert!(
        fleet.url.starts_with("http://10.213.0.1:"),
        "URL on the bridge: {}",
        fleet.url
    );
    let left: Vec<String> = gpl_names();
    assert!(
        !left.contains(&"netns gpl-local-7".to_string()),
        "leftover kept: {left:?}"
    );
    for i in 0..4 {
        assert!(
            left.contains(&format!("gpl-local-{i}")),
            "host link gpl-local-{i} in {left:?}"
        );
        assert!(
            left.contains(&format!("netns gpl-local-{i}")),
            "namespace gpl-local-{i} in {left:?}"
        );
    }
    assert!(left.contains(&"gpl-br0".to_string()), "bridge in {left:?}");

    let nodes = wait_ready(&fleet, 4);
    let firsts: BTreeSet<String> = nodes
        .iter()
        .map(|n| {
            n.pointer("/facts/addresses/0")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        })
        .collect();
    let want: BTreeSet<String> = (10..14).map(|i| format!("10.213.0.{i}")).collect();
    assert_eq!(
        firsts, want,
        "each node's first address is its own veth's: {nodes:?}"
    );

    // The plan sends MASTER_ADDR and NCCL's sockets over the namespace ends.
    let plan = fleet.json(&["plan", "nccl", "--nodes", "4"]);
    assert_eq!(plan["master_addr"], "10.213.0.10", "{plan}");
    let ifname = plan["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "NCCL_SOCKET_IFNAME")
        .unwrap_or_else(|| panic!("NCCL_SOCKET_IFNAME planned: {plan}"));
    assert_eq!(ifname["value"], "=eth0", "{plan}");

    let before: Vec<u64> = (0..4)
        .map(|i| link_bytes(&format!("gpl-local-{i}")))
        .collect();
    let out = fleet.gpuctl(&[
        "submit",
        "nccl",
        "--nodes",
        "4",
        "--max-bytes",
        "1M",
        "--ops",
        "all_reduce",
        "--wait",
        "--output",
        "json",
    ]);
    let report = parse_json(&out, &["submit nccl --wait"]);
    assert_eq!(report["state"], "succeeded", "{report}\n{}", fleet.logs());
    assert_eq!(report["verdict"], "pass", "{report}");
    // A ring all_reduce of 1 MiB moves 1.5 MiB through every rank each
    // iteration: the bytes must show on every node's host link.
    for (i, b) in before.iter().enumerate() {
        let moved = link_bytes(&format!("gpl-local-{i}")) - b;
        assert!(
            moved > 1_000_000,
            "only {moved} bytes crossed gpl-local-{i} during the job"
        );
    }

    let st = fleet.stop();
    assert!(st.success(), "local up exited {st} after SIGTERM");
    let left = gpl_names();
    assert!(left.is_empty(), "left behind after stop: {left:?}");
}

#[test]
fn tc_slows_a_host_link_and_a_crashed_run_is_cleaned_by_the_next() {
    let _g = serial();
    let fleet = Fleet::start(3);
    wait_ready(&fleet, 3);
    // The operator's command from docs/operations.md.
    throttle("gpl-local-2", "20mbit", "32kb");
    let shown = must("tc", &["qdisc", "show", "dev", "gpl-local-2"]);
    assert!(shown.contains("tbf") && shown.contains("20Mbit"), "{shown}");

    // A crash (SIGKILL) cannot clean up: its names stay until the next start.
    let mut fleet = fleet;
    fleet.child.kill().unwrap();
    fleet.child.wait().unwrap();
    assert!(
        gpl_names().contains(&"gpl-br0".to_string()),
        "a killed run leaves its bridge"
    );
    let next = Fleet::start(1);
    wait_ready(&next, 1);
    let left = gpl_names();
    assert!(
        !left
            .iter()
            .any(|n| n.ends_with("gpl-local-2") || n.ends_with("gpl-local-1")),
        "the crashed run's names are gone once the next is up: {left:?}"
    );
    assert!(next.stop().success());
    let left = gpl_names();
    assert!(left.is_empty(), "left behind after stop: {left:?}");
}

/// `nccl --pattern pairs` on 4 namespaced nodes: a healthy fleet has no slow
/// link in 3 runs; with one host-side link throttled by tbf the node behind
/// it is named as the culprit and the three others pass.
#[test]
fn pairs_name_the_node_behind_a_throttled_link() {
    let _g = serial();
    let fleet = Fleet::start(4);
    wait_ready(&fleet, 4);
    // On this box every link is CPU-bound TCP, and the two pairs of a round
    // share two cores: healthy links vary by about ±40 %, so the test's rules
    // call a link slow under 0.3x the median rather than the default 0.8x
    // (meant for real interconnects). The throttled link is ~50x slower.
    let rules = fleet.loose_link_rules();
    let pairs = [
        "submit",
        "nccl",
        "--pattern",
        "pairs",
        "--nodes",
        "4",
        "--max-bytes",
        "1M",
        "--iters",
        "5",
        "--warmup",
        "2",
        "--rules",
        &rules,
        "--wait",
    ];
    let run = |what: &str| -> Value { fleet.report(what, &pairs) };
    for i in 0..3 {
        let r = run("healthy");
        let links = r["links"].as_array().expect("links[]");
        assert_eq!(links.len(), 12, "6 pairs x (sendrecv, all_reduce): {r:#}");
        let slow: Vec<&Value> = links.iter().filter(|l| l["verdict"] != "pass").collect();
        assert!(slow.is_empty(), "healthy run {i}: slow links {slow:?}");
        assert_ne!(r["verdict"], "fail", "healthy run {i}: {r:#}");
    }

    throttle("gpl-local-2", "50mbit", "64kb");
    let r = run("throttled");
    assert_eq!(r["verdict"], "fail", "{r:#}");
    for n in r["nodes"].as_array().unwrap() {
        let name = n["name"].as_str().unwrap();
        let fails = fails(&n["findings"]);
        if name == "local-2" {
            assert_eq!(n["verdict"], "fail", "{n:#}");
            assert!(
                fails.iter().any(|f| f["metric"] == "link_busbw"),
                "local-2 is the culprit: {n:#}"
            );
        } else {
            assert!(fails.is_empty(), "{name} blamed: {n:#}");
            assert_ne!(n["verdict"], "fail", "{name}: {n:#}");
        }
    }
    // The slow links are exactly local-2's.
    for l in r["links"].as_array().unwrap() {
        let touches = l["a"] == "local-2" || l["b"] == "local-2";
        assert_eq!(l["verdict"] == "fail", touches, "{l}");
    }
    // The fleet view keeps the latest matrix.
    let links = fleet.json(&["fleet", "links"]);
    assert_eq!(links["links"].as_array().unwrap().len(), 12, "{links:#}");
    assert!(fleet.stop().success());
}

/// `nccl --pattern bisect` on 4 namespaced nodes with one host-side link
/// throttled: the search isolates that node in at most 4 rounds
/// (⌈log₂ 4⌉ + 1, and the slow pairs measured again), fails it with the
/// rounds as evidence, and blames no other.
#[test]
fn bisect_isolates_the_node_behind_a_throttled_link() {
    let _g = serial();
    let fleet = Fleet::start(4);
    wait_ready(&fleet, 4);
    throttle("gpl-local-1", "50mbit", "64kb");
    // As in the pairs test: CPU-bound TCP groups on two shared cores vary by
    // about ±40 %, so a group is slow here under 0.3x the one it is compared
    // with, not the default 0.8x. The throttled node's groups are ~100x slower.
    let args = [
        "submit",
        "nccl",
        "--pattern",
        "bisect",
        "--slow-ratio",
        "0.3",
        "--nodes",
        "4",
        "--max-bytes",
        "1M",
        "--iters",
        "5",
        "--warmup",
        "2",
        "--wait",
    ];
    let r = fleet.report("bisect", &args);
    let rounds = r["bisect"].as_array().expect("bisect[]");
    assert!(
        !rounds.is_empty() && rounds.len() <= 4,
        "{} rounds: {r:#}",
        rounds.len()
    );
    assert_eq!(r["verdict"], "fail", "{r:#}");
    for n in r["nodes"].as_array().unwrap() {
        let name = n["name"].as_str().unwrap();
        let bisected = n["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["metric"] == "bisect" && f["level"] == "fail");
        assert_eq!(bisected, name == "local-1", "{name}: {n:#}");
        if name != "local-1" {
            assert_ne!(n["verdict"], "fail", "{name} blamed: {n:#}");
        }
    }
    assert!(fleet.stop().success());
}

/// `nccl --pattern search` on 6 namespaced nodes with two host-side links
/// throttled: both nodes behind them are named, each with the figures of two
/// cleared partners, and no other node or link is blamed (issue 36).
#[test]
fn search_names_both_nodes_behind_throttled_links_and_nothing_else() {
    let _g = serial();
    let fleet = Fleet::start(6);
    wait_ready(&fleet, 6);
    throttle("gpl-local-1", "50mbit", "64kb");
    throttle("gpl-local-4", "50mbit", "64kb");
    // CPU-bound TCP groups on two shared cores vary by about ±40 % (see the
    // bisect test): slow under 0.3x the search's upper-quartile group.
    let args = [
        "submit",
        "nccl",
        "--pattern",
        "search",
        "--slow-ratio",
        "0.3",
        "--nodes",
        "6",
        "--max-bytes",
        "1M",
        "--iters",
        "5",
        "--warmup",
        "2",
        "--wait",
    ];
    let r = fleet.report("the search", &args);
    assert_eq!(r["verdict"], "fail", "{r:#}");
    let mut blamed: Vec<&str> = r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["metric"] == "search" && f["level"] == "fail")
        .map(|f| f["node"].as_str().unwrap())
        .collect();
    blamed.sort();
    assert_eq!(blamed, ["local-1", "local-4"], "{r:#}");
    for n in r["nodes"].as_array().unwrap() {
        let name = n["name"].as_str().unwrap();
        if name != "local-1" && name != "local-4" {
            assert_ne!(n["verdict"], "fail", "{name} blamed: {n:#}");
        }
    }
    assert!(fleet.stop().success());
}

/// Issue 36, item 5: six namespaced nodes at 4 MiB messages, one behind a
/// throttled host link (50 Mbit/s) and two links between otherwise healthy
/// nodes throttled hard (20 Mbit/s each way). Measured in full, each of
/// those pairs' rounds took minutes and the waiting ranks were blamed as
/// hung; below the floor rate they are cut short, and the report names the
/// node and both links with their figures, and nothing else.
#[test]
fn pairs_name_a_slow_node_and_two_hard_throttled_links_and_nothing_else() {
    let _g = serial();
    let fleet = Fleet::start(6);
    wait_ready(&fleet, 6);
    // CPU-bound TCP on two shared cores: see the pairs test above.
    let rules = fleet.loose_link_rules();
    let pairs = [
        "submit",
        "nccl",
        "--pattern",
        "pairs",
        "--nodes",
        "6",
        "--max-bytes",
        "4M",
        "--iters",
        "5",
        "--warmup",
        "2",
        "--hang-timeout",
        "60s",
        "--rules",
        &rules,
        "--wait",
    ];
    let r = fleet.report("healthy", &pairs);
    assert_ne!(r["verdict"], "fail", "healthy: {r:#}");
    let links = r["links"].as_array().expect("links[]");
    assert_eq!(links.len(), 30, "15 pairs x 2 ops: {r:#}");
    assert!(
        links
            .iter()
            .all(|l| l["verdict"] == "pass" && l["below_floor"] == false),
        "healthy: {links:#?}"
    );

    throttle("gpl-local-5", "50mbit", "64kb");
    throttle_link(0, 2, "20mbit");
    throttle_link(1, 3, "20mbit");
    let r = fleet.report("throttled", &pairs);
    assert_eq!(r["verdict"], "fail", "{r:#}");
    assert!(
        !r["reason"].as_str().unwrap_or("").contains("hung"),
        "a slow link is not a hang: {r:#}"
    );
    for n in r["nodes"].as_array().unwrap() {
        let name = n["name"].as_str().unwrap();
        let f = fails(&n["findings"]);
        if name == "local-5" {
            assert!(
                f.iter().any(|f| f["metric"] == "link_busbw"),
                "local-5 is the culprit: {n:#}"
            );
        } else {
            assert!(f.is_empty(), "{name} blamed: {n:#}");
        }
    }
    // The two links are named as links, with both figures as evidence.
    let mut named: Vec<String> = r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["metric"] == "link_busbw" && f["node"] == "" && f["level"] == "fail")
        .map(|f| {
            let detail = f["detail"].as_str().unwrap();
            assert!(detail.contains("below the floor"), "{detail}");
            assert!(detail.contains("measured twice"), "{detail}");
            f["key"]
                .as_str()
                .unwrap()
                .split(' ')
                .nth(1)
                .unwrap()
                .to_string()
        })
        .collect();
    named.sort();
    named.dedup();
    assert_eq!(named, ["local-0-local-2", "local-1-local-3"], "{r:#}");
    for l in r["links"].as_array().unwrap() {
        let (a, b) = (l["a"].as_str().unwrap(), l["b"].as_str().unwrap());
        let slow = a == "local-5"
            || b == "local-5"
            || (a, b) == ("local-0", "local-2")
            || (a, b) == ("local-1", "local-3");
        assert_eq!(l["verdict"] == "fail", slow, "{l}");
        assert_eq!(l["below_floor"] == true, slow, "{l}");
    }
    assert!(fleet.stop().success());
}

/// What a report blames: the nodes of its failed findings, and the links of
/// its failed findings that name no node (`metric key`, as the report has them).
fn blamed(r: &Value) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut nodes, mut links) = (BTreeSet::new(), BTreeSet::new());
    for f in fails(&r["findings"]) {
        match f["node"].as_str().unwrap_or("") {
            "" => links.insert(format!(
                "{} {}",
                f["metric"].as_str().unwrap_or(""),
                f["key"].as_str().unwrap_or("")
            )),
            n => nodes.insert(n.to_string()),
        };
    }
    (nodes, links)
}

/// `submit nccl --pattern PATTERN --nodes 7 --max-bytes 4M`, as issue 47 ran
/// it. The search keeps its default slow ratio (0.8): it allows ±20 % over
/// sockets and judges each test against its own round, and a pair of CPU
/// ranks on these two shared cores read 0.25 GB/s beside another healthy
/// pair and 0.56 beside two throttled ones. Pairs allows no spread of its
/// own: in two of twelve pairs jobs at 0.8x under load, a healthy sendrecv
/// link read 0.73-0.8x of its round's others. Its links are slow here under
/// 0.3x, as in the pairs tests above. The throttled nodes are 20 to 60 times
/// slower.
fn seven(f: &Fleet, what: &str, pattern: &str) -> Value {
    let rules = f.loose_link_rules();
    let mut args = vec![
        "submit",
        "nccl",
        "--pattern",
        pattern,
        "--nodes",
        "7",
        "--max-bytes",
        "4M",
        "--wait",
    ];
    if pattern == "pairs" {
        args.extend(["--rules", &rules]);
    }
    f.report(&format!("{what} {pattern}"), &args)
}

/// Issue 47, item 8: seven namespaced nodes, local-2's host link at 60
/// Mbit/s and local-5's at 200 Mbit/s. The search named local-2 only: its
/// first round had a group of one node (0.00 GB/s) and two slow groups of
/// the three others, so its upper-quartile reference was a slow group's and
/// cleared local-5 at 0.05x the healthy group. Pairs failed three healthy
/// nodes beside the two, their links judged against the top of the healthy
/// ones.
/// Healthy, the same fleet passes both; throttled, both name exactly
/// local-2 and local-5, and every link of neither passes.
#[test]
fn search_and_pairs_name_two_slow_nodes_at_different_rates_and_no_one_else() {
    let _g = serial();
    let fleet = Fleet::start(7);
    wait_ready(&fleet, 7);
    let run = |what: &str, pattern: &str| seven(&fleet, what, pattern);
    for pattern in ["search", "pairs"] {
        let r = run("healthy", pattern);
        assert_ne!(r["verdict"], "fail", "healthy {pattern}: {r:#}");
        assert_eq!(blamed(&r), Default::default(), "healthy {pattern}: {r:#}");
    }

    throttle("gpl-local-2", "60mbit", "64kb");
    throttle("gpl-local-5", "200mbit", "64kb");
    let culprits: BTreeSet<String> = ["local-2", "local-5"].map(String::from).into();
    let search = run("throttled", "search");
    let rounds = search["bisect"].as_array().expect("bisect[]");
    for g in rounds[0]["groups"].as_array().unwrap() {
        let nodes = g["nodes"].as_array().unwrap();
        assert!(nodes.len() >= 2, "a group of one node has no link: {g}");
    }
    assert_eq!(
        blamed(&search),
        (culprits.clone(), BTreeSet::new()),
        "the search: {search:#}"
    );
    for f in fails(&search["findings"]) {
        assert_eq!(f["metric"], "search", "{f}");
        let d = f["detail"].as_str().unwrap();
        assert!(d.contains("and again with"), "two cleared partners: {d}");
    }

    let pairs = run("throttled", "pairs");
    assert_eq!(
        blamed(&pairs),
        (culprits.clone(), BTreeSet::new()),
        "pairs: {pairs:#}"
    );
    for l in pairs["links"].as_array().unwrap() {
        let culprit = culprits.contains(l["a"].as_str().unwrap())
            || culprits.contains(l["b"].as_str().unwrap());
        assert_eq!(l["verdict"] == "fail", culprit, "{l}\n{pairs:#}");
    }
    for n in pairs["nodes"].as_array().unwrap() {
        let name = n["name"].as_str().unwrap();
        assert_eq!(n["verdict"] == "fail", culprits.contains(name), "{n:#}");
    }
    assert!(fleet.stop().success());
}

/// Issue 47 (what issue 36 left): a slow link between two healthy nodes.
/// local-0 <-> local-1 alone throttled to 100 Mbit/s both ways (a first-round
/// group of the search, so its ring crosses the link): the search and pairs
/// name the link as a link, blame no node, and pass every other link,
/// those measured in the slow link's rounds too.
#[test]
fn search_and_pairs_name_a_slow_link_between_healthy_nodes_as_the_link() {
    let _g = serial();
    let fleet = Fleet::start(7);
    wait_ready(&fleet, 7);
    throttle_link(0, 1, "100mbit");
    let run = |pattern: &str| seven(&fleet, "a slow link,", pattern);
    let slow = |l: &Value| {
        let mut ends = [l["a"].as_str().unwrap(), l["b"].as_str().unwrap()];
        ends.sort();
        ends == ["local-0", "local-1"]
    };

    let search = run("search");
    let link: BTreeSet<String> = ["search link local-0-local-1".to_string()].into();
    assert_eq!(
        blamed(&search),
        (BTreeSet::new(), link),
        "the search: {search:#}"
    );
    for l in search["links"].as_array().unwrap() {
        assert_eq!(l["verdict"] == "fail", slow(l), "{l}\n{search:#}");
    }

    let pairs = run("pairs");
    let links: BTreeSet<String> = ["all_reduce", "sendrecv"]
        .map(|op| format!("link_busbw {op} local-0-local-1"))
        .into();
    assert_eq!(blamed(&pairs), (BTreeSet::new(), links), "pairs: {pairs:#}");
    for l in pairs["links"].as_array().unwrap() {
        assert_eq!(l["verdict"] == "fail", slow(l), "{l}\n{pairs:#}");
    }
    for r in [&search, &pairs] {
        for n in r["nodes"].as_array().unwrap() {
            assert_ne!(n["verdict"], "fail", "no node blamed: {n:#}");
        }
    }
    assert!(fleet.stop().success());
}

//! Prometheus for real (issue 38, item 3): a real Prometheus (Debian's
//! `prometheus` 2.42) scrapes a real coordinator and two real CPU agents on
//! loopback, with the shipped alert rules (deploy/prometheus/) loaded. After
//! an acceptance suite, a stress job under a floor no CPU reaches and a ddp
//! job, the fleet series an operator alerts on are read back through
//! Prometheus's HTTP API and compared with what the reports said; the
//! below-floor alert fires; a killed agent turns lost in the coordinator's
//! series and down in Prometheus's. Every PromQL expression of the Grafana
//! dashboard (deploy/grafana/gpuctl-fleet.json) names only series that
//! Prometheus scraped here. The rules themselves are checked and unit-tested
//! with `promtool`.
//!
//! A CPU fleet has no GPU series (DCGM_FI_*, gpuctl_gpu_xid_errors_total),
//! so a fourth target replays, byte for byte, the `/metrics` answer of a real
//! `gpuctl-agent` on a real H100 (tests/data/agent-h100-metrics.txt, recorded
//! with NVML, agent unconnected): Prometheus must ingest it, and the
//! dashboard's GPU-health queries are checked against what it scraped there.
//!
//! Without `prometheus`/`promtool` the tests fail saying how to install
//! them (scripts/test.sh does); they never skip.

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// The repository's root (this crate is cli/).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A Debian tool the test needs, or a failure that says how to get it.
fn tool(name: &str) -> PathBuf {
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        let p = Path::new(dir).join(name);
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "`{name}` is not installed: this test runs the real one. Install Debian's \
         `prometheus` package (it brings `promtool`): `sudo apt-get install prometheus` \
         (scripts/test.sh does it when it is missing)"
    );
}

/// Stops every process the test started on the way out, also when an
/// assertion fails: SIGTERM, then SIGKILL after 5 s.
#[derive(Default)]
struct Procs(Vec<(String, Child)>);

impl Procs {
    fn add(&mut self, name: &str, c: Child) {
        self.0.push((name.to_string(), c));
    }

    fn stop(&mut self, name: &str) {
        if let Some(i) = self.0.iter().position(|(n, _)| n == name) {
            let (_, c) = self.0.remove(i);
            stop(c);
        }
    }
}

fn stop(mut c: Child) {
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = c.kill();
    let _ = c.wait();
}

impl Drop for Procs {
    fn drop(&mut self) {
        // Agents before the coordinator, Prometheus last: the reverse of starting.
        while let Some((_, c)) = self.0.pop() {
            stop(c);
        }
    }
}

fn log(dir: &Path, name: &str) -> std::fs::File {
    std::fs::File::create(dir.join(format!("{name}.log"))).unwrap()
}

/// Every log of the run, for failure messages.
fn logs(dir: &Path) -> String {
    let mut s = String::new();
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    paths.sort();
    for p in paths {
        let text = std::fs::read_to_string(&p).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        s += &format!("--- {} (last 30 lines)\n", p.display());
        for l in tail.into_iter().rev() {
            s += l;
            s.push('\n');
        }
    }
    s
}

/// A plain HTTP GET on loopback: (status, body).
fn http_get(port: u16, path: &str) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no HTTP head")?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or("no status")?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        unchunk(body)
    } else {
        body.to_string()
    };
    Ok((status, body))
}

fn unchunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The Prometheus under test, queried through its HTTP API.
struct Prom {
    port: u16,
    dir: PathBuf,
}

impl Prom {
    /// `GET /api/v1/<path>`: its `data`.
    fn api(&self, path: &str) -> Value {
        let (status, body) = http_get(self.port, &format!("/api/v1/{path}"))
            .unwrap_or_else(|e| panic!("Prometheus API {path}: {e}\n{}", logs(&self.dir)));
        let v: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("Prometheus API {path}: {status} {e}: {body}"));
        assert_eq!(v["status"], "success", "{path}: {v}");
        v["data"].clone()
    }

    /// An instant query's vector: (labels, value) per series.
    fn query(&self, q: &str) -> Vec<(Value, f64)> {
        let data = self.api(&format!("query?query={}", urlencode(q)));
        data["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let v = r["value"][1].as_str().unwrap().parse::<f64>().unwrap();
                (r["metric"].clone(), v)
            })
            .collect()
    }

    /// Polls `q` until `ok` holds for its result (scrapes every second).
    fn wait(&self, q: &str, what: &str, ok: impl Fn(&[(Value, f64)]) -> bool) -> Vec<(Value, f64)> {
        let deadline = Instant::now() + Duration::from_secs(45);
        loop {
            let r = self.query(q);
            if ok(&r) {
                return r;
            }
            if Instant::now() > deadline {
                panic!("{what}: `{q}` gave {r:?} for 45 s\n{}", logs(&self.dir));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The single value of `q`, once there is one.
    fn value(&self, q: &str) -> f64 {
        self.wait(q, "one series", |r| r.len() == 1)[0].1
    }
}

/// A coordinator and agents with `/metrics` on known ports, and the CLI
/// pointed at the coordinator.
struct Fleet {
    url: String,
    coordinator_metrics: u16,
    agent_metrics: Vec<u16>,
}

impl Fleet {
    fn gpuctl(&self, args: &[&str]) -> std::process::Output {
        gpuctl_at(&self.url, args)
    }

    fn json(&self, args: &[&str]) -> Value {
        json_at(&self.url, args)
    }

    /// As [`Fleet::json`] for commands that exit 1 on a failed job (`status`,
    /// `report`; README "Exit codes") and print it all the same.
    fn json_of_job(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["--output", "json"]);
        let out = self.gpuctl(&all);
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{all:?}: no JSON ({e}): {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                stderr(&out)
            )
        })
    }

    /// Submits a job, waits for its end and returns its JSON report.
    fn run(&self, args: &[&str]) -> Value {
        let v = self.json(&[&["submit"], args].concat());
        let id = job_id(&v).unwrap_or_else(|| panic!("no job id: {v}"));
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let job = self.json_of_job(&["status", &id]);
            let state = job_field(&job, "state");
            if ["succeeded", "failed", "cancelled"].contains(&state.as_str().unwrap_or("")) {
                break;
            }
            assert!(Instant::now() < deadline, "job {id} did not end: {job}");
            std::thread::sleep(Duration::from_millis(300));
        }
        self.json_of_job(&["report", &id])
    }
}

fn start_fleet(dir: &Path, procs: &mut Procs, agents: usize) -> Fleet {
    // A port free when picked can be taken before the coordinator binds it
    // (a process of an earlier test, or one the machine runs): picked again
    // then, a few times.
    let mut tries = 0;
    let (coordinator_metrics, url) = loop {
        tries += 1;
        let port = free_port();
        let mut coord = Command::new(bin("gpuctl-coordinator"))
            .args(["--listen", "127.0.0.1:0", "--node-timeout", "3s"])
            .arg("--metrics-listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--data-dir")
            .arg(dir.join("coordinator"))
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(log(dir, "coordinator"))
            .spawn()
            .expect("start gpuctl-coordinator");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(coord.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        if let Some(url) = line.trim().strip_prefix("listening on ") {
            procs.add("coordinator", coord);
            break (port, url.to_string());
        }
        let _ = coord.wait();
        let taken = logs(dir).contains("Address already in use");
        assert!(
            taken && tries < 3,
            "coordinator's first line: {line:?}\n{}",
            logs(dir)
        );
    };
    let mut agent_metrics = Vec::new();
    for i in 0..agents {
        let port = free_port();
        let name = format!("node-{i}");
        let work = dir.join(&name);
        std::fs::create_dir_all(&work).unwrap();
        let child = Command::new(bin("gpuctl-agent"))
            .args(["--coordinator", &url, "--name", &name, "--cpu-ranks", "1"])
            .arg("--work-dir")
            .arg(&work)
            .args(["--heartbeat-interval", "500ms"])
            .arg("--metrics-listen")
            .arg(format!("127.0.0.1:{port}"))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log(dir, &name))
            .spawn()
            .expect("start gpuctl-agent");
        procs.add(&name, child);
        agent_metrics.push(port);
    }
    let fleet = Fleet {
        url,
        coordinator_metrics,
        agent_metrics,
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let nodes = fleet.json(&["nodes"]);
        let ready = nodes_array(&nodes)
            .iter()
            .filter(|n| n["state"] == "ready")
            .count();
        if ready == agents {
            return fleet;
        }
        assert!(
            Instant::now() < deadline,
            "{ready} of {agents} agents ready: {nodes}\n{}",
            logs(dir)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Serves the recorded H100 agent exposition on a free port, from a thread
/// that ends with the test process, with the content type the agent sends.
fn replay_h100_agent() -> u16 {
    let body = std::fs::read(repo().join("cli/tests/data/agent-h100-metrics.txt")).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(head.as_bytes());
            let _ = conn.write_all(&body);
        }
    });
    port
}

/// Prometheus scraping the fleet every second with the shipped rules.
fn start_prometheus(dir: &Path, procs: &mut Procs, fleet: &Fleet) -> Prom {
    let prometheus = tool("prometheus");
    let agents: Vec<String> = fleet
        .agent_metrics
        .iter()
        .map(|p| format!("'127.0.0.1:{p}'"))
        .collect();
    let rules = repo().join("deploy/prometheus/gpuctl-alerts.yml");
    let config = dir.join("prometheus.yml");
    // The job names of deploy/prometheus/prometheus.yml, which the rules use.
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files: ['{}']\n\
             scrape_configs:\n\
             \x20 - job_name: gpuctl-coordinator\n    static_configs: [{{targets: ['127.0.0.1:{}']}}]\n\
             \x20 - job_name: gpuctl-agent\n    static_configs: [{{targets: [{}]}}]\n\
             \x20 - job_name: h100-agent-recording\n    static_configs: [{{targets: ['127.0.0.1:{}']}}]\n",
            rules.display(),
            fleet.coordinator_metrics,
            agents.join(", "),
            replay_h100_agent()
        ),
    )
    .unwrap();
    let port = free_port();
    let child = Command::new(prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(log(dir, "prometheus"))
        .spawn()
        .expect("start prometheus");
    procs.add("prometheus", child);
    let prom = Prom {
        port,
        dir: dir.to_path_buf(),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(http_get(port, "/-/ready"), Ok((200, _))) {
        assert!(
            Instant::now() < deadline,
            "Prometheus not ready in 30 s\n{}",
            logs(dir)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    prom
}

/// A suite short enough for CI that still leaves every fleet figure: a
/// stress, an all_reduce and a pairs job.
const SUITE: &str = r#"
name = "prometheus-test"
about = "stress, all_reduce and pairs, short"

[[stage]]
name = "stress"
workload = "stress"
duration = "4s"

[[stage]]
name = "all_reduce"
workload = "nccl"
params = { ops = "all_reduce", max_bytes = "1M", iters = "3", warmup = "1" }

[[stage]]
name = "links"
workload = "nccl"
params = { pattern = "pairs", max_bytes = "256K", iters = "3", warmup = "1" }
"#;

fn verdict_value(v: &Value) -> f64 {
    match v.as_str().unwrap() {
        "pass" => 0.0,
        "warn" => 1.0,
        "fail" => 2.0,
        _ => 3.0,
    }
}

/// Metric names a PromQL expression references: identifiers that are not
/// functions, keywords, label names or inside strings or label matchers.
fn metric_names(expr: &str) -> Vec<String> {
    const KEYWORDS: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "topk",
        "bottomk",
        "quantile",
        "stddev",
        "stdvar",
        "count_values",
        "group",
        "inf",
        "nan",
    ];
    let mut out = Vec::new();
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    let (mut braces, mut parens_label) = (0, false);
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' {
            i += 1;
            while i < chars.len() && chars[i] != c {
                i += 1 + usize::from(chars[i] == '\\');
            }
            i += 1;
            continue;
        }
        if c == '{' {
            braces += 1;
        } else if c == '}' {
            braces -= 1;
        } else if c == '[' {
            // A range or subquery: `[5m]`.
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "_:".contains(chars[i])) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let next = chars[i..].iter().find(|c| !c.is_whitespace());
            // `by (node)`: label names in parentheses after a grouping keyword.
            if [
                "by",
                "without",
                "on",
                "ignoring",
                "group_left",
                "group_right",
            ]
            .contains(&word.as_str())
            {
                parens_label = true;
                continue;
            }
            let is_fn = next == Some(&'(');
            if braces == 0 && !parens_label && !is_fn && !KEYWORDS.contains(&word.as_str()) {
                out.push(word);
            }
            continue;
        } else if c == ')' {
            parens_label = false;
        } else if c.is_ascii_digit() {
            // A number (or a duration): skip it whole.
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
            continue;
        }
        i += 1;
    }
    out
}

/// Every `expr` of every panel's targets.
fn dashboard_exprs() -> Vec<String> {
    let path = repo().join("deploy/grafana/gpuctl-fleet.json");
    let d: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    match (k.as_str(), x) {
                        ("expr", Value::String(e)) => out.push(e.clone()),
                        _ => walk(x, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(&d, &mut out);
    assert!(!out.is_empty(), "no expr in {}", path.display());
    out
}

#[test]
fn promql_names_are_read_out_of_expressions() {
    assert_eq!(
        metric_names(r#"count(gpuctl_node_verdict{node=~"a.*"} >= 1) by (node) or vector(0)"#),
        ["gpuctl_node_verdict"]
    );
    assert_eq!(
        metric_names("increase(gpuctl_gpu_xid_errors_total[15m]) > 0 or up{job=\"x\"} == 0"),
        ["gpuctl_gpu_xid_errors_total", "up"]
    );
    assert_eq!(metric_names("a / on(node) group_left(level) b"), ["a", "b"]);
}

#[test]
fn shipped_alert_rules_pass_promtool_check_and_unit_tests() {
    let promtool = tool("promtool");
    let dir = repo().join("deploy/prometheus");
    for args in [
        ["check", "rules", "gpuctl-alerts.yml"],
        ["test", "rules", "gpuctl-alerts.test.yml"],
        ["check", "config", "prometheus.yml"],
    ] {
        let out = Command::new(&promtool)
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {} {}: {}{}",
            args[0],
            args[1],
            String::from_utf8_lossy(&out.stdout),
            stderr(&out)
        );
    }
}

#[test]
fn prometheus_scrapes_the_fleet_series_an_operator_alerts_on() {
    // Found before anything starts: a missing Prometheus fails at once.
    tool("prometheus");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut procs = Procs::default();
    let fleet = start_fleet(dir, &mut procs, 2);
    let prom = start_prometheus(dir, &mut procs, &fleet);

    // Every target answers.
    prom.wait("up", "four targets up", |r| {
        r.len() == 4 && r.iter().all(|(_, v)| *v == 1.0)
    });
    // The H100 agent's exposition as Prometheus stored it: the DCGM names
    // the rules and the dashboard use, counters included.
    for q in [
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "gpuctl_gpu_xid_errors_total",
    ] {
        let r = prom.wait(
            &format!("{q}{{job=\"h100-agent-recording\"}}"),
            "the H100 agent's series",
            |r| r.len() == 1,
        );
        assert_eq!(r[0].0["modelName"], "NVIDIA H100 80GB HBM3", "{r:?}");
    }

    // Acceptance: each node's acceptance verdict is the suite's.
    let suite_file = dir.join("suite.toml");
    std::fs::write(&suite_file, SUITE).unwrap();
    let rules = dir.join("cpu-rules.toml");
    std::fs::write(&rules, CPU_RULES).unwrap();
    let (suite_path, rules_path) = (suite_file.to_str().unwrap(), rules.to_str().unwrap());
    let out = fleet.gpuctl(&[
        "accept", "--suite", suite_path, "--nodes", "all", "--rules", rules_path, "--output",
        "json",
    ]);
    let suite: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no suite JSON ({e}): {}\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            stderr(&out),
            logs(dir)
        )
    });
    let nodes = suite["nodes"].as_array().expect("nodes[]");
    assert_eq!(nodes.len(), 2, "{suite:#}");
    // On a loaded machine a CPU node may warn or even fail a stage: the
    // series must say what the suite said, whatever it said.
    let accepted: Vec<(String, f64)> = nodes
        .iter()
        .map(|n| {
            (
                n["name"].as_str().unwrap().to_string(),
                verdict_value(&n["verdict"]),
            )
        })
        .collect();
    for n in nodes {
        let name = n["name"].as_str().unwrap();
        let want = verdict_value(&n["verdict"]);
        let q =
            format!("gpuctl_node_acceptance_verdict{{node=\"{name}\",level=\"prometheus-test\"}}");
        let got = prom.wait(&q, "acceptance verdict", |r| r.len() == 1)[0].1;
        assert_eq!(got, want, "{name}: {n:#}");
    }

    // A stress job under a floor no CPU reaches: every node fails it, and
    // each one's CPU rank counts figures below its floor.
    let stress_report = suite["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "stress")
        .map(|s| s["report"].clone())
        .expect("a stress stage");
    let floor = unreachable_floor(dir, &stress_report);
    let floored = fleet.run(&[
        "stress",
        "--nodes",
        "2",
        "--duration",
        "3s",
        "--rules",
        floor.to_str().unwrap(),
    ]);
    assert_eq!(floored["verdict"], "fail", "{floored:#}");
    for n in floored["nodes"].as_array().unwrap() {
        let name = n["name"].as_str().unwrap();
        assert_eq!(
            prom.wait(
                &format!("gpuctl_node_verdict{{node=\"{name}\"}}"),
                "last verdict",
                |r| r.len() == 1 && r[0].1 == verdict_value(&n["verdict"])
            )[0]
            .1,
            2.0
        );
        let below = prom.value(&format!(
            "gpuctl_gpu_below_floor{{node=\"{name}\",gpu=\"cpu0\"}}"
        ));
        let fails = fails(&n["findings"])
            .iter()
            .filter(|f| f["reference_kind"] == "floor")
            .count();
        assert!(fails > 0, "{n:#}");
        assert_eq!(below, fails as f64, "{name}: {n:#}");
        // The per-GPU figure is the rank's own in this report.
        let tflops = prom.value(&format!(
            "gpuctl_gpu_stress_tflops{{node=\"{name}\",gpu=\"cpu0\"}}"
        ));
        assert!(tflops > 0.0, "{n:#}");
        // One rank a node: its median GPU is that rank, read by another path.
        assert_eq!(
            tflops,
            prom.value(&format!(
                "gpuctl_node_stress_tflops{{node=\"{name}\",gpu=\"median\"}}"
            ))
        );
        // The acceptance verdict stays what the suite said.
        let want = accepted.iter().find(|(a, _)| a == name).unwrap().1;
        assert_eq!(
            prom.value(&format!(
                "gpuctl_node_acceptance_verdict{{node=\"{name}\"}}"
            )),
            want
        );
    }
    // The shipped rule fires on it, for each node's CPU rank.
    let alerts = prom.wait(
        "ALERTS{alertname=\"GpuctlGpuBelowFloor\",alertstate=\"firing\"}",
        "the below-floor alert",
        |r| r.len() == 2,
    );
    let nodes: BTreeSet<&str> = alerts
        .iter()
        .map(|(m, _)| m["node"].as_str().unwrap())
        .collect();
    assert_eq!(nodes, BTreeSet::from(["node-0", "node-1"]));
    // Nothing is lost yet; the failed-acceptance alert fires for exactly
    // the nodes whose suite failed (none on an idle machine).
    assert!(prom
        .query("ALERTS{alertname=\"GpuctlNodeLost\"}")
        .is_empty());
    // Honest agents send nothing the coordinator refuses.
    assert!(prom
        .query("ALERTS{alertname=\"GpuctlRefusedMessages\"}")
        .is_empty());
    let failed: BTreeSet<&str> = accepted
        .iter()
        .filter(|(_, v)| *v >= 2.0)
        .map(|(n, _)| n.as_str())
        .collect();
    let firing = prom.wait(
        "ALERTS{alertname=\"GpuctlNodeFailedAcceptance\"}",
        "the failed-acceptance alert on the failed nodes only",
        |r| r.len() == failed.len(),
    );
    let firing: BTreeSet<&str> = firing
        .iter()
        .map(|(m, _)| m["node"].as_str().unwrap())
        .collect();
    assert_eq!(firing, failed);

    // Training throughput for the dashboard's samples/s panel.
    let ddp = fleet.run(&[
        "ddp",
        "--nodes",
        "2",
        "--model",
        "cnn",
        "--steps",
        "8",
        "--batch-size",
        "16",
    ]);
    assert_ne!(ddp["verdict"], "incomplete", "{ddp:#}");
    prom.wait("gpuctl_node_samples_per_second", "samples/s", |r| {
        r.len() == 2
    });

    // Drift and per-node figures of the whole fleet.
    for q in [
        "gpuctl_node_drifted_figures",
        "gpuctl_node_all_reduce_busbw_gbps",
        "gpuctl_node_link_median_gbps",
        "gpuctl_node_stress_tflops{gpu=\"worst\"}",
        "gpuctl_node_last_run_timestamp_seconds",
        "gpuctl_node_acceptance_timestamp_seconds",
        "gpuctl_agent_up{job=\"gpuctl-agent\"}",
        "gpuctl_agent_coordinator_connected{job=\"gpuctl-agent\"} == 1",
    ] {
        prom.wait(q, "a series per node", |r| r.len() == 2);
    }

    // Every metric of the Grafana dashboard is a series Prometheus scraped.
    let scraped: BTreeSet<String> = prom
        .api("label/__name__/values")
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect();
    let mut missing = Vec::new();
    for e in dashboard_exprs() {
        for name in metric_names(&e) {
            if !scraped.contains(&name) {
                missing.push(format!("{name} (in `{e}`)"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "the dashboard queries series no gpuctl process serves: {missing:?}\nscraped: {scraped:?}"
    );

    // A node whose agent dies: lost for the coordinator, down for Prometheus,
    // and the lost-node alert fires after its minute.
    procs.stop("node-1");
    prom.wait(
        "gpuctl_node_state{node=\"node-1\",state=\"lost\"} == 1",
        "node-1 lost",
        |r| r.len() == 1,
    );
    let down = format!(
        "up{{job=\"gpuctl-agent\",instance=\"127.0.0.1:{}\"}}",
        fleet.agent_metrics[1]
    );
    assert_eq!(
        prom.wait(&down, "agent down", |r| r.len() == 1 && r[0].1 == 0.0)[0].1,
        0.0
    );
    assert_eq!(
        prom.value("gpuctl_node_state{node=\"node-0\",state=\"ready\"}"),
        1.0
    );
    let pending = prom.wait(
        "ALERTS{alertname=\"GpuctlNodeLost\"}",
        "the lost-node alert (pending for its minute)",
        |r| r.len() == 1,
    );
    assert_eq!(pending[0].0["node"], "node-1");
    drop(procs);
}

//! A request that cannot run is refused before anything runs, naming the
//! flag (exit 2); one found only by a running rank fails its job and no
//! node: `gpuctl fleet` keeps showing what the nodes last did (issue 47:
//! `--pattern search` on two nodes ran, failed both healthy nodes, and the
//! fleet showed them failed).

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::Value;

/// An agent of `ranks` CPU ranks beside the cluster's, stopped when dropped.
struct ExtraAgent(Child);

impl ExtraAgent {
    fn start(c: &Cluster, name: &str, ranks: u32, args: &[&str]) -> ExtraAgent {
        let work = c.dir.path().join(format!("agent-{name}"));
        std::fs::create_dir_all(&work).unwrap();
        let log = std::fs::File::create(c.dir.path().join(format!("agent-{name}.log"))).unwrap();
        let child = Command::new(bin("gpuctl-agent"))
            .args(["--coordinator", &c.url, "--name", name])
            .args(["--cpu-ranks", &ranks.to_string()])
            .arg("--work-dir")
            .arg(&work)
            .args(["--heartbeat-interval", "500ms", "--metrics-listen", "off"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start gpuctl-agent");
        ExtraAgent(child)
    }
}

impl Drop for ExtraAgent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `gpuctl ARGS` must be refused as bad input (exit 2) with `says` in its
/// error, the flag among them.
fn refused(c: &Cluster, args: &[&str], says: &[&str]) {
    let out = c.gpuctl(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    for s in says {
        assert!(err.contains(s), "{args:?} should say `{s}`: {err}");
    }
}

#[test]
fn a_request_that_cannot_run_is_refused_at_submit_and_plan_naming_the_flag() {
    let _g = serial();
    let c = Cluster::start(2, 1);
    // A third node of another size: pairs, bisect and search meet GPU i
    // with GPU i, so every node must run as many ranks.
    let _odd = ExtraAgent::start(&c, "node-9", 2, &[]);
    c.wait_ready(3, Duration::from_secs(60));
    let two = ["--nodes", "all", "--selector", "node!=node-9"];
    for verb in ["submit", "plan"] {
        // The case: `--nodes all` stood for two nodes.
        let args = [&[verb, "nccl", "--pattern", "search"][..], &two].concat();
        refused(&c, &args, &["--pattern", "needs 3 nodes or more"]);
        refused(
            &c,
            &[verb, "nccl", "--pattern", "search", "--nodes", "all"],
            &[
                "--pattern",
                "same number of ranks on every node",
                "node-9 has 2",
            ],
        );
        // Each device's defaults: a CPU rank's sweep ends at 16M.
        refused(
            &c,
            &[verb, "nccl", "--nodes", "1", "--min-bytes", "32M"],
            &["--min-bytes", "on the CPU ranks of"],
        );
        refused(
            &c,
            &[verb, "stress", "--nodes", "1", "--precision", "tf32"],
            &["--precision", "tf32 needs a GPU"],
        );
        refused(
            &c,
            &[verb, "stress", "--nodes", "1", "--precision", "fp8"],
            &["--precision", "fp8 is not supported"],
        );
        refused(
            &c,
            &[verb, "p2p", "--nodes", "1", "--bytes", "2"],
            &["--bytes"],
        );
    }
    let jobs = c.json(&["jobs"]);
    assert_eq!(
        jobs.as_array().map(Vec::len),
        Some(0),
        "nothing of a refused request runs or is stored: {jobs:#}"
    );
    // What the nodes can run, they run: pairs on the two of one size.
    let args = [&["plan", "nccl", "--pattern", "pairs"][..], &two].concat();
    let out = c.gpuctl(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// A worker that knows more than its coordinator (an older coordinator, a
/// newer worker): the wrapper adds `--param GPUCTL_TEST_PARAM` to the
/// command line of the workers of jobs that set it in their environment,
/// and `--param pattern=search` to nccl workers while the file `flag` exists
/// (a suite's stages take no environment).
fn wrapper(dir: &std::path::Path, flag: &std::path::Path) -> String {
    let path = dir.join("worker-wrapper.sh");
    let script = format!(
        "#!/bin/sh\nP=\"$GPUCTL_TEST_PARAM\"\nif [ -z \"$P\" ] && [ -e {f} ]; then case \" $* \" in *\" --workload nccl \"*) P=pattern=search;; esac; fi\nif [ -n \"$P\" ]; then exec {w} \"$@\" --param \"$P\"; fi\nexec {w} \"$@\"\n",
        w = bin("gpuctl-worker").display(),
        f = flag.display()
    );
    std::fs::write(&path, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn a_request_found_only_when_running_fails_the_job_and_no_node() {
    let _g = serial();
    let tools = tempfile::tempdir().unwrap();
    let flag = tools.path().join("search-on-nccl");
    let worker = wrapper(tools.path(), &flag);
    let agent_args = ["--worker-bin", &worker, "--prestart-workers", "false"];
    let c = Cluster::start_with_agent_args(2, 1, "15s", &agent_args);
    let sweep = [
        "nccl",
        "--nodes",
        "2",
        "--ops",
        "all_reduce",
        "--max-bytes",
        "1M",
    ];
    let healthy = run_job(&c, &sweep, Duration::from_secs(180));
    passed(&healthy);
    let healthy_id = healthy["job_id"].as_str().unwrap().to_string();

    // Accepted (`--pattern all`); each rank then runs `--pattern search`
    // on two nodes, finds it cannot, and says it is the request's.
    let args = [&sweep[..], &["--env", "GPUCTL_TEST_PARAM=pattern=search"]].concat();
    let r = run_job(&c, &args, Duration::from_secs(180));
    let id = r["job_id"].as_str().unwrap();
    assert_eq!(r["state"], "failed", "{r:#}");
    assert_eq!(r["verdict"], "fail", "{r:#}");
    let reason = r["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("the request cannot run: ") && reason.contains("needs 3 nodes"),
        "{reason}"
    );
    let fails = fails(&r["findings"]);
    assert_eq!(fails.len(), 1, "{r:#}");
    assert_eq!(
        (&fails[0]["metric"], &fails[0]["node"]),
        (&"request".into(), &"".into())
    );
    for n in r["nodes"].as_array().unwrap() {
        assert_ne!(n["verdict"], "fail", "no node is blamed: {n:#}");
        assert_ne!(n["verdict"], "incomplete", "{n:#}");
        assert!(
            n["reason"].as_str().unwrap().starts_with("not judged"),
            "{n:#}"
        );
    }
    let out = c.gpuctl(&["report", id]);
    assert_eq!(out.status.code(), Some(1), "the job failed");

    // The fleet shows what the nodes last did: the healthy sweep.
    let fleet = c.json(&["fleet"]);
    for i in 0..2 {
        let name = Cluster::agent_name(i);
        let row = fleet_row(&fleet, &name);
        assert_eq!(row["last_job"], healthy_id.as_str(), "{name}: {row:#}");
        assert_eq!(row["last_verdict"], "pass", "{name}: {row:#}");
        assert_eq!(row["runs"], 1, "{name}: {row:#}");
    }

    // In a suite, on a third node of two ranks: a stage that fails for its
    // request at run time (the sweep the wrapper turns into a search over
    // nodes of unequal sizes) and one refused for it at plan time (the
    // search itself) change no node's acceptance state.
    let _odd = ExtraAgent::start(&c, "node-9", 2, &agent_args);
    c.wait_ready(3, Duration::from_secs(60));
    std::fs::write(&flag, "").unwrap();
    let suite = tools.path().join("suite.toml");
    std::fs::write(
        &suite,
        "name = \"request-check\"\n\
         [[stage]]\nname = \"stress\"\nworkload = \"stress\"\nduration = \"3s\"\n\
         [[stage]]\nname = \"sweep\"\nworkload = \"nccl\"\nparams = { ops = \"all_reduce\", max_bytes = \"1M\" }\n\
         [[stage]]\nname = \"links\"\nworkload = \"nccl\"\nparams = { pattern = \"search\" }\n",
    )
    .unwrap();
    let out = c.gpuctl(&["accept", "--suite", suite.to_str().unwrap(), "-o", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let s: Value = serde_json::from_slice(&out.stdout).expect("the suite's JSON");
    let stage = |name: &str| -> Value {
        s["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|st| st["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no stage {name}: {s:#}"))
    };
    let note = |name: &str| stage(name)["note"].as_str().unwrap_or("").to_string();
    assert_eq!(stage("stress")["state"], "succeeded", "{s:#}");
    assert!(note("sweep").starts_with("failed for its request"), "{s:#}");
    assert!(note("links").starts_with("failed for its request"), "{s:#}");
    assert!(note("links").contains("node-9 has 2"), "{s:#}");
    for n in s["nodes"].as_array().unwrap() {
        assert_ne!(n["verdict"], "fail", "{n:#}");
        assert_ne!(n["verdict"], "incomplete", "{n:#}");
    }
    let fleet = c.json(&["fleet"]);
    let stress_job = stage("stress")["job_id"].as_str().unwrap().to_string();
    for name in [
        Cluster::agent_name(0),
        Cluster::agent_name(1),
        "node-9".into(),
    ] {
        let row = fleet_row(&fleet, &name);
        assert!(row["acceptance"].is_null(), "no acceptance state: {row:#}");
        assert_eq!(row["last_job"], stress_job.as_str(), "{name}: {row:#}");
        assert_eq!(row["last_verdict"], "pass", "{name}: {row:#}");
    }
}

//! The exit-code scheme (README "Exit codes") through the real `gpuctl` binary
//! against one small real fleet: a passed job 0, a failed or cancelled job 1
//! for every verb that judges a job, bad input 2, an unknown job 3, and a
//! coordinator nobody listens on 4.

mod common;

use std::process::Output;
use std::time::Duration;

use common::*;

fn code(out: &Output) -> i32 {
    out.status.code().expect("gpuctl ended by a signal")
}

/// Asserts `gpuctl args` exits `want`, showing what it printed otherwise.
fn expect(cluster: &Cluster, args: &[&str], want: i32) -> Output {
    let out = cluster.gpuctl(args);
    assert_eq!(
        code(&out),
        want,
        "gpuctl {args:?}\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
    out
}

/// A loopback port that was free a moment ago and has no listener now.
fn dead_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().unwrap().port()
}

#[test]
fn every_verb_follows_one_exit_code_scheme() {
    let cluster = Cluster::start(1, 2);

    // 0: a job that passed, whichever verb looks at it.
    expect(
        &cluster,
        &[
            "submit",
            "stress",
            "--duration",
            "1s",
            "--nodes",
            "1",
            "--wait",
        ],
        0,
    );
    let jobs = cluster.json(&["jobs"]);
    let passed = job_id(&jobs[0]).expect("job id");
    for verb in ["status", "report", "watch"] {
        expect(&cluster, &[verb, &passed], 0);
    }

    // 1: a job whose worker died (killed for real) is failed, and says so in
    // every verb's exit code.
    let failed = cluster.submit(&["stress", "--duration", "5m", "--nodes", "1"]);
    cluster.wait_workers(&failed, 2, Duration::from_secs(30));
    let victim = cluster.worker_pids(&failed)[0];
    // SAFETY: kill(2) on a pid we just read; at worst it is already gone.
    unsafe { libc::kill(victim as i32, libc::SIGKILL) };
    cluster.wait_state(&failed, &["failed"], Duration::from_secs(30));
    for verb in ["status", "report", "watch"] {
        expect(&cluster, &[verb, &failed], 1);
    }
    assert!(
        cluster
            .wait_workers_gone(&failed, Duration::from_secs(10))
            .is_ok(),
        "workers of {failed} outlived it"
    );

    // 1: so is a cancelled one.
    let cancelled = cluster.submit(&["stress", "--duration", "5m", "--nodes", "1"]);
    cluster.wait_workers(&cancelled, 2, Duration::from_secs(30));
    expect(&cluster, &["cancel", &cancelled], 0);
    cluster.wait_state(&cancelled, &["cancelled"], Duration::from_secs(10));
    expect(&cluster, &["status", &cancelled], 1);
    expect(&cluster, &["report", &cancelled], 1);

    // 2: bad input, refused by clap or by our own checks before sending.
    let out = expect(&cluster, &["status", &passed, "--frobnicate"], 2);
    assert!(stderr(&out).contains("--frobnicate"), "{}", stderr(&out));
    expect(&cluster, &["submit", "stress", "--nodes", "0"], 2);

    // 3: no such job.
    for verb in ["status", "report", "watch", "cancel", "logs"] {
        let out = expect(&cluster, &[verb, "job-999999"], 3);
        assert!(stderr(&out).contains("job-999999"), "{}", stderr(&out));
    }

    // 4: nobody listens at the coordinator's address.
    let nobody = format!("http://127.0.0.1:{}", dead_port());
    for args in [vec!["nodes"], vec!["status", &passed]] {
        let mut all = vec!["--coordinator", nobody.as_str()];
        all.extend(args);
        let out = expect(&cluster, &all, 4);
        assert!(
            stderr(&out).contains("cannot reach coordinator"),
            "{}",
            stderr(&out)
        );
    }
}

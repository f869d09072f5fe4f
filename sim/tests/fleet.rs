//! The coordinator at a simulated 200 nodes × 8 GPUs, as CI can afford: a
//! real coordinator process, 200 fake agents over their own connections,
//! 1,600 fake ranks sending progress and results, one short stress job.
//! Every rank's result must be in the stored report, and the coordinator's
//! memory must come back to about where it was before the job (a generous
//! margin: this checks for retention that grows with the job, not for bytes).
//! And the failover bench at 8 nodes on a real etcd (Debian's `etcd-server`).

use std::path::PathBuf;
use std::time::Duration;

use gpuctl_sim::bench::{self, BenchConfig};
use gpuctl_sim::fleet::RankConnections;

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
        // As gpuctl-agent's relay, the default.
        rank_connections: RankConnections::Agent,
        cli_every: Duration::from_millis(200),
        cli_nice: 0,
        coordinator_log: bench::COORDINATOR_LOG.into(),
    };
    let dir = tempfile_dir("bench");
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
    // Nothing went wrong on the fleet's side.
    assert_eq!(
        (r.sessions_lost, r.rpc_errors, r.results_refused),
        (0, 0, 0),
        "sessions lost, rank calls failed, results refused"
    );
    // Every CLI call answered (an error is counted under its own key),
    // and each one listed, to be laid beside the coordinator's log.
    for p in &r.phases {
        assert!(
            p.cli.keys().all(|k| !k.contains("error")),
            "{}: {:?}",
            p.name,
            p.cli
        );
        for (call, &(_, _, n)) in &p.cli {
            let listed = p.calls.iter().filter(|c| &c.0 == call).count();
            assert_eq!(listed, n, "{}: {call} calls listed", p.name);
        }
    }
}

/// A coordinator process, killed when dropped: a failed assertion must
/// not leave it running.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A coordinator process on `port` over the store in `dir`; its URL.
fn start_coordinator(port: u16, dir: &std::path::Path) -> (Killed, String) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(coordinator_bin())
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--node-timeout", "30s"])
        .arg("--data-dir")
        .arg(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(dir.with_extension("log")).unwrap())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("the coordinator printed `{line}`, not `listening on URL`"));
    (Killed(child), url.to_string())
}

/// The simulated agents do what `gpuctl-agent` does when their coordinator
/// is killed and started again: they open their sessions again, offer
/// their running ranks, and the job they run ends with every result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_comes_back_after_a_coordinator_restart_and_its_job_ends() {
    use gpuctl_proto::pb::{
        job_service_client::JobServiceClient, GetJobRequest, GetReportRequest, JobSpec, JobState,
        ListNodesRequest, SubmitRequest,
    };
    use gpuctl_sim::fleet::{self, FleetConfig};
    use std::sync::atomic::Ordering;

    let dir = std::env::temp_dir().join(format!("gpuctl-sim-restart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (coord, url) = start_coordinator(port, &dir.join("store"));
    let stop = gpuctl_core::shutdown::Shutdown::new();
    let nodes = 4;
    let fleet = fleet::start(
        FleetConfig {
            url: url.clone(),
            nodes,
            gpus: 2,
            interval: Duration::from_secs(1),
            connections: nodes,
            // As gpuctl-worker: the ranks' connections outlive no job, and
            // must find the restarted coordinator by themselves.
            rank_connections: RankConnections::Rank,
            first: 0,
            own_addresses: false,
        },
        stop.clone(),
    )
    .await
    .expect("the fleet registered");
    let connect = || async {
        let ch = gpuctl_core::client::builder(&url).connect().await.unwrap();
        JobServiceClient::new(ch).max_decoding_message_size(64 << 20)
    };
    let mut jobs = connect().await;
    let spec = JobSpec {
        workload: "stress".into(),
        all_nodes: true,
        duration_ms: 8_000,
        ..Default::default()
    };
    let id = jobs
        .submit(SubmitRequest { spec: Some(spec) })
        .await
        .unwrap()
        .into_inner()
        .id;
    let state = |jobs: &mut JobServiceClient<_>| {
        let req = GetJobRequest {
            job_id: id.clone(),
            max_ranks: 0,
        };
        let mut jobs: JobServiceClient<_> = jobs.clone();
        async move { jobs.get_job(req).await.map(|j| j.into_inner().state()) }
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while state(&mut jobs).await.unwrap() != JobState::Running {
        assert!(std::time::Instant::now() < deadline, "the job never ran");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    drop(coord);
    let restarted_ms = gpuctl_core::now_ms();
    let (coord, _) = start_coordinator(port, &dir.join("store"));
    let mut jobs = connect().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match state(&mut jobs).await {
            Ok(JobState::Succeeded) => break,
            Ok(s) if s.is_terminal() => panic!("the job ended {s:?} after the restart"),
            _ => {}
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the job did not end within 60 s of the restart"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let report = jobs
        .get_report(GetReportRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    let results = report
        .nodes
        .iter()
        .flat_map(|n| &n.ranks)
        .filter(|r| r.result.is_some())
        .count();
    assert_eq!(results, nodes * 2, "every rank's result in the report");
    // Every node heard from since the restart, each session opened again.
    let listed = jobs
        .list_nodes(ListNodesRequest {
            brief: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .table
        .unwrap_or_default();
    assert_eq!(listed.len(), nodes);
    for n in listed.rows() {
        assert!(
            n.last_heartbeat_unix_ms > restarted_ms,
            "{} not heard from since the restart",
            n.name
        );
    }
    let lost = fleet.stats.sessions_lost.load(Ordering::Relaxed);
    let back = fleet.stats.reconnects.load(Ordering::Relaxed);
    assert!(
        lost >= nodes as u64 && back >= nodes as u64,
        "{lost} sessions lost, {back} opened again"
    );
    stop.cancel();
    drop(coord);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A folder of this test's own: the tests of this file run at once.
fn tempfile_dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpuctl-sim-test-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `gpuctl-sim failover` small: a leader and a standby on a real etcd, 8
/// fake agents given both URLs, the leader SIGKILLed while a stress job
/// runs, half the fleet in a second process, each node from a loopback
/// address of its own. The standby must serve, every node register with it
/// (counted across both processes), and the job end `succeeded` with every
/// rank's result (adopted from the agents).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_brings_every_node_and_result_through() {
    use gpuctl_sim::bench::failover::{self, FailoverConfig};
    let (nodes, gpus) = (8, 2);
    let cfg = FailoverConfig {
        coordinator_bin: coordinator_bin(),
        nodes,
        gpus,
        interval: Duration::from_secs(1),
        connections: nodes,
        job: Duration::from_secs(20),
        kill_after: Duration::from_secs(1),
        // Half the fleet in a `gpuctl-sim fleet` child, as at 16,384 nodes.
        fleet_processes: 2,
        sim_bin: PathBuf::from(env!("CARGO_BIN_EXE_gpuctl-sim")),
        fleet_nice: 0,
    };
    let dir = tempfile_dir("failover");
    let r = failover::run(&cfg, dir.clone())
        .await
        .expect("the failover bench ran (etcd installed: apt-get install etcd-server)");
    let _ = std::fs::remove_dir_all(&dir);
    failover::print(&r);
    assert!(r.standby_serves_ms.is_finite(), "{:#}", r.to_json());
    assert!(r.all_listed_ms.is_finite(), "{:#}", r.to_json());
    assert_eq!(r.job_state, "succeeded", "{:#}", r.to_json());
    assert_eq!(r.ranks, (nodes as u32) * gpus);
    assert_eq!(r.results_in_report, r.ranks, "{:#}", r.to_json());
    assert_eq!(r.results_refused, 0);
}

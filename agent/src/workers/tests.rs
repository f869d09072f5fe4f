//! The worker manager's tests, end to end through fake worker scripts: kept
//! apart so that the manager's files hold only what runs in the agent; the
//! helpers here (`settings`, `assignment`, `script`, `collect`) serve
//! prestart.rs's tests too.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpuctl_core::clock::Clock;
use gpuctl_proto::pb::{
    agent_message::Msg, Assignment, JobSpec, RankPlacement, WorkerExited, WorkerLog,
};

use super::*;

/// A node `n1` whose GPU 3 has a UUID, workers getting a short kill grace.
pub(super) fn settings(dir: &Path, worker_bin: PathBuf) -> WorkerSettings {
    WorkerSettings {
        node: "n1".into(),
        worker_bin,
        work_dir: dir.join("work"),
        ld_library_path: Some("/shim:/torch/lib".into()),
        gpu_uuids: HashMap::from([(3, "GPU-3333".to_string())]),
        kill_grace: Duration::from_millis(500),
    }
}

pub(super) fn assignment(ranks: &[(u32, Option<u32>)], deadline_unix_ms: u64) -> Assignment {
    Assignment {
        job_id: "job-7".into(),
        attempt: 2,
        spec: Some(JobSpec {
            workload: "stress".into(),
            duration_ms: 5000,
            params: [
                ("size".to_string(), "256".to_string()),
                ("precision".into(), "fp32".into()),
            ]
            .into(),
            env: [("NCCL_DEBUG".to_string(), "WARN".to_string())].into(),
            ..Default::default()
        }),
        ranks: ranks
            .iter()
            .enumerate()
            .map(|(i, (rank, dev))| RankPlacement {
                rank: *rank,
                local_rank: i as u32,
                node_rank: 1,
                node: "n1".into(),
                gpu_index: *dev,
                ..Default::default()
            })
            .collect(),
        env: [
            ("NCCL_DEBUG".to_string(), "INFO".to_string()),
            ("OMP_NUM_THREADS".into(), "4".into()),
        ]
        .into(),
        world_size: 4,
        node_rank: 1,
        nnodes: 2,
        master_addr: "10.0.0.1".into(),
        master_port: 29500,
        deadline_unix_ms,
        coordinator_url: String::new(),
        ..Default::default()
    }
}

#[test]
fn worker_command_follows_the_contract() {
    let s = settings(Path::new("/tmp"), "/bin/true".into());
    let a = assignment(&[(2, Some(3)), (3, None)], 1_700_000_000_000);
    let c = worker_command(&s, "http://c:7070", &a, &a.ranks[0]).unwrap();
    let args = c.args.join(" ");
    assert_eq!(
        args,
        "--coordinator http://c:7070 --job-id job-7 --attempt 2 --workload stress --node n1 \
         --gpu-index 3 --gpu-uuid GPU-3333 --duration-ms 5000 \
         --deadline-unix-ms 1700000000000 --param precision=fp32 --param size=256"
    );
    let env: HashMap<_, _> = c.env.iter().cloned().collect();
    for (k, v) in [
        ("RANK", "2"),
        ("LOCAL_RANK", "0"),
        ("WORLD_SIZE", "4"),
        ("LOCAL_WORLD_SIZE", "2"),
        ("GROUP_RANK", "1"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29500"),
        ("OMP_NUM_THREADS", "4"),
        ("NCCL_DEBUG", "WARN"),
        ("CUDA_VISIBLE_DEVICES", "GPU-3333"),
        ("GPUCTL_COORDINATOR", "http://c:7070"),
        ("LD_LIBRARY_PATH", "/shim:/torch/lib"),
    ] {
        assert_eq!(env.get(k).map(String::as_str), Some(v), "{k}");
    }
    // Later entries win: the user's NCCL_DEBUG comes after the plan's.
    let last_nccl = c.env.iter().rev().find(|(k, _)| k == "NCCL_DEBUG").unwrap();
    assert_eq!(last_nccl.1, "WARN");

    let cpu = worker_command(&s, "http://c:7070", &a, &a.ranks[1]).unwrap();
    assert!(!cpu.args.iter().any(|x| x == "--device"));
    assert!(!cpu.args.iter().any(|x| x == "--gpu-index"));
    assert!(!cpu.env.iter().any(|(k, _)| k == "CUDA_VISIBLE_DEVICES"));

    let bad = assignment(&[(0, Some(9))], 0);
    assert!(worker_command(&s, "u", &bad, &bad.ranks[0])
        .unwrap_err()
        .contains("GPU 9"));
}

pub(super) fn script(dir: &Path, body: &str) -> PathBuf {
    let p = dir.join("fake-worker");
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// Collects events until every listed rank has exited.
pub(super) async fn collect(
    events: &mut EventReceiver,
    ranks: usize,
) -> (Vec<WorkerLog>, Vec<WorkerExited>) {
    let (mut logs, mut exits) = (Vec::new(), Vec::new());
    while exits.len() < ranks {
        let m = tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .expect("no event within 10 s")
            .unwrap();
        match m.msg.unwrap() {
            Msg::Log(l) => logs.push(l),
            Msg::WorkerExited(e) => exits.push(e),
            other => panic!("unexpected {other:?}"),
        }
    }
    exits.sort_by_key(|e| e.rank);
    (logs, exits)
}

#[tokio::test]
async fn worker_output_and_exit_are_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = script(
        tmp.path(),
        r#"echo "args: $*"; echo "rank=$RANK local=$LOCAL_RANK ld=$LD_LIBRARY_PATH"
i=0; while [ $i -lt 30 ]; do echo "err $i" >&2; i=$((i+1)); done
exit $((RANK + 3))"#,
    );
    let (w, mut events) = Workers::new(settings(tmp.path(), bin), "http://coord:1".into());
    let ack = w.start(assignment(&[(2, None), (3, None)], 0));
    assert!(ack.ok, "{}", ack.error);
    let (logs, exits) = collect(&mut events, 2).await;
    assert_eq!(
        exits
            .iter()
            .map(|e| (e.rank, e.exit_code))
            .collect::<Vec<_>>(),
        vec![(2, 5), (3, 6)]
    );
    for e in &exits {
        assert_eq!(e.stopped_by(), StopReason::Unspecified);
        assert_eq!((e.job_id.as_str(), e.attempt), ("job-7", 2));
        let tail: Vec<&str> = e.stderr_tail.lines().collect();
        assert_eq!(tail.len(), STDERR_TAIL_LINES);
        assert_eq!((tail[0], tail[19]), ("err 10", "err 29"));
    }
    let rank2: Vec<String> = logs
        .iter()
        .filter(|l| l.rank == 2)
        .flat_map(|l| l.lines.clone())
        .collect();
    assert!(
        rank2
            .iter()
            .any(|l| l.starts_with("args: --coordinator http://coord:1 --job-id job-7")),
        "{rank2:?}"
    );
    assert!(
        rank2.contains(&"rank=2 local=0 ld=/shim:/torch/lib".to_string()),
        "{rank2:?}"
    );
    assert_eq!(rank2.len(), 32);
    assert!(w.running().is_empty());
    assert_eq!(w.live_workers(), 0);
    assert!(tmp.path().join("work/jobs/job-7-a2").is_dir());
}

#[tokio::test]
async fn cancel_kills_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = script(tmp.path(), "echo started; exec sleep 100");
    let (w, mut events) = Workers::new(settings(tmp.path(), bin), "u".into());
    assert!(w.start(assignment(&[(0, None), (1, None)], 0)).ok);
    let running = w.running();
    assert_eq!(running.len(), 1);
    assert_eq!(running[0].ranks, vec![0, 1]);
    // Let the workers start before killing them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let procs = &w.running()[0].processes;
    assert_eq!(procs.iter().map(|p| p.rank).collect::<Vec<_>>(), vec![0, 1]);
    assert!(
        procs
            .iter()
            .all(|p| p.pid > 0 && p.state_name == "sleeping"),
        "{procs:?}"
    );
    assert!(w.cancel("job-7", 0, StopReason::Hang));
    let (_, exits) = collect(&mut events, 2).await;
    for e in exits {
        assert_eq!(
            (e.exit_code, e.signal.as_str(), e.stopped_by().label()),
            (-1, "SIGTERM", "hang")
        );
    }
    assert!(w.running().is_empty());
    assert!(
        !w.cancel("job-7", 0, StopReason::Cancel),
        "job forgotten once its ranks are gone"
    );
    let ask = |why: StopReason| gpuctl_proto::pb::CancelJob {
        stopped_by: why as i32,
        ..Default::default()
    };
    assert_eq!(
        stop_reason_of(&ask(StopReason::Unspecified)),
        StopReason::Cancel
    );
    assert_eq!(stop_reason_of(&ask(StopReason::Hang)), StopReason::Hang);
    assert_eq!(
        stop_reason_of(&ask(StopReason::Deadline)),
        StopReason::Deadline
    );
}

#[tokio::test]
async fn deadline_and_kill_all() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = script(tmp.path(), "exec sleep 100");
    // A clock held decades behind wall time: by the system clock this
    // deadline passed long ago, so the worker living 300 ms shows that the
    // deadline is read against the manager's clock.
    let clock = Clock::manual(1_000_000);
    let (w, mut events) = Workers::with_clock(settings(tmp.path(), bin), "u".into(), clock.clone());
    let started = Instant::now();
    assert!(w.start(assignment(&[(0, None)], clock.now_ms() + 300)).ok);
    let (_, exits) = collect(&mut events, 1).await;
    assert_eq!(exits[0].stopped_by(), StopReason::Deadline);
    assert!(started.elapsed() >= Duration::from_millis(300));

    let mut a = assignment(&[(0, None)], 0);
    a.job_id = "job-8".into();
    assert!(w.start(a).ok);
    assert!(
        w.kill_all_and_wait(StopReason::CoordinatorLost, Duration::from_secs(5))
            .await
    );
    let (_, exits) = collect(&mut events, 1).await;
    assert_eq!(exits[0].stopped_by(), StopReason::CoordinatorLost);
    assert_eq!(w.live_workers(), 0);
}

#[tokio::test]
async fn missing_worker_binary_fails_the_assignment_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("no-such-worker");
    let (w, mut events) = Workers::new(settings(tmp.path(), bin.clone()), "u".into());
    let ack = w.start(assignment(&[(0, None), (1, None)], 0));
    assert!(!ack.ok);
    assert!(
        ack.error.contains(&bin.display().to_string()),
        "{}",
        ack.error
    );
    assert!(ack.error.contains("--worker-bin"), "{}", ack.error);
    let (_, exits) = collect(&mut events, 2).await;
    assert_eq!(
        exits.iter().map(|e| e.exit_code).collect::<Vec<_>>(),
        vec![127, 127]
    );
    assert!(exits[0].stderr_tail.contains("--worker-bin"));
    assert!(w.running().is_empty());
}

#[tokio::test]
async fn log_lines_are_batched_and_cut() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = script(
        tmp.path(),
        r#"i=0; while [ $i -lt 120 ]; do echo "line $i"; i=$((i+1)); done
head -c 40000 /dev/zero | tr '\0' x; printf '\n'; printf 'no newline at end'"#,
    );
    let (w, mut events) = Workers::new(settings(tmp.path(), bin), "u".into());
    assert!(w.start(assignment(&[(0, None)], 0)).ok);
    let (logs, _) = collect(&mut events, 1).await;
    assert!(logs.iter().all(|l| l.lines.len() <= LOG_BATCH_LINES));
    let lines: Vec<String> = logs.into_iter().flat_map(|l| l.lines).collect();
    assert_eq!(lines.len(), 122);
    assert_eq!(lines[119], "line 119");
    assert!(lines[120].ends_with("[line cut by gpuctl-agent]"));
    assert!(lines[120].len() < MAX_LINE_BYTES + 64);
    assert_eq!(lines[121], "no newline at end");
}

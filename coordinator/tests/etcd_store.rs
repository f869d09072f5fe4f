//! The etcd store against a real etcd (Debian's `etcd-server`, started here as
//! a child process on free loopback ports): key-value round trips, paged
//! scans, atomic and fenced `put_many`, persistence across clients, a clear
//! error for an unreachable etcd, and real `gpuctl-coordinator` processes on
//! `--store etcd` keeping their state across restarts, with a standby that
//! takes over when the leader dies.
//!
//! etcd must be installed: these tests fail (they do not skip) without it.

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::etcd::{coordinator_bin, free_port, Coordinator, Etcd};
use gpuctl_coordinator::store::etcd::{leader_key, EtcdStore, LEADER_TTL};
use gpuctl_coordinator::store::{keys, Batch, StateStore, Store};
use gpuctl_core::shutdown::Shutdown;
use gpuctl_proto::pb::job_service_client::JobServiceClient;
use gpuctl_proto::pb::*;
use gpuctl_testkit::host;

#[tokio::test]
async fn round_trips_pages_and_persists() {
    let etcd = Etcd::start().await;
    let store = EtcdStore::connect(&etcd.url, "/t/").await.unwrap();
    assert_eq!(store.get("a".into()).await.unwrap(), None);
    store.put("a".into(), b"1".to_vec()).await.unwrap();
    assert_eq!(store.get("a".into()).await.unwrap(), Some(b"1".to_vec()));
    store.put("a".into(), b"2".to_vec()).await.unwrap();
    assert_eq!(store.get("a".into()).await.unwrap(), Some(b"2".to_vec()));
    assert!(store.delete("a".into()).await.unwrap());
    assert!(!store.delete("a".into()).await.unwrap());
    assert_eq!(store.get("a".into()).await.unwrap(), None);

    // Neighbours sharing a prefix stay out of scans, keys come back in order
    // and without the etcd prefix.
    store
        .put_many(vec![
            ("results/job-1/1/000001".into(), b"r1".to_vec()),
            ("results/job-1/1/000000".into(), b"r0".to_vec()),
            ("results/job-10/1/000000".into(), b"x".to_vec()),
        ])
        .await
        .unwrap();
    let scan = store.scan_prefix("results/job-1/".into()).await.unwrap();
    assert_eq!(
        scan,
        vec![
            ("results/job-1/1/000000".to_string(), b"r0".to_vec()),
            ("results/job-1/1/000001".to_string(), b"r1".to_vec()),
        ]
    );
    // The fleet view's reads: several prefixes at once, and keys alone.
    let both = store
        .scan_prefixes(vec!["results/job-10/".into(), "results/job-1/".into()])
        .await
        .unwrap();
    assert_eq!(
        both,
        vec![
            store.scan_prefix("results/job-10/".into()).await.unwrap(),
            scan.clone()
        ]
    );
    assert_eq!(
        store.scan_keys("results/job-1".into()).await.unwrap(),
        [
            "results/job-1/1/000000",
            "results/job-1/1/000001",
            "results/job-10/1/000000"
        ]
    );

    // More keys than one transaction (128 ops) and one scan page (500) hold.
    let many: Vec<(String, Vec<u8>)> = (0..1234)
        .map(|i| {
            (
                format!("logs/job-9/000000/{i:010}"),
                vec![b'v'; 100 + i % 7],
            )
        })
        .collect();
    store.put_many(many.clone()).await.unwrap();
    assert_eq!(store.scan_prefix("logs/job-9/".into()).await.unwrap(), many);

    // Another prefix on the same etcd sees none of it.
    let other = EtcdStore::connect(&etcd.url, "/other").await.unwrap();
    assert_eq!(other.prefix(), "/other/");
    assert!(other.scan_prefix(String::new()).await.unwrap().is_empty());

    // The typed layer on etcd.
    let state = StateStore::new(Arc::new(store));
    let mut job = Job {
        id: "job-000007".into(),
        state: JobState::Running as i32,
        plan: Some(Plan {
            world_size: 2,
            nodes: vec!["node-1".into()],
            ..Default::default()
        }),
        ..Default::default()
    };
    // The fleet history, as a finished job leaves it.
    let run = NodeRun {
        node: "node-1".into(),
        job_id: "job-000007".into(),
        finished_unix_ms: 1_700_000_000_000,
        verdict: Verdict::Pass as i32,
        figures: vec![FigureRecord {
            metric: "stress_tflops".into(),
            key: "bf16 8192".into(),
            value: 660.0,
            ..Default::default()
        }],
        ..Default::default()
    };
    state
        .write(
            Batch::default()
                .job(&mut job)
                .plan(&job)
                .job_seq(7)
                .run(&run)
                .history_due("job-000007"),
        )
        .await
        .unwrap();
    state.close().await.unwrap();
    assert!(
        state.job_seq().await.is_err(),
        "a closed store refuses calls"
    );

    // A new client (a restarted coordinator) finds everything.
    let again = StateStore::new(Arc::new(
        EtcdStore::connect(&etcd.url, "/t/").await.unwrap(),
    ));
    assert_eq!(again.job_seq().await.unwrap(), 7);
    assert_eq!(again.jobs().await.unwrap(), vec![job]);
    assert_eq!(
        again.history(Some("node-1")).await.unwrap(),
        vec![run.clone()]
    );
    assert_eq!(again.history(None).await.unwrap(), vec![run]);
    // A mark of runs due (an empty value) survives and goes.
    assert_eq!(again.history_due().await.unwrap(), ["job-000007"]);
    assert!(again.history_done("job-000007").await.unwrap());
    assert!(again.history_due().await.unwrap().is_empty());
    assert_eq!(
        again.raw().scan_prefix("logs/".into()).await.unwrap().len(),
        1234
    );
    // Raw check that the keys are the embedded store's keys under the prefix.
    let raw = EtcdStore::connect(&etcd.url, "").await.unwrap();
    assert!(raw
        .get(format!("/t/{}", keys::job("job-000007")))
        .await
        .unwrap()
        .is_some());

    // A job deleted whole (`--keep-jobs`): one prefix at a time, more keys
    // than a transaction holds, and its neighbour `job-10` stays.
    assert_eq!(
        again
            .raw()
            .delete_prefix("logs/job-9/".into())
            .await
            .unwrap(),
        1234
    );
    assert_eq!(again.delete_job("job-1").await.unwrap(), 2);
    assert_eq!(
        again.raw().scan_prefix("results/".into()).await.unwrap(),
        vec![("results/job-10/1/000000".to_string(), b"x".to_vec())]
    );
    // Its record and, apart, its plan.
    assert_eq!(again.delete_job("job-000007").await.unwrap(), 2);
    assert!(again.jobs().await.unwrap().is_empty());
    assert!(again
        .raw()
        .scan_prefix("logs/".into())
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_many_is_atomic_and_fenced() {
    let etcd = Etcd::start().await;
    // A reader never sees half of a batch: every scan (one snapshot) finds all
    // 100 keys at the same generation.
    let writer = Arc::new(EtcdStore::connect(&etcd.url, "/atomic/").await.unwrap());
    let reader = EtcdStore::connect(&etcd.url, "/atomic/").await.unwrap();
    let batch = |gen: u32| -> Vec<(String, Vec<u8>)> {
        (0..100)
            .map(|i| (format!("k/{i:03}"), gen.to_string().into_bytes()))
            .collect()
    };
    writer.put_many(batch(0)).await.unwrap();
    let w = Arc::clone(&writer);
    let writing = tokio::spawn(async move {
        for gen in 1..=60 {
            w.put_many(batch(gen)).await.unwrap();
        }
    });
    let mut scans = 0;
    let mut gens = std::collections::BTreeSet::new();
    while !writing.is_finished() || scans == 0 {
        let seen = reader.scan_prefix("k/".into()).await.unwrap();
        assert_eq!(seen.len(), 100);
        let first = &seen[0].1;
        assert!(
            seen.iter().all(|(_, v)| v == first),
            "a scan saw two generations of one batch: {:?}",
            seen.iter()
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                .collect::<std::collections::BTreeSet<_>>()
        );
        gens.insert(first.clone());
        scans += 1;
    }
    writing.await.unwrap();
    assert!(scans > 1, "the reader ran alongside the writer");

    // Fencing: a leader whose key is gone writes nothing of a batch, says
    // why, and signals its stop.
    let leader = EtcdStore::connect(&etcd.url, "/fenced/").await.unwrap();
    let stopped = leader
        .lead("test leader", LEADER_TTL, Shutdown::new())
        .await
        .unwrap()
        .expect("no other leader");
    leader.put("before".into(), b"1".to_vec()).await.unwrap();
    let raw = EtcdStore::connect(&etcd.url, "").await.unwrap();
    assert!(raw.delete(leader_key("/fenced/")).await.unwrap());
    let err = leader
        .put_many(vec![
            ("x".into(), b"1".to_vec()),
            ("y".into(), b"2".to_vec()),
        ])
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("no longer holds the etcd leader key"), "{err}");
    assert!(leader.get("x".into()).await.unwrap().is_none());
    assert!(leader.get("y".into()).await.unwrap().is_none());
    assert_eq!(
        leader.get("before".into()).await.unwrap(),
        Some(b"1".to_vec())
    );
    tokio::time::timeout(Duration::from_secs(5), stopped.cancelled())
        .await
        .expect("the lost leadership trips the stop signal");
    assert!(leader.close().await.is_err(), "close reports the lost lead");
}

/// Raw keys under `prefix` in etcd, the store's own prefix included.
async fn raw_keys(url: &str, prefix: &str) -> usize {
    let mut c = etcd_client::Client::connect([url], None).await.unwrap();
    let opts = etcd_client::GetOptions::new()
        .with_prefix()
        .with_count_only();
    c.get(prefix, Some(opts)).await.unwrap().count() as usize
}

#[tokio::test]
async fn values_past_one_request_are_stored_in_parts() {
    // A report of 1,024 × 8 ranks was refused whole ("etcdserver: request is
    // too large"): past 512 KiB a value goes in parts, read back whole.
    let etcd = Etcd::start().await;
    let store = EtcdStore::connect(&etcd.url, "/t/").await.unwrap();
    let big = |seed: u8, n: usize| -> Vec<u8> { (0..n).map(|i| (i as u8) ^ seed).collect() };
    let (one, two) = (big(1, 3 << 20), big(2, (5 << 20) / 2));
    store
        .put_many(vec![
            ("reports/job-1".into(), one.clone()),
            ("reports/job-2".into(), b"small".to_vec()),
        ])
        .await
        .unwrap();
    assert_eq!(
        store.get("reports/job-1".into()).await.unwrap(),
        Some(one.clone())
    );
    assert_eq!(
        raw_keys(&etcd.url, "/t/reports/job-1\0").await,
        6,
        "3 MiB in 512 KiB parts"
    );
    let scan = store.scan_prefix("reports/".into()).await.unwrap();
    assert_eq!(
        scan,
        vec![
            ("reports/job-1".to_string(), one),
            ("reports/job-2".to_string(), b"small".to_vec()),
        ],
        "a scan hands over the whole value once, and no part"
    );
    // Written again: the new parts alone remain.
    store
        .put("reports/job-1".into(), two.clone())
        .await
        .unwrap();
    assert_eq!(store.get("reports/job-1".into()).await.unwrap(), Some(two));
    assert_eq!(raw_keys(&etcd.url, "/t/reports/job-1\0").await, 5);
    assert!(store.delete("reports/job-1".into()).await.unwrap());
    assert_eq!(store.get("reports/job-1".into()).await.unwrap(), None);
    assert_eq!(
        raw_keys(&etcd.url, "/t/reports/job-1").await,
        0,
        "no part outlives its key"
    );
}

#[tokio::test]
async fn unreachable_etcd_names_the_endpoint_and_the_fix() {
    let url = format!("http://127.0.0.1:{}", free_port());
    let err = match EtcdStore::connect(&url, "/gpuctl/").await {
        Ok(_) => panic!("connected to nothing at {url}"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains(&format!("cannot reach etcd at {url}")),
        "{err}"
    );
    assert!(err.contains("--store embedded"), "{err}");

    // The coordinator fails at startup with the same message.
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(coordinator_bin())
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "off"])
        .args(["--store", "etcd", "--etcd", &url])
        .arg("--data-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot reach etcd at {url}")),
        "{stderr}"
    );
    assert!(stderr.contains("start etcd"), "{stderr}");

    // And without --etcd it says what to pass.
    let out = Command::new(coordinator_bin())
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "off"])
        .args(["--store", "etcd"])
        .env_remove("GPUCTL_ETCD")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("--store etcd needs --etcd URL"), "{stderr}");
}

async fn node_names(url: &str) -> Vec<String> {
    let mut client = JobServiceClient::connect(url.to_string()).await.unwrap();
    let nodes = client
        .list_nodes(ListNodesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .nodes;
    nodes.into_iter().map(|n| n.name).collect()
}

async fn job_ids(url: &str) -> Vec<String> {
    let mut client = JobServiceClient::connect(url.to_string()).await.unwrap();
    let jobs = client
        .list_jobs(ListJobsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .jobs;
    jobs.into_iter().map(|j| j.id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinators_keep_state_in_etcd_and_a_standby_takes_over() {
    let etcd = Etcd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = "/gpuctl-test/";

    // The first coordinator leads and stores a node and a job.
    let mut a = Coordinator::start(&etcd, prefix, dir.path(), "a");
    let url_a = a.serving(Duration::from_secs(30));
    gpuctl_testkit::agent::register(&url_a, "node-0", host::cpu("node-0", 2), vec![]).await;
    assert_eq!(node_names(&url_a).await, vec!["node-0"]);
    let mut jobs = JobServiceClient::connect(url_a.clone()).await.unwrap();
    let submitted = jobs
        .submit(common::spec("stress", 1))
        .await
        .unwrap_or_else(|e| panic!("submit: {e}\n{}", a.log()))
        .into_inner();
    assert!(!submitted.id.is_empty());

    // A second one on the same prefix stands by and does not serve.
    let mut b = Coordinator::start(&etcd, prefix, dir.path(), "b");
    let started = Instant::now();
    while !b.log().contains("standby") {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the second coordinator did not say it stands by:\n{}",
            b.log()
        );
        assert!(b.child.try_wait().unwrap().is_none(), "{}", b.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(b.log().contains(&leader_key(prefix)), "{}", b.log());
    assert!(
        b.url.try_recv().is_err(),
        "a standby must not serve:\n{}",
        b.log()
    );

    // The leader dies without a word: the standby takes over when the lease
    // expires, with the stored node and job.
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let url_b = b.serving(LEADER_TTL + Duration::from_secs(20));
    assert_eq!(node_names(&url_b).await, vec!["node-0"]);
    assert_eq!(job_ids(&url_b).await, vec![submitted.id.clone()]);

    // A clean stop releases the lead at once: a restarted coordinator
    // serves well before the lease would have expired, with the same state.
    let status = b.terminate();
    assert!(status.success(), "exit {status}:\n{}", b.log());
    assert!(
        b.log().contains("released the etcd leader key"),
        "{}",
        b.log()
    );
    let mut c = Coordinator::start(&etcd, prefix, dir.path(), "c");
    let url_c = c.serving(LEADER_TTL / 2);
    assert_eq!(node_names(&url_c).await, vec!["node-0"]);
    assert_eq!(job_ids(&url_c).await, vec![submitted.id]);
    // Nothing of it went to the embedded store.
    assert!(!dir.path().join("c").join("gpuctl.redb").exists());

    // A leader whose lease is gone (as after a partition longer than the
    // TTL) stops with an error instead of serving on without the lead.
    let mut raw = etcd_client::Client::connect([etcd.url.as_str()], None)
        .await
        .unwrap();
    let held = raw.get(leader_key(prefix), None).await.unwrap();
    let lease = held.kvs().first().expect("the leader key").lease();
    raw.lease_revoke(lease).await.unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = c.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < LEADER_TTL,
            "the coordinator kept running without its lease:\n{}",
            c.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!status.success(), "{}", c.log());
    assert!(c.log().contains("lost the etcd leader key"), "{}", c.log());
}

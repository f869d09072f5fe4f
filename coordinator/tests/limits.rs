//! Bad input at the protocol edge, against a live coordinator over real gRPC:
//! oversized registrations, rendezvous values and specs are refused naming
//! the field, nothing of them is stored, and the coordinator keeps serving;
//! a node that runs no job can be removed; registrations past
//! `--max-registrations-per-s` are refused naming it, and get in later.

mod common;

use std::time::Duration;

use common::{list_nodes, spec, start, start_cfg};
use gpuctl_proto::pb::agent_service_client::AgentServiceClient;
use gpuctl_proto::pb::*;
use gpuctl_testkit::agent::register;
use gpuctl_testkit::{host, FakeAgent};
use tonic::Code;

#[tokio::test]
async fn oversized_input_is_refused_naming_the_field_and_nothing_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let coord = start(dir.path(), Duration::from_secs(15)).await;
    let mut agents = AgentServiceClient::connect(coord.url.clone())
        .await
        .unwrap();
    let reg = |name: String, gpus: usize| RegisterRequest {
        gpus: vec![GpuInfo::default(); gpus],
        ..host::register_request(&name, host::cpu("x", 1))
    };

    let e = agents
        .register(reg("big".into(), 100_000))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().starts_with("gpus:") && e.message().contains("at most 64"),
        "{e}"
    );
    // Found by the fuzz test: four billion CPU ranks planned row by row.
    let mut many = reg("many".into(), 0);
    many.facts.as_mut().unwrap().cpu_ranks = u32::MAX;
    let e = agents.register(many).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().starts_with("facts.cpu_ranks:"), "{e}");
    let e = agents
        .register(reg("h".repeat(10 << 20), 1))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().starts_with("name:"),
        "{}",
        &e.message()[..80.min(e.message().len())]
    );

    let mut jobs = coord.jobs().await;
    let nodes = list_nodes(&mut jobs).await;
    assert!(
        nodes.is_empty(),
        "nothing of a refused registration is kept: {nodes:?}"
    );

    let mut w = coord.workers().await;
    let e = w
        .rendezvous_put(RendezvousPutRequest {
            job_id: "job-000001".into(),
            attempt: 1,
            key: "tcp/addr/0".into(),
            value: vec![0; 50 << 20],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().starts_with("value:"), "{e}");

    let mut s = spec("stress", 1);
    s.spec.as_mut().unwrap().duration_ms = u64::MAX;
    let e = jobs.submit(s).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().starts_with("--duration:"), "{e}");
    let mut s = spec("stress", 1);
    s.spec.as_mut().unwrap().timeout_ms = u64::MAX;
    assert!(jobs
        .submit(s)
        .await
        .unwrap_err()
        .message()
        .starts_with("--timeout:"));
    let mut s = spec("stress", 1);
    let sp = s.spec.as_mut().unwrap();
    for i in 0..10_000 {
        sp.env.insert(format!("V{i}"), "1".into());
    }
    assert!(jobs
        .submit(s)
        .await
        .unwrap_err()
        .message()
        .starts_with("--env:"));
    let jl = jobs
        .list_jobs(ListJobsRequest { limit: 0 })
        .await
        .unwrap()
        .into_inner();
    assert!(jl.jobs.is_empty(), "nothing of a refused spec is stored");

    // Still serving: a good registration goes through, and a node that runs
    // nothing can be removed (and not twice).
    let (_client, resp) = register(&coord.url, "good", host::cpu("good", 1), vec![]).await;
    assert_eq!(resp.name, "good");
    let removed = jobs
        .remove_node(RemoveNodeRequest {
            name: "good".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(removed.name, "good");
    let nodes = list_nodes(&mut jobs).await;
    assert!(nodes.is_empty(), "{nodes:?}");
    let e = jobs
        .remove_node(RemoveNodeRequest {
            name: "good".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert!(e.message().contains("no node `good`"), "{e}");
    coord.shutdown().await;
}

/// Issue 35: a 60 MiB address was stored, the store grew to a gigabyte and
/// `gpuctl nodes` failed for everyone. Every string and list of a
/// registration is bounded, and a whole one past 4 MiB is refused whatever
/// field makes it so; the fleet view keeps answering.
#[tokio::test]
async fn every_registration_field_is_bounded_and_the_fleet_view_keeps_answering() {
    let dir = tempfile::tempdir().unwrap();
    let coord = start(dir.path(), Duration::from_secs(15)).await;
    let mut agents = AgentServiceClient::connect(coord.url.clone())
        .await
        .unwrap()
        .max_encoding_message_size(64 << 20);
    let reg = |f: &dyn Fn(&mut RegisterRequest)| {
        let mut r = host::register_request("probe", host::cpu("probe", 1));
        f(&mut r);
        r
    };
    let big = "x".repeat(1 << 20);
    type Edit = Box<dyn Fn(&mut RegisterRequest)>;
    let cases: Vec<(&str, Edit)> = vec![
        ("facts.addresses:", {
            let b = big.clone();
            Box::new(move |r| r.facts.as_mut().unwrap().addresses = vec![b.clone()])
        }),
        ("facts.ib_devices:", {
            let b = big.clone();
            Box::new(move |r| r.facts.as_mut().unwrap().ib_devices = vec![b.clone()])
        }),
        ("facts.interfaces.name:", {
            let b = big.clone();
            Box::new(move |r| {
                r.facts.as_mut().unwrap().interfaces = vec![NetInterface {
                    name: b.clone(),
                    ..Default::default()
                }]
            })
        }),
        ("facts.torch_version:", {
            let b = big.clone();
            Box::new(move |r| r.facts.as_mut().unwrap().torch_version = b.clone())
        }),
        ("facts.nccl_version:", {
            let b = big.clone();
            Box::new(move |r| r.facts.as_mut().unwrap().nccl_version = b.clone())
        }),
        ("facts.agent_version:", {
            let b = big.clone();
            Box::new(move |r| r.facts.as_mut().unwrap().agent_version = b.clone())
        }),
        ("facts.cuda_driver_version:", {
            let b = big.clone();
            Box::new(move |r| r.facts.as_mut().unwrap().cuda_driver_version = b.clone())
        }),
        ("facts.nvml_status:", {
            let b = big.clone();
            Box::new(move |r| r.facts.as_mut().unwrap().nvml_status = b.clone())
        }),
        // Every field within its own bound, the whole past 4 MiB.
        (
            "register:",
            Box::new(|r| {
                let t = "t".repeat(4096);
                r.preflight = (0..256)
                    .map(|_| PreflightCheck {
                        name: t.clone(),
                        detail: t.clone(),
                        fix: t.clone(),
                        ..Default::default()
                    })
                    .collect();
                r.gpus = (0..64)
                    .map(|_| GpuInfo {
                        uuid: t.clone(),
                        name: t.clone(),
                        pci_bus_id: t.clone(),
                        compute_capability: t.clone(),
                        ..Default::default()
                    })
                    .collect();
            }),
        ),
    ];
    for (field, edit) in &cases {
        let e = agents.register(reg(edit.as_ref())).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{field}: {e}");
        assert!(
            e.message().starts_with(field),
            "{field}: {}",
            &e.message()[..120.min(e.message().len())]
        );
    }
    let mut jobs = coord.jobs().await;
    let t0 = std::time::Instant::now();
    let nodes = list_nodes(&mut jobs).await;
    assert!(nodes.is_empty(), "nothing refused is kept: {nodes:?}");
    assert!(t0.elapsed() < Duration::from_secs(1));
    coord.shutdown().await;
}

/// A fleet has a size: past `--max-nodes` a new name is refused with
/// RESOURCE_EXHAUSTED saying what to do; a known node registers again.
#[tokio::test]
async fn registrations_past_max_nodes_are_refused_and_known_nodes_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = gpuctl_coordinator::Config::for_dir(dir.path());
    cfg.max_nodes = 2;
    let coord = common::start_cfg(cfg).await;
    let (_a, _) = register(&coord.url, "a", host::cpu("a", 1), vec![]).await;
    let (_b, _) = register(&coord.url, "b", host::cpu("b", 1), vec![]).await;
    let mut agents = AgentServiceClient::connect(coord.url.clone())
        .await
        .unwrap();
    let e = agents
        .register(host::register_request("c", host::cpu("c", 1)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
    assert!(
        e.message().contains("2 nodes") && e.message().contains("--max-nodes"),
        "{e}"
    );
    let (_a2, resp) = register(&coord.url, "a", host::cpu("a", 1), vec![]).await;
    assert_eq!(resp.name, "a", "a known node registers again");
    let mut jobs = coord.jobs().await;
    let names: Vec<String> = list_nodes(&mut jobs)
        .await
        .into_iter()
        .map(|n| n.name)
        .collect();
    assert_eq!(names, vec!["a", "b"]);
    coord.shutdown().await;
}

#[tokio::test]
async fn sizes_a_host_cannot_hold_are_refused_at_plan_time_with_the_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let coord = start(dir.path(), Duration::from_secs(15)).await;
    let mut facts = host::cpu("small", 2);
    facts.memory_total_bytes = 23 << 30;
    let _agent = FakeAgent::start(&coord.url, "small", facts, vec![]).await;
    let mut jobs = coord.jobs().await;

    let mut s = spec("nccl", 1);
    s.spec
        .as_mut()
        .unwrap()
        .params
        .insert("max_bytes".into(), "1T".into());
    let e = jobs.submit(s).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    assert!(
        e.message().contains("memory_fit") && e.message().contains("on small"),
        "{e}"
    );
    assert!(
        e.message().contains("6 TiB")
            && e.message().contains("2 ranks")
            && e.message().contains("23 GiB"),
        "the numbers: {e}"
    );
    let mut s = spec("stress", 1);
    s.spec
        .as_mut()
        .unwrap()
        .params
        .insert("size".into(), "65536".into());
    let e = jobs.submit(s).await.unwrap_err();
    assert!(e.message().contains("stress --size"), "{e}");
    let jl = jobs
        .list_jobs(ListJobsRequest { limit: 0 })
        .await
        .unwrap()
        .into_inner();
    assert!(jl.jobs.is_empty(), "nothing of a refused spec is stored");

    // The default sizes fit the same host.
    let job = jobs.submit(spec("nccl", 1)).await.unwrap().into_inner();
    assert!(!job.id.is_empty());
    coord.shutdown().await;
}

/// Issue 47: `--pattern search --nodes all` on two nodes was accepted, ran,
/// and failed both healthy nodes in the fleet history. The count `all`
/// stands for is known at plan time: the request is refused then, naming
/// the flag, and nothing runs or is stored.
#[tokio::test]
async fn a_pattern_the_fleet_is_too_small_for_is_refused_at_submit_with_all_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let coord = start(dir.path(), Duration::from_secs(15)).await;
    let _a = FakeAgent::cpu(&coord.url, "a").await;
    let _b = FakeAgent::cpu(&coord.url, "b").await;
    let mut jobs = coord.jobs().await;
    for pattern in ["search", "bisect"] {
        let mut s = spec("nccl", 0);
        let j = s.spec.as_mut().unwrap();
        j.all_nodes = true;
        j.params.insert("pattern".into(), pattern.into());
        let e = jobs.submit(s).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e}");
        assert!(
            e.message()
                .contains(&format!("--pattern {pattern} needs 3 nodes")),
            "{e}"
        );
    }
    let jl = jobs
        .list_jobs(ListJobsRequest { limit: 0 })
        .await
        .unwrap()
        .into_inner();
    assert!(jl.jobs.is_empty(), "nothing of a refused request is stored");
    // pairs runs on two.
    let mut s = spec("nccl", 0);
    let j = s.spec.as_mut().unwrap();
    j.all_nodes = true;
    j.params.insert("pattern".into(), "pairs".into());
    assert!(!jobs.submit(s).await.unwrap().into_inner().id.is_empty());
    coord.shutdown().await;
}

#[tokio::test]
async fn registrations_past_the_rate_are_refused_naming_it_and_get_in_later() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = gpuctl_coordinator::config::Config::for_dir(dir.path());
    cfg.node_timeout = Duration::from_secs(30);
    cfg.max_registrations_per_s = 10;
    let coord = start_cfg(cfg).await;
    let agents = AgentServiceClient::connect(coord.url.clone())
        .await
        .unwrap();
    let t0 = std::time::Instant::now();
    let calls = (0..40).map(|i| {
        let mut a = agents.clone();
        async move {
            a.register(host::register_request(&format!("n{i}"), host::cpu("x", 1)))
                .await
        }
    });
    let answers = futures::future::join_all(calls).await;
    let elapsed = t0.elapsed().as_secs_f64();
    let (ok, refused): (Vec<_>, Vec<_>) = answers.into_iter().partition(|a| a.is_ok());
    // A burst of 1, then 9 a second.
    let most = 1 + (9.0 * elapsed).ceil() as usize;
    assert!(
        !ok.is_empty() && ok.len() <= most,
        "{} let in within {elapsed:.2} s (at most {most})",
        ok.len()
    );
    let e = refused
        .first()
        .unwrap_or_else(|| panic!("all 40 let in within {elapsed:.2} s: none refused"))
        .as_ref()
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
    assert!(
        e.message().contains("at most 10 registrations a second")
            && e.message().contains("--max-registrations-per-s"),
        "{e}"
    );
    let mut jobs = coord.jobs().await;
    assert_eq!(
        list_nodes(&mut jobs).await.len(),
        ok.len(),
        "a refused registration is not kept"
    );
    // Tried again after a pause, as an agent's backoff does, it gets in.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut a = agents.clone();
    a.register(host::register_request("n39", host::cpu("x", 1)))
        .await
        .expect("a registration after the pause");
}

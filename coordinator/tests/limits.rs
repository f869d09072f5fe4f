//! Bad input at the protocol edge, against a live coordinator over real gRPC:
//! oversized registrations, rendezvous values and specs are refused naming
//! the field, nothing of them is stored, and the coordinator keeps serving;
//! a node that runs no job can be removed.

mod common;

use std::time::Duration;

use common::{cpu_host, list_nodes, register, spec, start};
use gpuctl_proto::pb::agent_service_client::AgentServiceClient;
use gpuctl_proto::pb::*;
use gpuctl_proto::PROTOCOL_VERSION;
use tonic::Code;

#[tokio::test]
async fn oversized_input_is_refused_naming_the_field_and_nothing_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let coord = start(dir.path(), Duration::from_secs(15)).await;
    let mut agents = AgentServiceClient::connect(coord.url.clone())
        .await
        .unwrap();
    let reg = |name: String, gpus: usize| RegisterRequest {
        protocol_version: PROTOCOL_VERSION,
        name,
        facts: Some(cpu_host("x", 1)),
        gpus: vec![GpuInfo::default(); gpus],
        ..Default::default()
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
    let (_client, resp) = register(&coord.url, "good", cpu_host("good", 1), vec![]).await;
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

#[tokio::test]
async fn sizes_a_host_cannot_hold_are_refused_at_plan_time_with_the_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let coord = start(dir.path(), Duration::from_secs(15)).await;
    let mut facts = cpu_host("small", 2);
    facts.memory_total_bytes = 23 << 30;
    let _agent = common::agent(&coord.url, "small", facts, vec![]).await;
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

//! The two fakes against each other over real gRPC: what the fake agent sends
//! is what the fake coordinator hands the test, and the other way round. The
//! agent's and the coordinator's tests lean on both; this pins them alone.

use gpuctl_proto::pb::agent_message::Msg as Up;
use gpuctl_proto::pb::agent_service_client::AgentServiceClient;
use gpuctl_proto::pb::coordinator_message::Msg as Down;
use gpuctl_proto::pb::{
    Assignment, CancelJob, CoordinatorMessage, GpuSample, RegisterRequest, RunningJob,
};
use gpuctl_proto::PROTOCOL_VERSION;
use gpuctl_testkit::coordinator::Replies;
use gpuctl_testkit::{agent, gpu, host, FakeAgent, FakeCoordinator};

#[tokio::test]
async fn the_fake_agent_and_the_fake_coordinator_speak_the_protocol() {
    let mut coord = FakeCoordinator::start_with(Replies {
        coordinator_url: "http://workers:1".into(),
        ..Replies::default()
    })
    .await;
    let mut a = FakeAgent::start(&coord.url, "n0", host::gpu("n0"), gpu::infos("n0", 2)).await;

    let reg = coord.registration().await;
    assert_eq!(
        (reg.name.as_str(), reg.protocol_version, reg.gpus.len()),
        ("n0", PROTOCOL_VERSION, 2)
    );
    assert_eq!(reg.gpus[1].uuid, "GPU-n0-1");
    let mut s = coord.session().await;
    match s.next().await {
        Up::Heartbeat(h) => assert_eq!(h.node, "n0"),
        other => panic!("the first message must be a heartbeat, got {other:?}"),
    }

    // Down: an assignment and a cancel, read as the agent's tests read them.
    let asg = Assignment {
        job_id: "job-1".into(),
        attempt: 1,
        ..Default::default()
    };
    s.send(CoordinatorMessage {
        msg: Some(Down::Assignment(asg.clone())),
    })
    .await;
    assert_eq!(a.assignment().await, asg);
    s.send(CoordinatorMessage {
        msg: Some(Down::Cancel(CancelJob {
            job_id: "job-1".into(),
            ..Default::default()
        })),
    })
    .await;
    assert_eq!(a.cancel().await.job_id, "job-1");

    // Up: the ack and a batch of telemetry, past the heartbeats between them.
    a.ack(&asg).await;
    let ack = s.ack().await;
    assert!(
        ack.ok && ack.job_id == "job-1" && ack.attempt == 1,
        "{ack:?}"
    );
    let hot = GpuSample {
        temperature_c: 90.0,
        ..gpu::healthy(1)
    };
    a.telemetry(gpu::batch(
        "n0",
        "job-1",
        vec![gpu::healthy(0), hot.clone()],
    ))
    .await;
    let batch = s
        .until(|m| match m {
            Up::Telemetry(b) => Some(b.clone()),
            _ => None,
        })
        .await;
    assert_eq!(
        (batch.node.as_str(), batch.job_id.as_str()),
        ("n0", "job-1")
    );
    assert_eq!(batch.samples, vec![gpu::healthy(0), hot]);

    // Heartbeats go on past the one that opened the session.
    s.until(|m| matches!(m, Up::Heartbeat(_)).then_some(()))
        .await;
}

#[tokio::test]
async fn the_fake_coordinator_adopts_refuses_and_can_be_away() {
    let mut coord = FakeCoordinator::start().await;
    coord.refuse(&["job-2"]);
    let running = |job: &str| RunningJob {
        job_id: job.into(),
        attempt: 1,
        ..Default::default()
    };
    let req = RegisterRequest {
        running: vec![running("job-1"), running("job-2")],
        ..host::register_request("n0", host::cpu("n0", 1))
    };
    let (_, resp) = agent::register_with(&coord.url, req.clone()).await;
    assert_eq!(
        (resp.adopted, resp.refused),
        (vec!["job-1".to_string()], vec!["job-2".to_string()])
    );
    assert_eq!(resp.heartbeat_interval_ms, 100);
    assert_eq!(coord.registration().await, req);

    coord.set_away(true);
    let mut client = AgentServiceClient::connect(coord.url.clone())
        .await
        .unwrap();
    let err = client.register(req).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
}

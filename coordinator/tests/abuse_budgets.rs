//! Nodes under test that send the most each bound allows, against a live
//! coordinator over real gRPC (issue 46): 20 registrations of 3.93 MiB,
//! every field within its own bound, made `gpuctl nodes -o json` fail for
//! everyone, and 30 MiB of suite rules grew the store by 500 MB. A node's
//! registration past its budget, or one past the fleet's, is refused,
//! counted and changes nothing; a fleet too big for one answer still lists
//! in full, page by page, through the real CLI; suite rules are capped at
//! the gRPC edge.

mod common;

use std::time::Duration;

use common::{list_nodes, Coord};
use gpuctl_coordinator::config::MetricsListen;
use gpuctl_coordinator::Config;
use gpuctl_core::limits::{MAX_LIST_PAGE, MAX_NODE_BYTES, MAX_RULES_BYTES, MAX_TEXT};
use gpuctl_proto::pb::agent_message::Msg as Up;
use gpuctl_proto::pb::agent_service_client::AgentServiceClient;
use gpuctl_proto::pb::job_service_client::JobServiceClient;
use gpuctl_proto::pb::*;
use gpuctl_proto::PROTOCOL_VERSION;
use gpuctl_testkit::{host, FakeAgent};
use prost::Message;
use tonic::transport::Channel;
use tonic::Code;

const REFUSED: &str = "gpuctl_refused_messages_total{kind=\"registration\"}";

/// A coordinator on `dir` with metrics, for `--max-nodes` `max_nodes`.
async fn coordinator(dir: &std::path::Path, max_nodes: u32) -> Coord {
    let mut cfg = Config::for_dir(dir);
    cfg.max_nodes = max_nodes;
    cfg.metrics_listen = Some(MetricsListen::At("127.0.0.1:0".parse().unwrap()));
    common::start_with_metrics(cfg).await
}

async fn agents(coord: &Coord) -> AgentServiceClient<Channel> {
    AgentServiceClient::connect(coord.url.clone())
        .await
        .unwrap()
        .max_encoding_message_size(64 << 20)
}

async fn refused(coord: &Coord) -> f64 {
    let body = coord.get("/metrics").await.body;
    gpuctl_core::metrics_http::value(&body, REFUSED).unwrap_or(0.0)
}

/// A registration of `name` of about `bytes` encoded, every field within
/// its own bound: checks of 4 KiB texts, then GPUs of 4 KiB names.
fn sized(name: &str, bytes: usize) -> RegisterRequest {
    let mut r = host::register_request(name, host::cpu(name, 1));
    let t = |n: usize| "t".repeat(n.min(MAX_TEXT));
    while r.encoded_len() + 3 * MAX_TEXT < bytes && r.preflight.len() < 255 {
        r.preflight.push(PreflightCheck {
            name: t(MAX_TEXT),
            detail: t(MAX_TEXT),
            fix: t(MAX_TEXT),
            ..Default::default()
        });
    }
    while r.encoded_len() + 4 * MAX_TEXT < bytes && r.gpus.len() < 64 {
        r.gpus.push(GpuInfo {
            uuid: t(MAX_TEXT),
            name: t(MAX_TEXT),
            pci_bus_id: t(MAX_TEXT),
            compute_capability: t(MAX_TEXT),
            ..Default::default()
        });
    }
    let left = bytes.saturating_sub(r.encoded_len() + 24);
    r.preflight.push(PreflightCheck {
        name: t(left),
        detail: t(left.saturating_sub(MAX_TEXT)),
        fix: t(left.saturating_sub(2 * MAX_TEXT)),
        ..Default::default()
    });
    gpuctl_core::limits::register(&r).expect("every field within its own bound");
    r
}

#[tokio::test]
async fn registrations_past_a_nodes_budget_are_refused_counted_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let coord = coordinator(dir.path(), 65_536).await;
    let mut agents = agents(&coord).await;
    let mut jobs = coord.jobs().await;

    // What issue 46 sent, 20 times.
    let fat = sized("fat", 4_120_000);
    assert!(fat.encoded_len() > 4_000_000);
    for i in 0..20 {
        let mut r = fat.clone();
        r.name = format!("fat-{i}");
        let e = agents.register(r).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e}");
        assert!(
            e.message().starts_with("register: ")
                && e.message()
                    .contains(&format!("a node's budget is {MAX_NODE_BYTES}")),
            "{}",
            e.message()
        );
    }
    assert!(list_nodes(&mut jobs).await.is_empty(), "nothing kept");
    assert_eq!(refused(&coord).await, 20.0);

    // Just past the budget is refused; a known node's record stays as it was.
    agents
        .register(host::register_request("n1", host::cpu("n1", 1)))
        .await
        .unwrap();
    let e = agents
        .register(sized("n1", MAX_NODE_BYTES + 2048))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    let nodes = list_nodes(&mut jobs).await;
    assert_eq!(nodes.len(), 1);
    assert!(nodes[0].preflight.is_empty() && nodes[0].gpus.is_empty());
    assert_eq!(refused(&coord).await, 21.0);
    // Within it, the same node registers again.
    agents
        .register(sized("n1", MAX_NODE_BYTES - 4096))
        .await
        .unwrap();

    // A heartbeat's checks past the budget are not kept either.
    let check = |name: &str, detail: usize| PreflightCheck {
        name: name.into(),
        detail: "d".repeat(detail),
        ..Default::default()
    };
    let hb = |checks: Vec<PreflightCheck>| {
        Up::Heartbeat(Heartbeat {
            node: "n1".into(),
            protocol_version: PROTOCOL_VERSION,
            unix_ms: gpuctl_core::now_ms(),
            preflight: checks,
            ..Default::default()
        })
    };
    let beat = FakeAgent::cpu(&coord.url, "n1").await;
    beat.send(hb(vec![check("kept", 10)])).await;
    let listed = |nodes: Vec<Node>| -> Vec<String> {
        nodes[0].preflight.iter().map(|c| c.name.clone()).collect()
    };
    for _ in 0..100 {
        if listed(list_nodes(&mut jobs).await) == ["kept"] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(listed(list_nodes(&mut jobs).await), ["kept"]);
    let big: Vec<PreflightCheck> = (0..20).map(|i| check(&format!("big{i}"), 4096)).collect();
    beat.send(hb(big)).await;
    for _ in 0..100 {
        if refused(&coord).await >= 22.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(refused(&coord).await, 22.0);
    assert_eq!(listed(list_nodes(&mut jobs).await), ["kept"]);
    coord.shutdown().await;
}

#[tokio::test]
async fn registrations_past_the_fleets_budget_are_refused_until_nodes_leave() {
    let dir = tempfile::tempdir().unwrap();
    // 8 nodes' share: 64 KiB for the whole fleet.
    let coord = coordinator(dir.path(), 8).await;
    let mut agents = agents(&coord).await;
    let mut jobs = coord.jobs().await;
    let names = |nodes: Vec<Node>| -> Vec<String> { nodes.into_iter().map(|n| n.name).collect() };

    for n in ["a", "b"] {
        agents.register(sized(n, 30 << 10)).await.unwrap();
    }
    let e = agents.register(sized("c", 30 << 10)).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    assert!(
        e.message().contains("the fleet's budget of 65536")
            && e.message().contains("--max-nodes 8")
            && e.message().contains("gpuctl nodes remove"),
        "{}",
        e.message()
    );
    assert_eq!(names(list_nodes(&mut jobs).await), ["a", "b"]);
    assert_eq!(refused(&coord).await, 1.0);
    // A node registering again counts once.
    agents.register(sized("a", 30 << 10)).await.unwrap();

    jobs.remove_node(RemoveNodeRequest { name: "b".into() })
        .await
        .unwrap();
    agents.register(sized("c", 30 << 10)).await.unwrap();
    assert_eq!(names(list_nodes(&mut jobs).await), ["a", "c"]);
    coord.shutdown().await;
}

/// Every node, page after page, as `gpuctl nodes -o json` asks; (names,
/// pages).
async fn every_page(jobs: &mut JobServiceClient<Channel>) -> (Vec<String>, usize) {
    let (mut names, mut pages, mut after) = (Vec::new(), 0, String::new());
    loop {
        let page = jobs
            .list_nodes(ListNodesRequest {
                brief: false,
                page_bytes: MAX_LIST_PAGE as u32,
                after: after.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.encoded_len() <= MAX_LIST_PAGE + MAX_NODE_BYTES);
        pages += 1;
        names.extend(page.nodes.into_iter().map(|n| n.name));
        if page.next_after.is_empty() {
            return (names, pages);
        }
        after = page.next_after;
    }
}

#[tokio::test]
async fn a_fleet_past_one_answer_lists_in_full_page_by_page_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let coord = coordinator(dir.path(), 65_536).await;
    let mut agents = agents(&coord).await;
    // 1,100 nodes near their budget: 68 MB, past one 64 MiB answer.
    let n = 1_100;
    let one = sized("node-0000", MAX_NODE_BYTES - 2048);
    for i in 0..n {
        let mut r = one.clone();
        r.name = format!("node-{i:04}");
        agents.register(r).await.unwrap();
    }
    let mut jobs = coord
        .jobs()
        .await
        .max_decoding_message_size(gpuctl_core::server::MAX_MESSAGE_BYTES);
    // Unpaged (a gpuctl older than paging): refused saying what to do.
    let e = jobs
        .list_nodes(ListNodesRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    assert!(e.message().contains("page by page"), "{}", e.message());

    let (names, pages) = every_page(&mut jobs).await;
    let want: Vec<String> = (0..n).map(|i| format!("node-{i:04}")).collect();
    assert_eq!(names, want, "every node once, by name");
    assert!(pages > 8, "{pages} pages of at most 8 MiB");

    // The real CLI, table and JSON.
    let url = coord.url.clone();
    tokio::task::spawn_blocking(move || common::fleet_view_answers(&url, n))
        .await
        .unwrap();
    coord.shutdown().await;
}

#[tokio::test]
async fn suite_rules_past_a_rules_files_cap_are_refused_at_the_edge_and_nothing_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let coord = coordinator(dir.path(), 65_536).await;
    let _a = FakeAgent::cpu(&coord.url, "a").await;
    let mut jobs = coord.jobs().await.max_encoding_message_size(64 << 20);
    let suite = |rules: String| SubmitSuiteRequest {
        level: "quick".into(),
        all_nodes: true,
        rules,
        ..Default::default()
    };
    for bytes in [MAX_RULES_BYTES + 1, 30 << 20] {
        let e = jobs
            .submit_suite(suite("#".repeat(bytes)))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e}");
        assert!(
            e.message().starts_with("--rules: ")
                && e.message().contains(&format!("at most {MAX_RULES_BYTES}")),
            "{}",
            &e.message()[..200.min(e.message().len())]
        );
    }
    let e = jobs
        .get_suite(GetSuiteRequest {
            suite_id: "acc-000001".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "no suite was kept: {e}");
    let listed = jobs
        .list_jobs(ListJobsRequest { limit: 0 })
        .await
        .unwrap()
        .into_inner();
    assert!(listed.jobs.is_empty(), "no stage was started");
    // Rules within the cap still go through.
    let ok = jobs
        .submit_suite(suite("[fleet]\nmin_ranks = 3\n".into()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.id, "acc-000001");
    coord.shutdown().await;
}

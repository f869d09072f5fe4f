//! The kept answer against a real redb store: one build serves every page
//! and every caller until a run, an acceptance or the inventory is written;
//! a listing's later pages come from its own build; pages are cut within
//! their bytes.

use gpuctl_core::limits::MAX_LIST_PAGE;
use gpuctl_proto::pb::{Acceptance, FigureRecord, GpuRow, Node, NodeRun, Verdict};

use std::time::Duration;

use super::*;
use crate::store::{Batch, RedbStore};

pub(super) fn store(dir: &std::path::Path) -> StateStore {
    StateStore::new(Arc::new(RedbStore::open(&dir.join("s.redb")).unwrap()))
}

pub(super) fn node(name: &str) -> Node {
    Node {
        name: name.into(),
        ..Default::default()
    }
}

fn run(node: &str, job: u64) -> NodeRun {
    NodeRun {
        node: node.into(),
        job_id: format!("job-{job:06}"),
        finished_unix_ms: 1_700_000_000_000 + job,
        verdict: Verdict::Pass as i32,
        ..Default::default()
    }
}

/// (node, runs, has an acceptance) of each row.
fn rows(b: &Built) -> Vec<(String, u32, bool)> {
    b.rows
        .iter()
        .map(|r| (r.node.clone(), r.runs, r.acceptance.is_some()))
        .collect()
}

fn row(node: &str, runs: u32, accepted: bool) -> (String, u32, bool) {
    (node.to_string(), runs, accepted)
}

/// Every input of the answer, written, shows in the next answer; with no
/// write between, callers get the very same build.
#[tokio::test]
async fn one_build_serves_until_a_run_an_acceptance_or_the_inventory_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let batch = Batch::default().node(&node("a")).node(&node("b"));
    s.write(batch.run(&run("a", 1))).await.unwrap();
    let view = FleetView::new(s.clone(), 0.9);

    let first = view.current().await.unwrap();
    assert_eq!(rows(&first), [row("a", 1, false)]);
    let again = view.current().await.unwrap();
    assert!(
        Arc::ptr_eq(&first, &again),
        "nothing written: the same build"
    );

    // A run (in the writer's second lane, as a job's are), not yet durable.
    drop(s.queue_later(Batch::default().run(&run("b", 2))));
    let b = view.current().await.unwrap();
    assert_eq!(rows(&b), [row("a", 1, false), row("b", 1, false)]);

    let accepted = Acceptance {
        node: "a".into(),
        verdict: Verdict::Pass as i32,
        ..Default::default()
    };
    s.write(Batch::default().acceptance(&accepted))
        .await
        .unwrap();
    let b = view.current().await.unwrap();
    assert_eq!(rows(&b), [row("a", 1, true), row("b", 1, false)]);

    // A node with runs joins the inventory; one leaves it.
    s.write(Batch::default().run(&run("c", 3))).await.unwrap();
    assert_eq!(view.current().await.unwrap().rows.len(), 2, "c not listed");
    s.write(Batch::default().node(&node("c"))).await.unwrap();
    assert!(s.delete_node("b").await.unwrap());
    let b = view.current().await.unwrap();
    assert_eq!(rows(&b), [row("a", 1, true), row("c", 1, false)]);

    // A pruned run.
    assert!(s.delete_run(&run("c", 3)).await.unwrap());
    let b = view.current().await.unwrap();
    assert_eq!(rows(&b), [row("a", 1, true)]);
}

/// A run of `job` on `node` whose figures vary with both: a stress run
/// (GPU TFLOP/s, now and then a floor failure), an all_reduce with a link,
/// a p2p run or a training run, by `job`.
pub(super) fn varied(node: &str, job: u64) -> NodeRun {
    let seed = node.bytes().map(u64::from).sum::<u64>() * 31 + job * 17;
    let gpu = |g: u32, metric: &str, key: &str| FigureRecord {
        metric: metric.into(),
        key: key.into(),
        value: 100.0 + ((seed + u64::from(g) * 13) % 97) as f64,
        gpu_index: Some(g),
        device: g.to_string(),
        gpu_uuid: format!("GPU-{node}-{g}"),
    };
    let own = |metric: &str, key: &str| FigureRecord {
        metric: metric.into(),
        key: key.into(),
        value: 10.0 + (seed % 89) as f64,
        ..Default::default()
    };
    let mut r = run(node, job);
    match job % 4 {
        0 => {
            r.workload = "stress".into();
            r.figures = (0..4)
                .map(|g| gpu(g, "stress_tflops", "bf16 8192"))
                .collect();
            if seed.is_multiple_of(3) {
                r.below_floor = vec![gpu((seed % 4) as u32, "stress_tflops", "bf16 8192")];
                r.verdict = Verdict::Fail as i32;
            }
        }
        1 => {
            r.workload = "nccl".into();
            r.figures = vec![
                own("busbw", "all_reduce 1073741824"),
                own("busbw", "all_gather 1"),
            ];
            r.links = vec![Link {
                a: node.into(),
                b: "zz".into(),
                op: "sendrecv".into(),
                busbw_gbps: 40.0 + (seed % 7) as f64,
                ..Default::default()
            }];
        }
        2 => {
            r.workload = "p2p".into();
            r.figures = ["p2p_gbps", "h2d_gbps", "d2h_gbps"]
                .iter()
                .flat_map(|m| (0..2).map(move |g| (g, *m)))
                .map(|(g, m)| gpu(g, m, ""))
                .collect();
        }
        _ => {
            r.workload = "ddp".into();
            r.figures = vec![own("samples_per_s", "gpt"), own("step_ms_p99", "gpt")];
        }
    }
    r
}

/// The kept answer as rows and links, and as a fresh build makes it.
pub(super) async fn kept_and_fresh(
    view: &FleetView,
    s: &StateStore,
) -> [(Vec<FleetRow>, Vec<Link>); 2] {
    let kept = view.current().await.unwrap();
    let fresh = history::fleet(s, GetFleetRequest::default(), 0.9)
        .await
        .unwrap();
    [
        (kept.rows.to_vec(), kept.links.clone()),
        (fresh.rows, fresh.links),
    ]
}

/// A job's runs, acceptances and a node joining are folded into the kept
/// answer, which stays what a fresh build gives; a run before a node's last
/// and a deleted run make it be built afresh, and it still is.
#[tokio::test]
async fn writes_folded_in_give_what_a_fresh_build_gives() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let names = ["a", "b", "c", "d", "e"];
    let mut batch = Batch::default();
    for name in names {
        batch = batch.node(&node(name));
        for job in 1..=3 {
            batch = batch.run(&varied(name, job));
        }
    }
    // Not in the inventory yet.
    batch = batch.run(&varied("x", 2)).run(&varied("x", 3));
    s.write(batch).await.unwrap();
    let view = FleetView::new(s.clone(), 0.9);
    let [kept, fresh] = kept_and_fresh(&view, &s).await;
    assert_eq!(kept, fresh);
    assert_eq!(view.builds(), 1);

    let mut before = kept.0;
    for job in 4..=13 {
        // Every other job with the answer before still held, as a listing
        // going on from it holds it: its rows are then copied, not moved.
        let held = match job % 2 {
            1 => Some(view.current().await.unwrap()),
            _ => None,
        };
        // As a job's end writes them: in the second lane, not yet durable.
        let mut runs = Batch::default();
        for name in &names[..names.len() - (job as usize % 2)] {
            runs = runs.run(&varied(name, job));
        }
        drop(s.queue_later(runs));
        if job % 5 == 0 {
            let a = Acceptance {
                node: names[job as usize % 5].into(),
                verdict: Verdict::Pass as i32,
                ..Default::default()
            };
            drop(s.queue(Batch::default().acceptance(&a)));
        }
        let [kept, fresh] = kept_and_fresh(&view, &s).await;
        assert_eq!(kept, fresh, "after job {job}");
        if let Some(held) = held {
            assert_eq!(*held.rows, before, "the answer held is as it was");
        }
        before = kept.0;
    }
    let [kept, _] = kept_and_fresh(&view, &s).await;
    let a = kept.0.iter().find(|r| r.node == "a").unwrap();
    assert_eq!(a.runs, 13);
    assert!(!a.drift.is_empty() && !a.gpus.is_empty() && a.samples_per_s > 0.0);
    assert!(a.p2p_gbps_worst > 0.0 && a.all_reduce_busbw_gbps > 0.0);
    assert!(kept
        .0
        .iter()
        .any(|r| r.gpus.iter().any(|g| g.below_floor > 0)));
    assert_eq!(kept.1.len(), 5, "a link each");

    // A node that ran before joins (its runs are read), one re-registers.
    s.write(Batch::default().node(&node("x")).node(&node("a")))
        .await
        .unwrap();
    let [kept, fresh] = kept_and_fresh(&view, &s).await;
    assert_eq!(kept, fresh);
    assert!(kept.0.iter().any(|r| r.node == "x" && r.runs == 2));
    assert_eq!(view.builds(), 1, "every write so far folded in");

    // A run before the node's last (a report made again), then a pruned run.
    s.write(Batch::default().run(&varied("b", 0)))
        .await
        .unwrap();
    let [kept, fresh] = kept_and_fresh(&view, &s).await;
    assert_eq!(kept, fresh);
    assert_eq!(view.builds(), 2);
    assert!(s.delete_run(&varied("c", 2)).await.unwrap());
    let [kept, fresh] = kept_and_fresh(&view, &s).await;
    assert_eq!(kept, fresh);
    assert_eq!(view.builds(), 3);
}

/// The kept answer's version, read as a caller would not: without asking.
pub(super) async fn kept_version(view: &FleetView) -> Option<u64> {
    view.0.kept.lock().await.as_ref().map(|k| k.built.version)
}

/// While an answer is kept, a job's runs are folded into it as they are
/// written, before anyone asks; with none kept, nothing is built unasked.
#[tokio::test]
async fn writes_are_folded_in_as_they_come_while_an_answer_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    s.write(Batch::default().node(&node("a")).run(&run("a", 1)))
        .await
        .unwrap();
    let view = FleetView::new(s.clone(), 0.9);
    let shutdown = gpuctl_core::shutdown::Shutdown::new();
    let task = tokio::spawn(view.clone().keep(shutdown.clone()));
    let caught_up = |want: u64, tries: u32| {
        let view = view.clone();
        async move {
            for _ in 0..tries {
                if kept_version(&view).await == Some(want) {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            false
        }
    };

    drop(s.queue_later(Batch::default().run(&run("a", 2))));
    assert!(!caught_up(s.history_version(), 20).await, "no answer kept");
    assert_eq!(view.builds(), 0);

    assert_eq!(rows(&view.current().await.unwrap()), [row("a", 2, false)]);
    drop(s.queue_later(Batch::default().run(&run("a", 3))));
    assert!(
        caught_up(s.history_version(), 500).await,
        "folded in unasked"
    );
    let kept = view.0.kept.lock().await.as_ref().unwrap().built.clone();
    assert_eq!(rows(&kept), [row("a", 3, false)]);
    assert_eq!(view.builds(), 1, "folded, not built again");
    shutdown.cancel();
    task.await.unwrap();
}

/// Callers that come together wait for one build and share it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_come_together_share_one_build() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let mut batch = Batch::default();
    for i in 0..200 {
        let name = format!("node-{i:03}");
        batch = batch.node(&node(&name)).run(&run(&name, i));
    }
    s.write(batch).await.unwrap();
    let view = FleetView::new(s, 0.9);
    let calls = (0..8).map(|_| {
        let view = view.clone();
        tokio::spawn(async move { view.current().await.unwrap() })
    });
    let builds = futures::future::try_join_all(calls).await.unwrap();
    assert_eq!(builds[0].rows.len(), 200);
    assert!(builds.iter().all(|b| Arc::ptr_eq(b, &builds[0])));
}

/// The rest of a listing comes from the build its first page came from,
/// while that is the one kept; a new listing sees what was written since.
#[tokio::test]
async fn the_pages_of_one_listing_come_from_one_build() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let mut batch = Batch::default();
    for name in ["a", "b", "c"] {
        batch = batch.node(&node(name)).run(&run(name, 1));
    }
    s.write(batch).await.unwrap();
    let view = FleetView::new(s.clone(), 0.9);
    // A byte a page: one row each.
    let ask = |after: &str| GetFleetRequest {
        page_bytes: 1,
        after: after.into(),
        ..Default::default()
    };
    let p1 = view.page(ask("")).await.unwrap();
    assert_eq!(p1.rows[0].node, "a");

    s.write(Batch::default().run(&run("b", 2)).run(&run("c", 2)))
        .await
        .unwrap();
    let p2 = view.page(ask(&p1.next_after)).await.unwrap();
    let p3 = view.page(ask(&p2.next_after)).await.unwrap();
    let runs: Vec<(&str, u32)> = [&p1, &p2, &p3]
        .iter()
        .map(|p| (p.rows[0].node.as_str(), p.rows[0].runs))
        .collect();
    assert_eq!(runs, [("a", 1), ("b", 1), ("c", 1)], "as the listing began");
    assert!(p1.next_after < p2.next_after, "cursors grow as names do");
    assert!(p3.next_after.is_empty());

    let fresh = view.page(ask("")).await.unwrap();
    let next = view.page(ask(&fresh.next_after)).await.unwrap();
    assert_eq!(next.rows[0].node, "b");
    assert_eq!(next.rows[0].runs, 2, "a new listing: the new runs");
    // A cursor written by hand (a name alone) goes on from the current answer.
    let by_hand = view.page(ask("b")).await.unwrap();
    assert_eq!(
        (by_hand.rows[0].node.as_str(), by_hand.rows[0].runs),
        ("c", 2)
    );
}

/// A fleet of 40 rows of ~2 MiB: 80 MiB, past one answer.
fn big_fleet() -> Vec<FleetRow> {
    let row = |i: usize| FleetRow {
        node: format!("node-{i:02}"),
        gpus: vec![GpuRow {
            gpu_uuid: "u".repeat((2 << 20) - 64),
            ..Default::default()
        }],
        ..Default::default()
    };
    (0..40).map(row).collect()
}

#[test]
fn fleet_rows_come_page_by_page_and_whole_answers_past_a_message_are_refused() {
    let rows = big_fleet();
    let (runs, links) = (vec![NodeRun::default()], vec![Link::default()]);
    let whole = GetFleetResponse {
        rows: rows.clone(),
        runs: runs.clone(),
        links: links.clone(),
        ..Default::default()
    }
    .encoded_len();
    let e = cut(&rows, &runs, &links, whole, &Ask::default(), None).unwrap_err();
    assert!(e.to_string().contains("page by page"), "{e}");
    let (mut after, mut names, mut pages) = (String::new(), Vec::new(), 0);
    loop {
        let ask = Ask {
            after: cursor(&after).0.to_string(),
            page_bytes: MAX_LIST_PAGE as u32,
            parts: Parts::default(),
        };
        let p = cut(&rows, &runs, &links, whole, &ask, Some(7)).unwrap();
        assert!(p.rows.iter().all(|r| r.gpus.len() == 1), "whole rows");
        assert!(
            p.encoded_len() <= MAX_LIST_PAGE + 4096,
            "{}",
            p.encoded_len()
        );
        // The runs and links once, with the first page.
        assert_eq!(p.links.len(), usize::from(pages == 0));
        assert_eq!(p.runs.len(), usize::from(pages == 0));
        names.extend(p.rows.into_iter().map(|r| r.node));
        pages += 1;
        if p.next_after.is_empty() {
            break;
        }
        assert!(p.next_after.ends_with(" 7"), "{}", p.next_after);
        after = p.next_after;
    }
    let want: Vec<String> = (0..40).map(|i| format!("node-{i:02}")).collect();
    assert_eq!(names, want);
    assert_eq!(pages, 10, "4 rows of 2 MiB a page");
}

/// Brief pages leave the GPUs out, and are cut by the rows' size without
/// them: the same 80 MiB fleet is then one small page.
#[test]
fn brief_pages_leave_the_gpus_out_and_are_cut_by_what_they_carry() {
    let rows: Vec<FleetRow> = big_fleet()
        .into_iter()
        .map(|r| FleetRow {
            last_verdict: Verdict::Fail as i32,
            last_unix_ms: 5,
            last_job: "job-000009".into(),
            runs: 3,
            stress_tflops_worst: 1.0,
            stress_tflops_median: 2.0,
            all_reduce_busbw_gbps: 3.0,
            median_link_gbps: 4.0,
            samples_per_s: 5.0,
            drift: vec![gpuctl_proto::pb::Drift {
                metric: "stress_tflops".into(),
                ..Default::default()
            }],
            acceptance: Some(Acceptance {
                node: r.node.clone(),
                ..Default::default()
            }),
            p2p_gbps_worst: 6.0,
            h2d_gbps_worst: 7.0,
            d2h_gbps_worst: 8.0,
            ..r
        })
        .collect();
    let ask = Ask {
        page_bytes: MAX_LIST_PAGE as u32,
        parts: Parts {
            brief: true,
            flagged_drift: false,
        },
        ..Default::default()
    };
    let p = cut(&rows, &[], &[], 80 << 20, &ask, Some(7)).unwrap();
    assert_eq!(p.rows.len(), 40);
    assert!(p.next_after.is_empty());
    assert!(p.rows.iter().all(|r| r.gpus.is_empty()));
    assert!(p.encoded_len() < 16384, "{}", p.encoded_len());
    let want: Vec<FleetRow> = rows
        .iter()
        .map(|r| FleetRow {
            gpus: Vec::new(),
            ..r.clone()
        })
        .collect();
    assert_eq!(p.rows, want, "every other field kept");
}

/// Every page of a listing, as (rows, links) of each; `packed` pages read
/// back as the CLI reads them; `flagged_drift` as the CLI's tables ask.
async fn listing(
    view: &FleetView,
    packed: bool,
    flagged_drift: bool,
    page_bytes: u32,
) -> Vec<(Vec<FleetRow>, usize)> {
    let (mut pages, mut after) = (Vec::new(), String::new());
    loop {
        let req = GetFleetRequest {
            page_bytes,
            after: after.clone(),
            brief: true,
            packed,
            flagged_drift,
            ..Default::default()
        };
        let mut p = view.page(req).await.unwrap();
        assert_eq!(p.rows.is_empty(), packed, "rows only packed, or only not");
        let bytes = p.rows_packed.len();
        p.unpack().unwrap();
        if packed {
            assert!(bytes <= page_bytes as usize || p.rows.len() == 1, "{bytes}");
        }
        pages.push((p.rows, p.links.len()));
        if p.next_after.is_empty() {
            return pages;
        }
        after = p.next_after;
    }
}

/// A packed listing carries the rows a brief one carries, without their
/// GPUs, cut into pages within the bytes asked for, the links with the
/// first; asked with flagged drift only, the same rows with only their
/// flagged drift; a write makes the next listing pack the new answer.
#[tokio::test]
async fn packed_pages_carry_what_brief_pages_carry() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let mut batch = Batch::default();
    for i in 0..24 {
        let name = format!("node-{i:02}");
        batch = batch.node(&node(&name));
        for job in 1..=5 {
            batch = batch.run(&varied(&name, job));
        }
    }
    s.write(batch).await.unwrap();
    let view = FleetView::new(s.clone(), 0.9);
    let rows = |l: &[(Vec<FleetRow>, usize)]| -> Vec<FleetRow> {
        l.iter().flat_map(|(r, _)| r.clone()).collect()
    };
    for page_bytes in [1, 700, MAX_LIST_PAGE as u32] {
        let brief = listing(&view, false, false, page_bytes).await;
        let packed = listing(&view, true, false, page_bytes).await;
        assert_eq!(rows(&packed), rows(&brief), "page_bytes {page_bytes}");
        let flagged_only = |rows: Vec<FleetRow>| -> Vec<FleetRow> {
            let keep = |r: FleetRow| FleetRow {
                drift: r.drift.iter().filter(|d| d.flagged).cloned().collect(),
                ..r
            };
            rows.into_iter().map(keep).collect()
        };
        for packed_too in [false, true] {
            let table = rows(&listing(&view, packed_too, true, page_bytes).await);
            assert_eq!(table, flagged_only(rows(&brief)), "page_bytes {page_bytes}");
        }
        assert_eq!(rows(&packed).len(), 24);
        assert!(rows(&packed).iter().all(|r| r.gpus.is_empty()));
        let drift = rows(&packed).into_iter().flat_map(|r| r.drift);
        let flagged: Vec<bool> = drift.map(|d| d.flagged).collect();
        assert!(
            flagged.contains(&true) && flagged.contains(&false),
            "{flagged:?}"
        );
        let links: Vec<usize> = packed.iter().map(|(_, l)| *l).collect();
        assert!(
            links[0] > 0 && links[1..].iter().all(|&l| l == 0),
            "{links:?}"
        );
        match page_bytes {
            1 => assert_eq!(packed.len(), 24, "a row a page"),
            700 => assert!(packed.len() > 1 && packed.len() < 24, "{}", packed.len()),
            _ => assert_eq!(packed.len(), 1),
        }
    }

    s.write(Batch::default().run(&varied("node-03", 6)))
        .await
        .unwrap();
    // Asked for packed before: packed as it is made, before anyone asks.
    let made = view.current().await.unwrap();
    assert_eq!(made.packs(), [true, true], "both packed with the update");
    let after = listing(&view, true, false, MAX_LIST_PAGE as u32).await;
    let row = after[0].0.iter().find(|r| r.node == "node-03").unwrap();
    assert_eq!((row.runs, row.last_job.as_str()), (6, "job-000006"));
}

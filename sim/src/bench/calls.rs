//! The CLI's calls during a run (`nodes`, `jobs`, `status`, `fleet`), made from a
//! thread of their own as a person's CLI would, and their latencies. Apart
//! from the run because they go on beside it, on their own runtime, until
//! the run stops them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use gpuctl_core::client::Channel;
use gpuctl_core::shutdown::Shutdown;
use gpuctl_proto::pb::{
    job_service_client::JobServiceClient, GetFleetRequest, GetJobRequest, ListJobsRequest,
    ListNodesRequest,
};

/// A `fleet` page's rows decoded by the caller (in [`Latencies::calls`]
/// only: part of its `fleet` call).
pub(super) const DECODE: &str = "fleet decode";

/// CLI latencies, by call, for the phase running now.
#[derive(Default)]
pub(super) struct Latencies {
    pub(super) by_call: BTreeMap<String, Vec<f64>>,
    /// Every call of the phase: (when it began, name, ms), for the slowest.
    pub(super) calls: Vec<(Instant, String, f64)>,
    /// The job `status` asks for.
    pub(super) job: String,
}

/// The nearest-rank quantile `p` (0..1), 0 for none.
pub(super) fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    gpuctl_core::stats::quantile_sorted(v, p).unwrap_or(0.0)
}

/// Calls `nodes`, `jobs` and `status` over and over, as people and scripts
/// do during a run, each on the same connection the CLI would open.
async fn cli_load(
    mut c: JobServiceClient<Channel>,
    lat: Arc<Mutex<Latencies>>,
    every: Duration,
    stop: Shutdown,
) {
    loop {
        let t = Instant::now();
        let ok = c
            .list_nodes(ListNodesRequest {
                brief: true,
                ..Default::default()
            })
            .await
            .is_ok();
        record(&lat, "nodes", t, ok);
        let t = Instant::now();
        let ok = c.list_jobs(ListJobsRequest { limit: 50 }).await.is_ok();
        record(&lat, "jobs", t, ok);
        let job = lat.lock().unwrap().job.clone();
        if !job.is_empty() {
            let t = Instant::now();
            let req = GetJobRequest {
                job_id: job,
                max_ranks: gpuctl_proto::VIEW_RANKS,
            };
            let ok = c.get_job(req).await.is_ok();
            record(&lat, "status", t, ok);
        }
        let t = Instant::now();
        let ok = whole_fleet(&mut c, &lat).await.is_ok();
        record(&lat, "fleet", t, ok);
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// `gpuctl fleet`'s calls: every row, page after page, as the CLI asks for
/// its table (drift only where flagged).
async fn whole_fleet(
    c: &mut JobServiceClient<Channel>,
    lat: &Mutex<Latencies>,
) -> Result<usize, tonic::Status> {
    let (mut rows, mut after) = (0, String::new());
    loop {
        let mut page = c
            .get_fleet(GetFleetRequest {
                page_bytes: gpuctl_core::limits::MAX_LIST_PAGE as u32,
                after: after.clone(),
                brief: true,
                packed: true,
                flagged_drift: true,
                ..Default::default()
            })
            .await?
            .into_inner();
        // Decoded as the CLI decodes it: part of what a call costs, and
        // timed apart, to tell this side's CPU from the wait for the answer.
        let t = Instant::now();
        page.unpack()
            .map_err(|e| tonic::Status::internal(format!("a packed fleet page: {e}")))?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        lat.lock().unwrap().calls.push((t, DECODE.into(), ms));
        rows += page.rows.len();
        // A page that does not move on ends the listing, as in the CLI.
        if page.next_after.is_empty() || page.next_after <= after {
            return Ok(rows);
        }
        after = page.next_after;
    }
}

/// Runs [`cli_load`] on a thread and runtime of its own, as the CLI is a
/// process of its own: on the simulator's runtime, busy with 32,768 ranks
/// at a job's end, its calls waited for the simulator and not only for the
/// coordinator. `every`: the pause between rounds, and the thread's nice.
pub(super) fn cli_thread(
    url: String,
    lat: Arc<Mutex<Latencies>>,
    (every, nice): (Duration, i32),
    stop: Shutdown,
) -> Result<()> {
    let (niced_tx, niced_rx) = std::sync::mpsc::channel();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("a runtime for the CLI calls")?;
    std::thread::Builder::new()
        .name("cli-calls".into())
        .spawn(move || {
            let set = crate::priority::set_thread_nice(nice);
            let ok = set.is_ok();
            let _ = niced_tx.send(set);
            if !ok {
                return;
            }
            rt.block_on(async move {
                let builder =
                    gpuctl_core::client::builder(&url).request_timeout(Duration::from_secs(60));
                match builder.connect().await {
                    Ok(ch) => {
                        let c = JobServiceClient::new(ch).max_decoding_message_size(256 << 20);
                        cli_load(c, lat, every, stop).await;
                    }
                    Err(e) => eprintln!("the CLI calls could not connect: {e}"),
                }
            })
        })
        .context("starting the CLI calls' thread")?;
    // A priority asked for and not had would change what is measured.
    niced_rx
        .recv()
        .context("the CLI calls' thread ended before it started")?
        .with_context(|| format!("--cli-nice {nice} (below 0 needs root)"))
}

fn record(lat: &Mutex<Latencies>, call: &str, t: Instant, ok: bool) {
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let key = if ok {
        call.to_string()
    } else {
        format!("{call} (error)")
    };
    let mut l = lat.lock().unwrap();
    l.calls.push((t, key.clone(), ms));
    l.by_call.entry(key).or_default().push(ms);
}

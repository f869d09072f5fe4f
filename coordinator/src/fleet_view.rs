//! `gpuctl fleet`'s whole-fleet answer, kept built. Building it reads every
//! node's runs from the store (64 nodes a read): at 16,384 nodes 0.7 s on a
//! quiet host, 1.3-2.3 s after a short job and 5.4 s after a long one, and
//! `gpuctl fleet` asks page after page. It is made only of the runs, the
//! acceptance states and the inventory's names, all written through the
//! store, which counts such writes ([`StateStore::history_version`]) and,
//! while an answer is kept, keeps them ([`StateStore::history_since`]). So
//! one answer is kept with the count it was made at, and the writes since
//! are folded into it as they come, by the view's own task ([`FleetView::keep`];
//! `writes.rs`: a job's runs are added to each node's [`FleetFold`] digest,
//! and only changed rows are made again), or it is built afresh when they
//! cannot be folded in (a deletion, writes not kept). A caller waits for
//! what it would miss, so an answer never lacks a write that was readable
//! when the call came.
//! `/metrics` shares it. It is derived state only: a restart builds it
//! afresh.
//!
//! A request with `node` or `since` is answered by
//! [`crate::history::fleet`] itself, uncached: its rows are not a filter of
//! the whole answer's (drift is judged over the runs kept by `since`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuctl_core::shutdown::Shutdown;
use gpuctl_proto::pb::{FleetRow, GetFleetRequest, GetFleetResponse, Link, NodeRun};
use prost::Message as _;
use tracing::debug;

use crate::error::CoordinatorError;
use crate::history;
use crate::judge::fleet::{FleetFold, Rebuild};
use crate::store::{Since, StateStore};

mod packed;
mod writes;

/// An answer no one asked for in this long is let go (it is ~8 MB at
/// 16,384 nodes); the next caller builds it again.
pub const IDLE: Duration = Duration::from_secs(600);

/// One build of the whole-fleet answer.
#[derive(Debug)]
pub struct Built {
    /// [`StateStore::history_version`] when the build began: current while
    /// the store still says so.
    pub version: u64,
    /// One per node, by name.
    pub rows: Arc<Vec<FleetRow>>,
    pub links: Vec<Link>,
    /// The whole answer's encoded size, for callers that ask unpaged:
    /// measured when one first asks (measuring 16,384 rows was part of
    /// every update after a job, which callers waited for).
    bytes: std::sync::OnceLock<usize>,
    /// When a page of it last told its caller to ask for more.
    paged: std::sync::Mutex<Option<Instant>>,
    /// Its brief rows encoded, once a packed listing asked for them.
    packed: std::sync::OnceLock<packed::Packed>,
}

/// How long a listing that got a page of a build may go on from that build
/// once a newer one is made.
const LISTING: Duration = Duration::from_secs(60);

impl Built {
    fn bytes(&self) -> usize {
        *self.bytes.get_or_init(|| {
            let rows = self.rows.iter();
            let links = self.links.iter();
            rows.map(|r| prost::encoding::message::encoded_len(1, r))
                .chain(links.map(|l| prost::encoding::message::encoded_len(3, l)))
                .sum()
        })
    }

    /// Its brief rows encoded, encoding them at the first call.
    fn packed(&self) -> &packed::Packed {
        self.packed.get_or_init(|| packed::Packed::of(&self.rows))
    }

    fn paged(&self) {
        *self.paged.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    /// Whether a listing is under way from this build.
    fn listed(&self) -> bool {
        let paged = *self.paged.lock().unwrap_or_else(|e| e.into_inner());
        paged.is_some_and(|t| t.elapsed() < LISTING)
    }
}

/// The kept answer, what it was made from, and when it was last asked for.
struct Kept {
    built: Arc<Built>,
    fold: FleetFold,
    used: Instant,
    /// The build before, while a listing goes on from it.
    previous: Option<Arc<Built>>,
}

struct Inner {
    store: StateStore,
    /// The fleet rule's tolerance (`PerfRules::drift_tolerance`), fixed for
    /// the coordinator's life.
    drift: f64,
    /// Held across a build: callers that come meanwhile wait for it rather
    /// than build again.
    kept: tokio::sync::Mutex<Option<Kept>>,
    /// Answers built afresh from the store, not folded.
    builds: std::sync::atomic::AtomicU64,
}

/// The kept whole-fleet answer; clones share it.
#[derive(Clone)]
pub struct FleetView(Arc<Inner>);

impl FleetView {
    pub fn new(store: StateStore, drift: f64) -> Self {
        FleetView(Arc::new(Inner {
            store,
            drift,
            kept: Default::default(),
            builds: Default::default(),
        }))
    }

    /// How many answers were built afresh from the store rather than
    /// folded from the writes since.
    pub fn builds(&self) -> u64 {
        self.0.builds.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The answer as of now: the kept one while nothing it is made of was
    /// written since, else the kept one with the writes folded in, or a
    /// fresh build.
    pub async fn current(&self) -> Result<Arc<Built>, CoordinatorError> {
        self.get(None).await
    }

    /// As [`FleetView::current`], but the build `listing` (a later page of a
    /// listing whose first page came from it) while it is kept, so that the
    /// pages of one listing agree: the newest, and the one before it for
    /// [`LISTING`] after it handed out a page with more to come. Past that,
    /// or when a fresh build replaced both, the rest of the listing comes
    /// from the newest (every node still once, by name).
    async fn get(&self, listing: Option<u64>) -> Result<Arc<Built>, CoordinatorError> {
        self.made(listing, Some(Instant::now())).await
    }

    /// As [`FleetView::get`]; `asked`: when someone asked for it (`None`:
    /// brought up to date unasked, which does not keep it longer).
    async fn made(
        &self,
        listing: Option<u64>,
        asked: Option<Instant>,
    ) -> Result<Arc<Built>, CoordinatorError> {
        let inner = self.0.clone();
        // In a task of its own: a caller that goes away (a client's
        // deadline) leaves the build to finish for those who wait on it.
        match tokio::spawn(async move { inner.get(listing, asked).await }).await {
            Ok(built) => built,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(CoordinatorError::ShuttingDown),
        }
    }

    /// The page of `gpuctl fleet` asked for by `req`, cut from the kept
    /// answer when `req` asks for the whole fleet.
    pub async fn page(&self, req: GetFleetRequest) -> Result<GetFleetResponse, CoordinatorError> {
        let (after, listing) = cursor(&req.after);
        let ask = Ask {
            after: after.to_string(),
            page_bytes: req.page_bytes,
            brief: req.brief,
        };
        if !req.node.trim().is_empty() || req.since_unix_ms > 0 {
            let r = history::fleet(&self.0.store, req, self.0.drift).await?;
            let bytes = r.encoded_len();
            return cut(&r.rows, &r.runs, &r.links, bytes, &ask, None);
        }
        let b = self.get(listing).await?;
        let page = if req.packed && req.brief && req.page_bytes > 0 {
            if b.packed.get().is_none() {
                // ~15 ms of encoding at 16,384 nodes: off the runtime.
                let built = b.clone();
                crate::runtime::apart(move || async move {
                    built.packed();
                    Ok(())
                })
                .await?;
            }
            packed::cut(&b, b.packed(), &ask.after, ask.page_bytes)
        } else {
            cut(&b.rows, &[], &b.links, b.bytes(), &ask, Some(b.version))?
        };
        if !page.next_after.is_empty() {
            b.paged();
        }
        Ok(page)
    }

    /// Until `shutdown`: while an answer is kept, folds the store's writes
    /// into it as they come, so that a caller after a job's end waits for
    /// what is left of the fold rather than all of it; and lets the answer
    /// go once no one asked for it for [`IDLE`].
    pub async fn keep(self, shutdown: Shutdown) {
        let mut tick = tokio::time::interval(IDLE / 10);
        let mut moves = self.0.store.history_moves();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                moved = moves.changed() => {
                    if moved.is_err() {
                        return;
                    }
                    if self.0.kept.lock().await.is_some() {
                        if let Err(e) = self.made(None, None).await {
                            debug!("the fleet view was not brought up to date: {e}");
                        }
                    }
                }
                // Held: a build is under way, for someone who asked.
                _ = tick.tick() => if let Ok(mut kept) = self.0.kept.try_lock() {
                    if kept.as_ref().is_some_and(|k| k.used.elapsed() >= IDLE) {
                        *kept = None;
                        self.0.store.disarm_history_log();
                    }
                },
            }
        }
    }
}

impl Inner {
    async fn get(
        &self,
        listing: Option<u64>,
        asked: Option<Instant>,
    ) -> Result<Arc<Built>, CoordinatorError> {
        let mut kept = self.kept.lock().await;
        // When it was last asked for, whoever makes it now.
        let used = match (asked, kept.as_ref()) {
            (Some(t), _) => t,
            (None, Some(k)) => k.used,
            (None, None) => Instant::now(),
        };
        if let Some(k) = kept.as_mut() {
            if let Some(p) = k.previous.as_ref().filter(|p| Some(p.version) == listing) {
                return Ok(p.clone());
            }
            if listing == Some(k.built.version) {
                k.used = used;
                return Ok(k.built.clone());
            }
        }
        let since = match kept.as_ref() {
            Some(k) => self.store.history_since(k.built.version),
            None => Since::Unknown,
        };
        let started = Instant::now();
        // Whether the answer was asked for packed: the next is packed as it
        // is made, before callers come (~15 ms at 16,384 rows).
        let mut pack = false;
        let folded = match since {
            Since::Same => {
                let k = kept.as_mut().expect("a version to be the same as");
                k.used = used;
                return Ok(k.built.clone());
            }
            Since::Writes(version, writes) => {
                let Kept {
                    built,
                    fold,
                    previous: older,
                    ..
                } = kept.take().expect("a version to write after");
                // 16,384 rows take ~25 ms to free: not while callers wait.
                let_go(older);
                pack = built.packed.get().is_some();
                // A listing under way goes on from the build it began with.
                // Else let go before the rows are made again: they are then
                // copied only for a caller still holding them.
                let previous = built.listed().then_some(built);
                let n = writes.len();
                match self.fold_in(fold, writes).await? {
                    Ok(fold) => {
                        let fold_ms = started.elapsed().as_millis() as u64;
                        Some((version, fold, previous, Some((n, fold_ms))))
                    }
                    Err(why) => {
                        debug!(why = %why.0, "fleet view built afresh");
                        None
                    }
                }
            }
            Since::Unknown => None,
        };
        // `folded`: the writes folded in and how long that took, else built.
        let (version, mut fold, previous, folded) = match folded {
            Some(folded) => folded,
            None => {
                // Let go before building: never two answers held here.
                *kept = None;
                // Taken before reading: a write meanwhile is folded in
                // next (the store keeps it from here on).
                let version = self.store.arm_history_log();
                self.builds
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let req = GetFleetRequest::default();
                let (fold, _) = history::fold_apart(&self.store, req, self.drift).await?;
                (version, fold, None, None)
            }
        };
        // 16,384 rows made again after a job: ~30 ms of CPU that took a
        // worker of the runtime 80-180 ms on a busy 2-core host.
        let (built, fold) = crate::runtime::apart(move || async move {
            let built = made(version, &mut fold);
            if pack {
                built.packed();
            }
            Ok((built, fold))
        })
        .await?;
        // How long callers waited for it, for a big fleet's operator.
        let ms = started.elapsed().as_millis() as u64;
        match folded {
            Some((writes, fold_ms)) => {
                let asked = asked.is_some();
                debug!(writes, fold_ms, ms, asked, "fleet view updated");
            }
            None => debug!(rows = built.rows.len(), ms, "fleet view built"),
        }
        *kept = Some(Kept {
            built: built.clone(),
            fold,
            used,
            previous,
        });
        Ok(built)
    }

    /// `writes` folded into `fold` on a blocking thread of its own (a
    /// 16,384-node job's runs are ~16 MB to decode); the fold back, or why
    /// it cannot be.
    async fn fold_in(
        &self,
        mut fold: FleetFold,
        writes: Vec<crate::store::HistoryWrite>,
    ) -> Result<Result<FleetFold, Rebuild>, CoordinatorError> {
        let store = self.store.clone();
        crate::runtime::apart(move || async move {
            let done = writes::fold_in(&store, &mut fold, writes).await?;
            Ok(done.map(|()| fold))
        })
        .await
    }
}

/// `built` freed on a blocking thread, when this was its last holder.
fn let_go(built: Option<Arc<Built>>) {
    if let Some(b) = built.and_then(Arc::into_inner) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn_blocking(move || drop(b));
        }
    }
}

/// The answer of `fold` as of `version`.
fn made(version: u64, fold: &mut FleetFold) -> Arc<Built> {
    Arc::new(Built {
        version,
        rows: fold.rows(),
        links: fold.links(),
        bytes: Default::default(),
        paged: Default::default(),
        packed: Default::default(),
    })
}

/// `after` as the coordinator hands it out: the last node's name, then a
/// space and the build the page came from. Names hold no space, and a space
/// sorts before every character a name may hold, so cursors grow as the
/// names do (the CLI stops when one does not). A plain name (a cursor
/// written by hand) is continued from the current answer.
fn cursor(after: &str) -> (&str, Option<u64>) {
    match after.split_once(' ') {
        Some((name, build)) => (name, build.parse().ok()),
        None => (after, None),
    }
}

/// The cursor handed out after a page that ends at the node `next` (empty:
/// the last page), of the kept answer's `build` when it is one.
fn next_cursor(next: String, build: Option<u64>) -> String {
    match build {
        Some(v) if !next.is_empty() => format!("{next} {v}"),
        _ => next,
    }
}

/// What a caller asked of a page: the rows after `after` (a name), within
/// `page_bytes` (0: all at once), `brief` (without their GPUs).
#[derive(Debug, Clone, Default)]
struct Ask {
    after: String,
    page_bytes: u32,
    brief: bool,
}

/// `r` as the page asked for carries it: without its GPUs when brief. Every
/// field is named, so that a field added to the row is decided on here.
fn row_for(r: &FleetRow, brief: bool) -> FleetRow {
    if !brief {
        return r.clone();
    }
    let FleetRow {
        node,
        last_verdict,
        last_unix_ms,
        last_job,
        runs,
        stress_tflops_worst,
        stress_tflops_median,
        all_reduce_busbw_gbps,
        median_link_gbps,
        samples_per_s,
        drift,
        acceptance,
        p2p_gbps_worst,
        h2d_gbps_worst,
        d2h_gbps_worst,
        gpus: _,
    } = r;
    FleetRow {
        node: node.clone(),
        last_verdict: *last_verdict,
        last_unix_ms: *last_unix_ms,
        last_job: last_job.clone(),
        runs: *runs,
        stress_tflops_worst: *stress_tflops_worst,
        stress_tflops_median: *stress_tflops_median,
        all_reduce_busbw_gbps: *all_reduce_busbw_gbps,
        median_link_gbps: *median_link_gbps,
        samples_per_s: *samples_per_s,
        drift: drift.clone(),
        acceptance: acceptance.clone(),
        p2p_gbps_worst: *p2p_gbps_worst,
        h2d_gbps_worst: *h2d_gbps_worst,
        d2h_gbps_worst: *d2h_gbps_worst,
        gpus: Vec::new(),
    }
}

/// The page of `rows` asked for; `runs` and `links` come with the first.
/// Unpaged (an older gpuctl), an answer past one message (`whole_bytes`)
/// is refused saying so. `build`, when the rows are the kept answer, goes
/// into the next cursor.
fn cut(
    rows: &[FleetRow],
    runs: &[NodeRun],
    links: &[Link],
    whole_bytes: usize,
    ask: &Ask,
    build: Option<u64>,
) -> Result<GetFleetResponse, CoordinatorError> {
    let (after, page_bytes, brief) = (ask.after.as_str(), ask.page_bytes, ask.brief);
    if page_bytes == 0 {
        let most = gpuctl_core::server::MAX_MESSAGE_BYTES;
        if whole_bytes > most {
            return Err(CoordinatorError::Refused(format!(
                "the fleet's {} rows take {whole_bytes} bytes, more than one answer holds ({most}): ask page by page (GetFleetRequest.page_bytes, as `gpuctl fleet` of this version does)",
                rows.len()
            )));
        }
        return Ok(GetFleetResponse {
            rows: rows.iter().map(|r| row_for(r, brief)).collect(),
            runs: runs.to_vec(),
            links: links.to_vec(),
            next_after: String::new(),
            rows_packed: Default::default(),
        });
    }
    // A brief row's size counted without its GPUs (the length's own prefix
    // as the whole row's: at most a byte or two over).
    let bytes = |_, row: &FleetRow| {
        let gpus = prost::encoding::message::encoded_len_repeated(16, &row.gpus);
        prost::encoding::message::encoded_len(1, row) - if brief { gpus } else { 0 }
    };
    let (range, next) =
        gpuctl_core::limits::page(rows, |r| r.node.as_str(), bytes, after, page_bytes);
    let first = after.is_empty();
    let next_after = next_cursor(next, build);
    Ok(GetFleetResponse {
        rows: rows[range].iter().map(|r| row_for(r, brief)).collect(),
        runs: if first { runs.to_vec() } else { Vec::new() },
        links: if first { links.to_vec() } else { Vec::new() },
        next_after,
        rows_packed: Default::default(),
    })
}

#[cfg(test)]
mod tests;

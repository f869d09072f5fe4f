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
//! when the call came; one that finds nothing written since takes the kept
//! answer without waiting (a fold may be under way). A big job's runs are
//! folded in before they are written (`ahead.rs`): no caller waits for them.
//! `/metrics` shares it. It is derived state only: a restart builds it
//! afresh.
//!
//! A request with `node` or `since` is answered by
//! [`crate::history::fleet`] itself, uncached: its rows are not a filter of
//! the whole answer's (drift is judged over the runs kept by `since`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuctl_core::shutdown::Shutdown;
use gpuctl_proto::pb::{FleetRow, GetFleetRequest, GetFleetResponse, Link};
use prost::Message as _;
use tracing::debug;

use crate::error::CoordinatorError;
use crate::history;
use crate::judge::fleet::{FleetFold, Rebuild};
use crate::store::{SharedBatch, Since, StateStore};

mod ahead;
mod packed;
mod pages;
mod writes;

use pages::{cursor, cut, next_cursor, row_for, Ask, Parts};

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
    /// Its brief rows encoded, once a packed listing asked for them: with
    /// every figure's drift, and with only flagged drift.
    packed: [std::sync::OnceLock<packed::Packed>; 2],
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

    /// Its brief rows encoded (drift only where flagged when
    /// `flagged_drift`), encoding them at the first call.
    fn packed(&self, flagged_drift: bool) -> &packed::Packed {
        let at = usize::from(flagged_drift);
        self.packed[at].get_or_init(|| packed::Packed::of(&self.rows, flagged_drift))
    }

    /// Which of its packed rows were asked for: the next build packs those
    /// as it is made.
    fn packs(&self) -> Packs {
        self.packed.each_ref().map(|p| p.get().is_some())
    }

    fn paged(&self) {
        *lock(&self.paged) = Some(Instant::now());
    }

    /// Whether a listing is under way from this build.
    fn listed(&self) -> bool {
        let paged = *lock(&self.paged);
        paged.is_some_and(|t| t.elapsed() < LISTING)
    }
}

/// Which packed rows a build holds, by [`Built::packed`]'s `flagged_drift`.
type Packs = [bool; 2];

/// The kept answer and what it was made from.
struct Kept {
    built: Arc<Built>,
    fold: FleetFold,
    /// The build before, while a listing goes on from it.
    previous: Option<Arc<Built>>,
}

struct Inner {
    store: StateStore,
    /// The fleet rule's tolerance (`PerfRules::drift_tolerance`), fixed for
    /// the coordinator's life.
    drift: f64,
    /// Held across a build or a fold: callers that come meanwhile and need
    /// it wait for it rather than build again.
    kept: tokio::sync::Mutex<Option<Kept>>,
    /// `kept`'s answer, read without waiting for `kept`: a caller that finds
    /// nothing written since it was made takes it at once, while a job's
    /// runs are folded in ahead of being written (`ahead.rs`).
    current: std::sync::Mutex<Option<Arc<Built>>>,
    /// When someone last asked for the answer.
    used: std::sync::Mutex<Instant>,
    /// Jobs' runs to fold in ahead, oldest first, and past how many runs
    /// a job's are (`ahead.rs`).
    ahead: std::sync::Mutex<std::collections::VecDeque<(String, SharedBatch)>>,
    ahead_over: usize,
    /// Answers built afresh from the store, not folded.
    builds: std::sync::atomic::AtomicU64,
}

/// The kept whole-fleet answer; clones share it.
#[derive(Clone)]
pub struct FleetView(Arc<Inner>);

impl FleetView {
    pub fn new(store: StateStore, drift: f64) -> Self {
        Self::folding_ahead_over(store, drift, ahead::AHEAD_OVER_RUNS)
    }

    /// As [`FleetView::new`], folding jobs' runs in ahead past `runs` runs
    /// (tests fold small jobs' ahead).
    pub fn folding_ahead_over(store: StateStore, drift: f64, runs: usize) -> Self {
        FleetView(Arc::new(Inner {
            store,
            drift,
            kept: Default::default(),
            current: Default::default(),
            used: std::sync::Mutex::new(Instant::now()),
            ahead: Default::default(),
            ahead_over: runs,
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
        let started = Instant::now();
        let (after, listing) = cursor(&req.after);
        let ask = Ask {
            after: after.to_string(),
            page_bytes: req.page_bytes,
            parts: Parts {
                brief: req.brief,
                flagged_drift: req.flagged_drift,
            },
        };
        if !req.node.trim().is_empty() || req.since_unix_ms > 0 {
            let r = history::fleet(&self.0.store, req, self.0.drift).await?;
            let bytes = r.encoded_len();
            return cut(&r.rows, &r.runs, &r.links, bytes, &ask, None);
        }
        let b = self.get(listing).await?;
        let page = if req.packed && req.brief && req.page_bytes > 0 {
            let flagged = req.flagged_drift;
            if !b.packs()[usize::from(flagged)] {
                // ~15 ms of encoding at 16,384 nodes: off the runtime.
                let built = b.clone();
                crate::runtime::apart(move || async move {
                    built.packed(flagged);
                    Ok(())
                })
                .await?;
            }
            packed::cut(&b, b.packed(flagged), &ask.after, ask.page_bytes)
        } else {
            cut(&b.rows, &[], &b.links, b.bytes(), &ask, Some(b.version))?
        };
        if !page.next_after.is_empty() {
            b.paged();
        }
        // Beside the caller's own time: what of it was this call's, and
        // what was the wait for its connection and the runtime.
        let ms = started.elapsed().as_secs_f64() * 1e3;
        debug!(ms, bytes = page.rows_packed.len(), "fleet page");
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
                    if kept.is_some() && self.0.last_used().elapsed() >= IDLE {
                        self.0.keep(&mut kept, None);
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
        if let Some(t) = asked {
            *lock(&self.used) = t;
        }
        if let Some(b) = self.fresh(listing) {
            return Ok(b);
        }
        let mut kept = self.kept.lock().await;
        if let Some(k) = kept.as_mut() {
            if let Some(p) = k.previous.as_ref().filter(|p| Some(p.version) == listing) {
                return Ok(p.clone());
            }
            if listing == Some(k.built.version) {
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
        let mut pack = Packs::default();
        let folded = match since {
            Since::Same => {
                let k = kept.as_ref().expect("a version to be the same as");
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
                pack = built.packs();
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
        let (version, fold, previous, folded) = match folded {
            Some(folded) => folded,
            None => {
                // Let go before building: never two answers held here.
                self.keep(&mut kept, None);
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
        let (mut built, fold) = self.rows_apart(fold, pack).await?;
        built.version = version;
        let built = Arc::new(built);
        // How long callers waited for it, for a big fleet's operator.
        let ms = started.elapsed().as_millis() as u64;
        match folded {
            Some((writes, fold_ms)) => {
                let asked = asked.is_some();
                debug!(writes, fold_ms, ms, asked, "fleet view updated");
            }
            None => debug!(rows = built.rows.len(), ms, "fleet view built"),
        }
        self.keep(
            &mut kept,
            Some(Kept {
                built: built.clone(),
                fold,
                previous,
            }),
        );
        Ok(built)
    }

    /// The rows of `fold` made again (as of no version yet), packed when
    /// `pack`. 16,384 rows after a job are ~30 ms of CPU that took a worker
    /// of the runtime 80-180 ms on a busy 2-core host: on a thread apart.
    async fn rows_apart(
        &self,
        fold: FleetFold,
        pack: Packs,
    ) -> Result<(Built, FleetFold), CoordinatorError> {
        crate::runtime::apart(move || async move {
            let mut fold = fold;
            let built = made(0, &mut fold);
            for flagged in [false, true].into_iter().filter(|&f| pack[usize::from(f)]) {
                built.packed(flagged);
            }
            Ok((built, fold))
        })
        .await
    }

    /// `k` kept (`None`: none), and its answer handed to callers that need
    /// no fold ([`Inner::fresh`]).
    fn keep(&self, kept: &mut Option<Kept>, k: Option<Kept>) {
        *lock(&self.current) = k.as_ref().map(|k| k.built.clone());
        *kept = k;
    }

    /// The kept answer when it is the one a caller gets without waiting:
    /// nothing it is made of was written since, or the caller's listing
    /// began with it.
    fn fresh(&self, listing: Option<u64>) -> Option<Arc<Built>> {
        let b = lock(&self.current).clone()?;
        let same = match listing {
            Some(v) => v == b.version,
            None => self.store.history_version() == b.version,
        };
        same.then_some(b)
    }

    fn last_used(&self) -> Instant {
        *lock(&self.used)
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

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
fn made(version: u64, fold: &mut FleetFold) -> Built {
    Built {
        version,
        rows: fold.rows(),
        links: fold.links(),
        bytes: Default::default(),
        paged: Default::default(),
        packed: Default::default(),
    }
}

#[cfg(test)]
mod tests;

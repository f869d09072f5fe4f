//! How gRPC handlers reach the scheduler task: a [`SchedulerHandle`] sends
//! an event on its lane and, for a request, awaits the reply.

use std::sync::Arc;

use gpuctl_proto::pb::{Job, ListNodesRequest, ListNodesResponse, Node, NodeTable};
use tokio::sync::{mpsc, oneshot};
use tracing::debug;

use super::background;
use super::events::{Event, Lane, Listing, Query, Reply};
use super::listing;
use crate::error::CoordinatorError;
use gpuctl_core::clock::Clock;

/// People's requests (the CLI's) have a lane of their own that the task
/// serves first: at thousands of nodes the fleet's own stream (heartbeats,
/// progress, telemetry) keeps the other lane full, and `gpuctl jobs` must
/// not wait behind a second of it.
#[derive(Clone)]
pub struct SchedulerHandle {
    pub(super) tx: mpsc::Sender<Event>,
    pub(super) people: mpsc::Sender<Event>,
    /// The scheduler's clock, for handlers that stamp what they store
    /// beside it (a baseline).
    pub(super) clock: Clock,
    /// Where every service counts what a node may not say.
    pub(super) refusals: crate::refusals::Refusals,
    /// `gpuctl nodes`' table, kept beside the scheduler (`listing.rs`).
    pub(super) listing: Arc<listing::NodeListing>,
    /// `gpuctl jobs`' list, kept beside the scheduler (`listing.rs`).
    pub(super) job_listing: Arc<listing::JobListing>,
    /// Big jobs' views people read, kept beside it (`kept_view.rs`).
    pub(super) views: Arc<super::kept_view::KeptViews>,
}

impl SchedulerHandle {
    /// Sends an event that carries a reply and waits for the answer.
    pub async fn ask<T, E: Into<Event>>(
        &self,
        make: impl FnOnce(Reply<T>) -> E,
    ) -> Result<T, CoordinatorError> {
        let (tx, rx) = oneshot::channel();
        self.lane(make(tx).into())
            .await
            .map_err(|_| CoordinatorError::ShuttingDown)?;
        rx.await.map_err(|_| CoordinatorError::ShuttingDown)
    }

    /// Job `job_id`, bounded to `max_ranks` ranks (0: whole), as `GetJob`
    /// answers: a big job's view people read is kept made beside the
    /// scheduler (`kept_view.rs`); any other, or one a job change since
    /// made old, the scheduler answers.
    pub async fn get_job(&self, job_id: String, max_ranks: u32) -> Result<Job, CoordinatorError> {
        if max_ranks > 1 {
            let (now, changes) = (self.clock.now_ms(), self.job_listing.changes());
            if let Some(v) = self.views.current(&job_id, max_ranks, now, changes) {
                return Ok(v);
            }
        }
        self.ask(|reply| Query::GetJob {
            job_id,
            max_ranks,
            reply,
        })
        .await?
    }

    /// The newest `limit` jobs (0: all), oldest first, as `ListJobs`
    /// answers: from the list the scheduler keeps made, unless a job
    /// changed since (then the scheduler answers, after the change).
    pub async fn list_jobs(&self, limit: u32) -> Result<Vec<Job>, CoordinatorError> {
        let now = self.clock.now_ms();
        match self.job_listing.current(now) {
            Some(jobs) => {
                let skip = match limit as usize {
                    0 => 0,
                    n => jobs.len().saturating_sub(n),
                };
                Ok(jobs[skip..].to_vec())
            }
            None => self.ask(|reply| Query::ListJobs { limit, reply }).await,
        }
    }

    /// Every node, each whole or as `gpuctl nodes` shows it (`brief`);
    /// whole nodes a page at a time where `req.page_bytes` asks ([`page`]).
    ///
    /// The caller's worker thread waits for the scheduler and copies whole
    /// nodes out of the runtime's rotation (`block_in_place`), not on the
    /// blocking pool: at a 32,768-rank job's start and end thousands of
    /// fleet calls were queued, and a handler woken from another thread
    /// waited 35-60 ms behind them with its listing already built. A brief
    /// listing's table comes built from the scheduler's task.
    pub async fn list_nodes(
        &self,
        req: ListNodesRequest,
    ) -> Result<ListNodesResponse, CoordinatorError> {
        let kept = req.brief.then(|| self.listing.current(self.clock.now_ms()));
        let listing = match kept.flatten() {
            Some(t) => Listing::Table(t),
            None => self.listing(req.brief).await?,
        };
        match listing {
            Listing::Table(t) => Ok(ListNodesResponse {
                table: Some(NodeTable::clone(&t)),
                ..Default::default()
            }),
            Listing::Nodes(nodes) => background::in_place(move || page(nodes, &req)),
        }
    }

    /// One registered node as [`Self::list_nodes`] lists it (`None`: no such
    /// node), copied alone: a fleet past one answer's bytes has it whatever
    /// page it would fall on.
    pub async fn node(&self, name: &str) -> Result<Option<Node>, CoordinatorError> {
        Ok(match self.listing(false).await? {
            Listing::Nodes(nodes) => nodes
                .into_iter()
                .find(|n| n.name == name)
                .map(Arc::unwrap_or_clone),
            Listing::Table(_) => None,
        })
    }

    async fn listing(&self, brief: bool) -> Result<Listing, CoordinatorError> {
        let (tx, rx) = oneshot::channel();
        self.lane(Query::ListNodes { brief, reply: tx }.into())
            .await
            .map_err(|_| CoordinatorError::ShuttingDown)?;
        background::recv_in_place(rx)
            .await
            .map_err(|_| CoordinatorError::ShuttingDown)
    }

    /// Sends an event that needs no answer.
    pub async fn tell(&self, event: impl Into<Event>) {
        if self.lane(event.into()).await.is_err() {
            debug!("scheduler stopped; event dropped");
        }
    }

    /// The fleet's lane, for a reader that keeps its place in line while
    /// it does other work (an agent's session; see `service::inbox`).
    pub fn fleet_lane(&self) -> tokio_util::sync::PollSender<Event> {
        tokio_util::sync::PollSender::new(self.tx.clone())
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    pub fn refusals(&self) -> &crate::refusals::Refusals {
        &self.refusals
    }

    async fn lane(&self, ev: Event) -> Result<(), mpsc::error::SendError<Event>> {
        match ev.about().lane {
            Lane::People => self.people.send(ev).await,
            Lane::Fleet => self.tx.send(ev).await,
        }
    }
}

/// The page of `nodes` (by name) that `req` asks for, copied out of their
/// `Arc`s: only those nodes are measured and copied. Without `page_bytes`
/// (a gpuctl older than paging) every node, unless they outgrow one answer:
/// that is refused saying so, where the message's limit would have cut the
/// call with a byte count.
fn page(
    mut nodes: Vec<Arc<Node>>,
    req: &ListNodesRequest,
) -> Result<ListNodesResponse, CoordinatorError> {
    let bytes = |n: &Arc<Node>| prost::encoding::message::encoded_len(1, n.as_ref());
    let next_after = if req.page_bytes == 0 {
        let total: usize = nodes.iter().map(bytes).sum();
        let most = gpuctl_core::server::MAX_MESSAGE_BYTES;
        if total > most {
            return Err(CoordinatorError::Refused(format!(
                "the {} nodes take {total} bytes, more than one answer holds ({most}): ask page by page (ListNodesRequest.page_bytes, as `gpuctl nodes -o json` of this version does)",
                nodes.len()
            )));
        }
        String::new()
    } else {
        let (range, next) = gpuctl_core::limits::page(
            &nodes,
            |n| n.name.as_str(),
            |_, n| bytes(n),
            &req.after,
            req.page_bytes,
        );
        nodes.truncate(range.end);
        nodes.drain(..range.start);
        next
    };
    Ok(ListNodesResponse {
        nodes: nodes.into_iter().map(Arc::unwrap_or_clone).collect(),
        table: None,
        next_after,
    })
}

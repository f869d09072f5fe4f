//! How gRPC handlers reach the scheduler task: a [`SchedulerHandle`] sends
//! an event on its lane and, for a request, awaits the reply.

use std::sync::Arc;

use gpuctl_core::pb::ListNodesResponse;
use tokio::sync::{mpsc, oneshot};
use tracing::debug;

use super::background;
use super::events::{Event, Lane, Listing, Query, Reply};
use crate::clock::Clock;
use crate::error::CoordinatorError;

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

    /// Every node, each whole or as `gpuctl nodes` shows it (`brief`).
    ///
    /// The caller's worker thread waits for the scheduler and copies whole
    /// nodes out of the runtime's rotation (`block_in_place`), not on the
    /// blocking pool: at a 32,768-rank job's start and end thousands of
    /// fleet calls were queued, and a handler woken from another thread
    /// waited 35-60 ms behind them with its listing already built. A brief
    /// listing's table comes built from the scheduler's task.
    pub async fn list_nodes(&self, brief: bool) -> Result<ListNodesResponse, CoordinatorError> {
        let (tx, rx) = oneshot::channel();
        self.lane(Query::ListNodes { brief, reply: tx }.into())
            .await
            .map_err(|_| CoordinatorError::ShuttingDown)?;
        let listing = background::recv_in_place(rx)
            .await
            .map_err(|_| CoordinatorError::ShuttingDown)?;
        Ok(match listing {
            Listing::Table(t) => ListNodesResponse {
                table: Some(*t),
                ..Default::default()
            },
            Listing::Nodes(nodes) => background::in_place(move || ListNodesResponse {
                nodes: nodes.into_iter().map(Arc::unwrap_or_clone).collect(),
                table: None,
            }),
        })
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

    async fn lane(&self, ev: Event) -> Result<(), mpsc::error::SendError<Event>> {
        match ev.about().lane {
            Lane::People => self.people.send(ev).await,
            Lane::Fleet => self.tx.send(ev).await,
        }
    }
}

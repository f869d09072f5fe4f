//! `GetTrace`: a profiled rank's Chrome trace, fetched from the agent whose
//! node holds it and handed on to the CLI piece by piece.
//!
//! The coordinator stores no trace (one is ~55 MiB a rank for 20 steps on an
//! H100): it asks the agent for the next piece only once the CLI has taken
//! the last, over the agent's session, so a slow reader holds one piece per
//! fetch and never a node's heartbeats. Pieces pass through compressed as the
//! agent made them. A trace is served only as the job's report names it: the
//! rank's node and the path its worker reported.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuctl_core::limits::MAX_TRACE_PIECE;
use gpuctl_proto::pb::coordinator_message::Msg;
use gpuctl_proto::pb::{CoordinatorMessage, FetchTrace, GetTraceRequest, Report, TraceChunk};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::judge::figures::train_results;
use crate::scheduler::{Query, SchedulerHandle};

/// A piece when the request names no size.
pub const DEFAULT_PIECE: u32 = 1 << 20;
/// The smallest: a bound on how many requests one trace takes.
pub const MIN_PIECE: u32 = 4 << 10;
/// An agent that sends no piece for this long is taken for gone.
const PIECE_WAIT: Duration = Duration::from_secs(30);

/// Requests sent to agents and not yet answered, by request id.
#[derive(Clone, Default)]
pub struct Fetches {
    next: Arc<AtomicU64>,
    waiting: Arc<Mutex<HashMap<u64, Waiting>>>,
}

struct Waiting {
    node: String,
    answer: oneshot::Sender<TraceChunk>,
}

impl Fetches {
    fn ask(&self, node: &str) -> (u64, oneshot::Receiver<TraceChunk>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let (answer, rx) = oneshot::channel();
        let node = node.to_string();
        self.lock().insert(id, Waiting { node, answer });
        (id, rx)
    }

    /// Hands a piece to the fetch that asked `node` for it; a piece from
    /// another node, or for no request, is dropped.
    /// Hands `piece` to the fetch that asked `node` for it. Whether it was
    /// not `node`'s to answer (a fetch asked another node); a piece nobody
    /// waits for any more (the fetch ended) is dropped quietly.
    pub fn answer(&self, node: &str, piece: TraceChunk) -> bool {
        let mut waiting = self.lock();
        match waiting.get(&piece.request_id) {
            Some(w) if w.node == node => {
                if let Some(w) = waiting.remove(&piece.request_id) {
                    let _ = w.answer.send(piece);
                }
                false
            }
            Some(_) => true,
            None => false,
        }
    }

    /// A session ended: its node's fetches fail now, not after the wait.
    pub fn session_closed(&self, node: &str) {
        self.lock().retain(|_, w| w.node != node);
    }

    fn forget(&self, id: u64) {
        self.lock().remove(&id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Waiting>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub type TraceStream = ReceiverStream<Result<TraceChunk, Status>>;

/// Checks the request against the job's report and starts the fetch.
pub async fn get_trace(
    sched: &SchedulerHandle,
    fetches: &Fetches,
    req: GetTraceRequest,
) -> Result<TraceStream, Status> {
    let piece = match req.chunk_bytes {
        0 => DEFAULT_PIECE,
        n if (MIN_PIECE..=MAX_TRACE_PIECE).contains(&n) => n,
        n => {
            return Err(Status::invalid_argument(format!(
                "chunk_bytes: {n}; give 0 (1 MiB) or {MIN_PIECE}..={MAX_TRACE_PIECE}"
            )))
        }
    };
    let job_id = req.job_id.clone();
    let report = sched
        .ask(|reply| Query::GetReport { job_id, reply })
        .await??;
    let (node, path) = locate(&report, req.rank, &req.path)?;
    let session = sched
        .ask(|reply| Query::Session {
            node: node.clone(),
            reply,
        })
        .await?
        .ok_or_else(|| {
            Status::failed_precondition(format!(
                "rank {} on node {node}: the node is not connected; its trace stays there at {path}",
                req.rank
            ))
        })?;
    let (tx, rx) = mpsc::channel(1);
    let fetch = Fetch {
        fetches: fetches.clone(),
        session,
        node,
        job_id: req.job_id,
        rank: req.rank,
        path,
        piece,
    };
    tokio::spawn(fetch.pump(tx));
    Ok(ReceiverStream::new(rx))
}

/// The node that ran `rank` and the trace path it reported: `path` when
/// given (a rank that trained several models has several), else its first.
fn locate(report: &Report, rank: u32, path: &str) -> Result<(String, String), Status> {
    let found = report
        .nodes
        .iter()
        .flat_map(|n| n.ranks.iter().map(move |r| (n, r)))
        .find(|(_, r)| r.rank == rank)
        .ok_or_else(|| {
            Status::not_found(format!("{}: no rank {rank} in its report", report.job_id))
        })?;
    let (node, r) = found;
    let traces: Vec<&str> = r
        .result
        .iter()
        .flat_map(|r| train_results(r))
        .filter_map(|t| t.profile.as_ref())
        .map(|p| p.trace_path.as_str())
        .filter(|p| !p.is_empty())
        .collect();
    let chosen = if path.is_empty() {
        traces.first().copied()
    } else {
        traces.iter().copied().find(|t| *t == path)
    };
    match chosen {
        Some(p) => Ok((node.name.clone(), p.to_string())),
        None if traces.is_empty() => Err(Status::not_found(format!(
            "{} rank {rank}: no trace was written (submit ddp or fsdp with --profile)",
            report.job_id
        ))),
        None => Err(Status::not_found(format!(
            "{} rank {rank}: `{path}` is not one of its traces ({})",
            report.job_id,
            traces.join(", ")
        ))),
    }
}

struct Fetch {
    fetches: Fetches,
    session: crate::scheduler::SessionTx,
    node: String,
    job_id: String,
    rank: u32,
    path: String,
    piece: u32,
}

impl Fetch {
    /// Asks for one piece after another until the last, each only once the
    /// CLI took the one before.
    async fn pump(self, out: mpsc::Sender<Result<TraceChunk, Status>>) {
        let mut offset = 0u64;
        loop {
            let piece = match self.next(offset).await {
                Ok(p) => p,
                Err(status) => {
                    let _ = out.send(Err(status)).await;
                    return;
                }
            };
            offset += piece.raw_bytes as u64;
            let eof = piece.eof;
            if out.send(Ok(piece)).await.is_err() || eof {
                return; // the CLI went away, or the trace is whole
            }
        }
    }

    async fn next(&self, offset: u64) -> Result<TraceChunk, Status> {
        let (id, rx) = self.fetches.ask(&self.node);
        let msg = CoordinatorMessage {
            msg: Some(Msg::FetchTrace(FetchTrace {
                request_id: id,
                job_id: self.job_id.clone(),
                path: self.path.clone(),
                offset,
                max_bytes: self.piece,
            })),
        };
        let whose = format!("rank {} on node {}", self.rank, self.node);
        if self.session.send(Box::new(msg)).is_err() {
            self.fetches.forget(id);
            return Err(Status::unavailable(format!(
                "{whose}: its session ended; its trace stays there at {}",
                self.path
            )));
        }
        let piece = match tokio::time::timeout(PIECE_WAIT, rx).await {
            Ok(Ok(p)) => p,
            Ok(Err(_)) => {
                return Err(Status::unavailable(format!(
                    "{whose}: its session ended during the fetch; its trace stays there at {}",
                    self.path
                )))
            }
            Err(_) => {
                self.fetches.forget(id);
                return Err(Status::deadline_exceeded(format!(
                    "{whose}: the agent sent no piece of {} for {PIECE_WAIT:?}",
                    self.path
                )));
            }
        };
        if !piece.error.is_empty() {
            return Err(Status::failed_precondition(format!(
                "{whose}: {}",
                piece.error
            )));
        }
        if piece.offset != offset
            || piece.raw_bytes > self.piece
            || (piece.raw_bytes == 0 && !piece.eof)
        {
            return Err(Status::data_loss(format!(
                "{whose}: the agent answered {} bytes at offset {} for offset {offset}",
                piece.raw_bytes, piece.offset
            )));
        }
        Ok(piece)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb::rank_result::Detail;
    use gpuctl_proto::pb::{NodeReport, OperatorProfile, RankReport, RankResult, TrainResult};

    fn report() -> Report {
        let train = |path: &str| TrainResult {
            profile: Some(Box::new(OperatorProfile {
                trace_path: path.into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        let rank = |rank: u32, paths: &[&str]| RankReport {
            rank,
            result: Some(Box::new(RankResult {
                detail: paths.first().map(|p| Detail::Train(train(p))),
                more_train: paths.iter().skip(1).map(|p| train(p)).collect(),
                ..Default::default()
            })),
            ..Default::default()
        };
        Report {
            job_id: "job-000007".into(),
            nodes: vec![
                NodeReport {
                    name: "a".into(),
                    ranks: vec![rank(0, &["/w/a0.json"])],
                    ..Default::default()
                },
                NodeReport {
                    name: "b".into(),
                    ranks: vec![rank(1, &["/w/b1.json", "/w/b1-gpt.json"]), rank(2, &[])],
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn a_trace_is_found_only_where_the_report_puts_it() {
        let r = report();
        assert_eq!(
            locate(&r, 0, "").unwrap(),
            ("a".into(), "/w/a0.json".into())
        );
        assert_eq!(
            locate(&r, 1, "").unwrap(),
            ("b".into(), "/w/b1.json".into())
        );
        assert_eq!(
            locate(&r, 1, "/w/b1-gpt.json").unwrap(),
            ("b".into(), "/w/b1-gpt.json".into())
        );
        for (rank, path, why) in [
            (1, "/etc/passwd", "is not one of its traces"),
            (0, "/w/b1.json", "is not one of its traces"),
            (2, "", "no trace was written"),
            (9, "", "no rank 9"),
        ] {
            let e = locate(&r, rank, path).unwrap_err();
            assert!(e.message().contains(why), "{rank} {path}: {}", e.message());
        }
    }

    #[test]
    fn a_piece_reaches_only_the_fetch_that_asked_that_node() {
        let f = Fetches::default();
        let (id, mut rx) = f.ask("a");
        let piece = |id| TraceChunk {
            request_id: id,
            raw_bytes: 3,
            ..Default::default()
        };
        assert!(f.answer("b", piece(id)), "another node's answer is refused");
        assert!(
            rx.try_recv().is_err(),
            "a piece from another node was taken"
        );
        assert!(
            !f.answer("a", piece(id + 1)),
            "one nobody waits for is dropped"
        );
        assert!(rx.try_recv().is_err());
        assert!(!f.answer("a", piece(id)));
        assert_eq!(rx.try_recv().unwrap().raw_bytes, 3);
        let (_, mut gone) = f.ask("a");
        f.session_closed("a");
        assert!(matches!(
            gone.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        ));
    }
}

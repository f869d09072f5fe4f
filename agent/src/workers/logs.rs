//! Worker output: lines read from the pipes, batched into `WorkerLog`
//! messages, with the last stderr lines kept for `WorkerExited`.

use std::collections::VecDeque;

use gpuctl_proto::pb::WorkerLog;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::mpsc;
use tokio::time::{sleep_until, Instant};

use super::{EventSender, LOG_BATCH_LINES, LOG_FLUSH, MAX_LINE_BYTES, STDERR_TAIL_LINES};

/// Reads lines (cut at `MAX_LINE_BYTES`, invalid UTF-8 replaced) until EOF.
pub(super) async fn read_lines<R: AsyncRead + Unpin>(
    r: R,
    is_stderr: bool,
    tx: mpsc::Sender<(bool, String)>,
) {
    let mut r = BufReader::new(r);
    let mut cur: Vec<u8> = Vec::new();
    let mut cut = false;
    loop {
        let buf = match r.fill_buf().await {
            Ok(b) if !b.is_empty() => b,
            _ => break,
        };
        let (take, end) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        let room = MAX_LINE_BYTES.saturating_sub(cur.len());
        // The newline itself does not count against the limit.
        cut |= take - usize::from(end) > room;
        cur.extend_from_slice(&buf[..take.min(room)]);
        r.consume(take);
        if end
            && tx
                .send((is_stderr, finish_line(&mut cur, &mut cut)))
                .await
                .is_err()
        {
            return;
        }
    }
    if !cur.is_empty() {
        let _ = tx.send((is_stderr, finish_line(&mut cur, &mut cut))).await;
    }
}

fn finish_line(cur: &mut Vec<u8>, cut: &mut bool) -> String {
    while matches!(cur.last(), Some(b'\n' | b'\r')) {
        cur.pop();
    }
    let mut s = String::from_utf8_lossy(cur).into_owned();
    if *cut {
        s.push_str(" [line cut by gpuctl-agent]");
    }
    cur.clear();
    *cut = false;
    s
}

/// Groups lines into `WorkerLog` batches (every `LOG_FLUSH` or
/// `LOG_BATCH_LINES`) and returns the last stderr lines once both pipes end.
pub(super) async fn batch_logs(
    mut rx: mpsc::Receiver<(bool, String)>,
    template: WorkerLog,
    events: EventSender,
) -> Vec<String> {
    let mut batch: Vec<String> = Vec::new();
    let mut tail: VecDeque<String> = VecDeque::new();
    let mut dropped = 0usize;
    let mut flush_at: Option<Instant> = None;
    let flush = |batch: &mut Vec<String>, dropped: &mut usize| {
        if !batch.is_empty() {
            let mut log = template.clone();
            log.lines = std::mem::take(batch);
            events.send_log(log, dropped);
        }
    };
    loop {
        let next = match flush_at {
            Some(t) => tokio::select! {
                l = rx.recv() => Some(l),
                _ = sleep_until(t) => None,
            },
            None => Some(rx.recv().await),
        };
        match next {
            None => {
                flush(&mut batch, &mut dropped);
                flush_at = None;
            }
            Some(None) => {
                flush(&mut batch, &mut dropped);
                return tail.into();
            }
            Some(Some((is_stderr, line))) => {
                tracing::debug!(target: "gpuctl_agent::worker_log", job = %template.job_id, rank = template.rank, "{line}");
                if is_stderr {
                    if tail.len() == STDERR_TAIL_LINES {
                        tail.pop_front();
                    }
                    tail.push_back(line.clone());
                }
                batch.push(line);
                if batch.len() >= LOG_BATCH_LINES {
                    flush(&mut batch, &mut dropped);
                    flush_at = None;
                } else if flush_at.is_none() {
                    flush_at = Some(Instant::now() + LOG_FLUSH);
                }
            }
        }
    }
}

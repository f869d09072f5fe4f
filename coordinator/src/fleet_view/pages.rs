//! The pages of `gpuctl fleet`'s answer: cursors that name the build a
//! listing began with, brief rows, and whole answers refused past one
//! message.

use gpuctl_proto::pb::{FleetRow, GetFleetResponse, Link, NodeRun};

use crate::error::CoordinatorError;

/// `after` as the coordinator hands it out: the last node's name, then a
/// space and the build the page came from. Names hold no space, and a space
/// sorts before every character a name may hold, so cursors grow as the
/// names do (the CLI stops when one does not). A plain name (a cursor
/// written by hand) is continued from the current answer.
pub(super) fn cursor(after: &str) -> (&str, Option<u64>) {
    match after.split_once(' ') {
        Some((name, build)) => (name, build.parse().ok()),
        None => (after, None),
    }
}

/// The cursor handed out after a page that ends at the node `next` (empty:
/// the last page), of the kept answer's `build` when it is one.
pub(super) fn next_cursor(next: String, build: Option<u64>) -> String {
    match build {
        Some(v) if !next.is_empty() => format!("{next} {v}"),
        _ => next,
    }
}

/// What a caller asked of a page: the rows after `after` (a name), within
/// `page_bytes` (0: all at once), with which of their parts.
#[derive(Debug, Clone, Default)]
pub(super) struct Ask {
    pub(super) after: String,
    pub(super) page_bytes: u32,
    pub(super) parts: Parts,
}

/// Which of a row's parts a page carries (`GetFleetRequest.brief`,
/// `GetFleetRequest.flagged_drift`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Parts {
    /// Without its GPUs.
    pub(super) brief: bool,
    /// Its drift only where flagged.
    pub(super) flagged_drift: bool,
}

/// `r` as the page asked for carries it: without its GPUs when brief, its
/// drift only where flagged when asked so. Every field is named, so that a
/// field added to the row is decided on here.
pub(super) fn row_for(r: &FleetRow, parts: Parts) -> FleetRow {
    if parts == Parts::default() {
        return r.clone();
    }
    let keep_drift = |d: &Vec<gpuctl_proto::pb::Drift>| match parts.flagged_drift {
        true => d.iter().filter(|d| d.flagged).cloned().collect(),
        false => d.clone(),
    };
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
        gpus,
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
        drift: keep_drift(drift),
        acceptance: acceptance.clone(),
        p2p_gbps_worst: *p2p_gbps_worst,
        h2d_gbps_worst: *h2d_gbps_worst,
        d2h_gbps_worst: *d2h_gbps_worst,
        gpus: if parts.brief {
            Vec::new()
        } else {
            gpus.clone()
        },
    }
}

/// The page of `rows` asked for; `runs` and `links` come with the first.
/// Unpaged (an older gpuctl), an answer past one message (`whole_bytes`)
/// is refused saying so. `build`, when the rows are the kept answer, goes
/// into the next cursor.
pub(super) fn cut(
    rows: &[FleetRow],
    runs: &[NodeRun],
    links: &[Link],
    whole_bytes: usize,
    ask: &Ask,
    build: Option<u64>,
) -> Result<GetFleetResponse, CoordinatorError> {
    let (after, page_bytes, parts) = (ask.after.as_str(), ask.page_bytes, ask.parts);
    if page_bytes == 0 {
        let most = gpuctl_core::server::MAX_MESSAGE_BYTES;
        if whole_bytes > most {
            return Err(CoordinatorError::Refused(format!(
                "the fleet's {} rows take {whole_bytes} bytes, more than one answer holds ({most}): ask page by page (GetFleetRequest.page_bytes, as `gpuctl fleet` of this version does)",
                rows.len()
            )));
        }
        return Ok(GetFleetResponse {
            rows: rows.iter().map(|r| row_for(r, parts)).collect(),
            runs: runs.to_vec(),
            links: links.to_vec(),
            next_after: String::new(),
            rows_packed: Default::default(),
        });
    }
    // A brief row's size counted without its GPUs (the length's own prefix
    // as the whole row's: at most a byte or two over); its drift counted
    // whole, flagged or not (a page a little short of its bound at most).
    let bytes = |_, row: &FleetRow| {
        let gpus = prost::encoding::message::encoded_len_repeated(16, &row.gpus);
        prost::encoding::message::encoded_len(1, row) - if parts.brief { gpus } else { 0 }
    };
    let (range, next) =
        gpuctl_core::limits::page(rows, |r| r.node.as_str(), bytes, after, page_bytes);
    let first = after.is_empty();
    let next_after = next_cursor(next, build);
    Ok(GetFleetResponse {
        rows: rows[range].iter().map(|r| row_for(r, parts)).collect(),
        runs: if first { runs.to_vec() } else { Vec::new() },
        links: if first { links.to_vec() } else { Vec::new() },
        next_after,
        rows_packed: Default::default(),
    })
}

//! The fleet's brief rows encoded once per build (`GetFleetRequest.packed`):
//! each page of a packed listing is a slice of them. Encoding 16,384 rows
//! for every call took ~30 ms of the coordinator's CPU per `gpuctl fleet`
//! (perf, 16,384 simulated nodes after short jobs), most of the call.

use gpuctl_core::limits::MAX_LIST_PAGE;
use gpuctl_proto::pb::{FleetRow, GetFleetResponse};
use prost::bytes::{Bytes, BytesMut};

use super::{row_for, Built};

/// The brief rows, each encoded as `GetFleetResponse.rows` carries it.
#[derive(Debug)]
pub(super) struct Packed {
    bytes: Bytes,
    /// Where each row's record ends in `bytes`.
    ends: Vec<usize>,
}

impl Packed {
    pub(super) fn of(rows: &[FleetRow]) -> Packed {
        let mut buf = BytesMut::new();
        let mut ends = Vec::with_capacity(rows.len());
        for r in rows {
            prost::encoding::message::encode(1, &row_for(r, true), &mut buf);
            ends.push(buf.len());
        }
        Packed {
            bytes: buf.freeze(),
            ends,
        }
    }
}

/// The page of `b` after the node `after`, within `page_bytes`, its rows
/// packed: at least one row, then as many whole rows as fit, as an
/// unpacked page is cut. The links come with the first page.
pub(super) fn cut(b: &Built, p: &Packed, after: &str, page_bytes: u32) -> GetFleetResponse {
    let rows = &b.rows;
    let start = if after.is_empty() {
        0
    } else {
        rows.partition_point(|r| r.node.as_str() <= after)
    };
    let begin = if start == 0 { 0 } else { p.ends[start - 1] };
    let room = (page_bytes as usize).min(MAX_LIST_PAGE);
    let end = if start < rows.len() {
        start + 1 + p.ends[start + 1..].partition_point(|&e| e - begin <= room)
    } else {
        start
    };
    let stop = if end > start { p.ends[end - 1] } else { begin };
    let next_after = if end < rows.len() && end > start {
        format!("{} {}", rows[end - 1].node, b.version)
    } else {
        String::new()
    };
    GetFleetResponse {
        rows: Vec::new(),
        runs: Vec::new(),
        links: if after.is_empty() {
            b.links.clone()
        } else {
            Vec::new()
        },
        next_after,
        rows_packed: p.bytes.slice(begin..stop),
    }
}

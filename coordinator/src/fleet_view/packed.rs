//! The fleet's brief rows encoded once per build (`GetFleetRequest.packed`):
//! each page of a packed listing is a slice of them. Encoding 16,384 rows
//! for every call took ~30 ms of the coordinator's CPU per `gpuctl fleet`
//! (perf, 16,384 simulated nodes after short jobs), most of the call.

use gpuctl_proto::pb::{FleetRow, GetFleetResponse};
use prost::bytes::{Bytes, BytesMut};

use super::pages::Parts;
use super::{next_cursor, row_for, Built};

/// The brief rows, each encoded as `GetFleetResponse.rows` carries it.
#[derive(Debug)]
pub(super) struct Packed {
    bytes: Bytes,
    /// Where each row's record ends in `bytes`.
    ends: Vec<usize>,
}

impl Packed {
    /// `rows` brief, with only their flagged drift when `flagged_drift`.
    pub(super) fn of(rows: &[FleetRow], flagged_drift: bool) -> Packed {
        let parts = Parts {
            brief: true,
            flagged_drift,
        };
        let mut buf = BytesMut::new();
        let mut ends = Vec::with_capacity(rows.len());
        for r in rows {
            prost::encoding::message::encode(1, &row_for(r, parts), &mut buf);
            ends.push(buf.len());
        }
        Packed {
            bytes: buf.freeze(),
            ends,
        }
    }

    /// Where row `i`'s record begins.
    fn start(&self, i: usize) -> usize {
        i.checked_sub(1).map_or(0, |before| self.ends[before])
    }
}

/// The page of `b` after the node `after`, within `page_bytes`, its rows
/// packed: cut by the rule every listing's pages are cut by
/// ([`gpuctl_core::limits::page`]), each row counted at its record's size.
/// The links come with the first page.
pub(super) fn cut(b: &Built, p: &Packed, after: &str, page_bytes: u32) -> GetFleetResponse {
    let size = |i: usize, _: &FleetRow| p.ends[i] - p.start(i);
    let (range, next) =
        gpuctl_core::limits::page(&b.rows, |r| r.node.as_str(), size, after, page_bytes);
    GetFleetResponse {
        rows: Vec::new(),
        runs: Vec::new(),
        links: if after.is_empty() {
            b.links.clone()
        } else {
            Vec::new()
        },
        next_after: next_cursor(next, Some(b.version)),
        rows_packed: p.bytes.slice(p.start(range.start)..p.start(range.end)),
    }
}

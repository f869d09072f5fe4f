//! `nccl`: bus bandwidth per op and size, a job figure read from the job's
//! collective table, since every rank of a collective moves at the slowest
//! one's pace. Only the sweep (`--pattern all`) is judged here; pairs and
//! bisect are judged against each other by `judge::checks::links` and `judge::checks::bisect`.

use std::collections::BTreeMap;

use gpuctl_core::catalogue::{judged_sizes, NcclParams, NcclPattern};
use gpuctl_proto::pb::CollectiveRow;

use super::{Expected, Figure, Metric};

pub fn busbw_key(op: &str, bytes: u64, dtype: &str) -> String {
    format!("{op} {bytes} {dtype}")
}

/// The judged sizes' bus bandwidth of every op and dtype in the table.
pub(super) fn job_figures(collectives: &[CollectiveRow], figures: &mut Vec<Figure>) {
    let mut by_op: BTreeMap<(&str, &str), Vec<&CollectiveRow>> = BTreeMap::new();
    for row in collectives {
        by_op
            .entry((row.op.as_str(), row.dtype.as_str()))
            .or_default()
            .push(row);
    }
    for ((op, dtype), rows) in by_op {
        let sizes: Vec<u64> = rows.iter().map(|r| r.bytes).collect();
        for bytes in judged_sizes(&sizes) {
            if let Some(row) = rows.iter().find(|r| r.bytes == bytes) {
                figures.push(Figure {
                    metric: Metric::Busbw,
                    key: busbw_key(op, bytes, dtype).into(),
                    value: row.busbw_gbps,
                });
            }
        }
    }
}

pub(super) fn expected(n: &NcclParams, out: &mut Expected) {
    if n.pattern != NcclPattern::All {
        return;
    }
    for bytes in judged_sizes(&n.sizes()) {
        for op in &n.ops {
            out.insert((Metric::Busbw, busbw_key(op, bytes, &n.dtype)));
        }
    }
}

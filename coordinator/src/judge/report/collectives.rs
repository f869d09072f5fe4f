//! Collective results across ranks: one table the way nccl-tests prints it
//! (rows grouped by op, size and type; the slowest rank's time; bandwidths
//! recomputed from it; `#wrong` summed), and the ranks whose collectives
//! produced wrong elements fail.

use std::collections::{BTreeMap, HashMap};

use gpuctl_proto::pb::{rank_result::Detail, CollectiveRow, RankResult, Verdict};

use super::ranks::RankStates;

/// nccl-tests' bus bandwidth factor: what each rank must move relative to the
/// buffer size, so numbers compare across rank counts.
pub fn busbw_factor(op: &str, nranks: u32) -> f64 {
    let n = nranks.max(1) as f64;
    match op {
        "all_reduce" => 2.0 * (n - 1.0) / n,
        "all_gather" | "reduce_scatter" | "alltoall" => (n - 1.0) / n,
        _ => 1.0,
    }
}

/// GB/s from bytes and microseconds (1 GB = 1e9 bytes, as nccl-tests prints).
pub fn algbw_gbps(bytes: u64, time_us: f64) -> f64 {
    if time_us > 0.0 {
        bytes as f64 / (time_us * 1e3)
    } else {
        0.0
    }
}

/// Rows across ranks grouped by (op, bytes, dtype) in first-seen order: the
/// slowest rank's time, bandwidths recomputed from it, `#wrong` summed.
pub fn aggregate_collectives<'a>(
    results: impl IntoIterator<Item = &'a RankResult>,
) -> Vec<CollectiveRow> {
    let mut rows: Vec<CollectiveRow> = Vec::new();
    let mut index: HashMap<(String, u64, String), usize> = HashMap::new();
    let mut world = 0u32;
    let mut contributors = 0u32;
    for r in results {
        let Some(Detail::Collectives(c)) = &r.detail else {
            continue;
        };
        world = world.max(c.world_size);
        contributors += 1;
        for row in &c.rows {
            let key = (row.op.clone(), row.bytes, row.dtype.clone());
            match index.get(&key) {
                Some(&i) => {
                    let agg = &mut rows[i];
                    agg.time_us = agg.time_us.max(row.time_us);
                    agg.time_us_ip = agg.time_us_ip.max(row.time_us_ip);
                    agg.wrong += row.wrong;
                    agg.wrong_ip += row.wrong_ip;
                }
                None => {
                    index.insert(key, rows.len());
                    rows.push(row.clone());
                }
            }
        }
    }
    let n = if world > 0 { world } else { contributors };
    for row in &mut rows {
        let f = busbw_factor(&row.op, n);
        row.algbw_gbps = algbw_gbps(row.bytes, row.time_us);
        row.busbw_gbps = row.algbw_gbps * f;
        row.algbw_gbps_ip = algbw_gbps(row.bytes, row.time_us_ip);
        row.busbw_gbps_ip = row.algbw_gbps_ip * f;
    }
    rows
}

/// A collective that produced wrong elements fails its rank even if the
/// worker called it ok.
pub(super) fn fail_wrong_elements(results: &BTreeMap<u32, RankResult>, states: &mut RankStates) {
    for (rank, r) in results {
        if let Some(Detail::Collectives(c)) = &r.detail {
            let bad: Vec<String> = c
                .rows
                .iter()
                .filter(|row| row.wrong + row.wrong_ip > 0)
                .take(3)
                .map(|row| {
                    format!(
                        "{} {} B {}: {} wrong",
                        row.op,
                        row.bytes,
                        row.dtype,
                        row.wrong + row.wrong_ip
                    )
                })
                .collect();
            if !bad.is_empty() {
                if let Some(st) = states.get_mut(rank) {
                    if st.verdict == Verdict::Pass {
                        st.fail(format!("wrong elements in collectives: {}", bad.join(", ")));
                    }
                }
            }
        }
    }
}

/// The transport the collectives ran over, as the first rank to name one says.
pub(super) fn backend(results: &BTreeMap<u32, RankResult>) -> String {
    results
        .values()
        .find_map(|r| match &r.detail {
            Some(Detail::Collectives(c)) if !c.backend.is_empty() => Some(c.backend.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

//! A report cut to what one message can carry (the ranks' timelines were
//! thinned on the way in: [`gpuctl_core::timeline`]).

use std::sync::Arc;

use gpuctl_core::timeline::thin;
use gpuctl_proto::pb::{NodeReport, RankReport, Report, Verdict};
use prost::Message;

/// Whether a report of `bytes` fits one message of `max_bytes`, with
/// headroom for the message framing and the notes added here.
fn fits(bytes: usize, max_bytes: usize) -> bool {
    bytes + 4096 <= max_bytes
}

/// The first step past the bound: a rank's timelines cut to their ends.
fn cut_timelines(rank: &mut RankReport) {
    if let Some(r) = rank.result.as_mut() {
        thin(r, 2);
    }
}

/// After the first step on every rank (`report` was `before` bytes of `n`
/// ranks): says so, and leaves out the results of the ranks that passed
/// if it still does not fit.
fn cut_passed(report: &mut Report, before: usize, n: usize, max_bytes: usize) {
    let passed_too = !fits(report.encoded_len(), max_bytes);
    if passed_too {
        for rank in report.nodes.iter_mut().flat_map(|n| &mut n.ranks) {
            leave_out_if_passed(rank);
        }
    }
    report.notes.push(cut_note(before, n, passed_too));
}

/// The second step: a passed rank's result left out.
fn leave_out_if_passed(rank: &mut RankReport) {
    if rank.verdict() == Verdict::Pass {
        rank.result = None;
    }
}

/// The note a cut report carries.
fn cut_note(before: usize, n: usize, passed_too: bool) -> String {
    let mut note = format!(
        "the report of {n} ranks was too big to send whole ({} MB): per-rank timelines cut to their ends",
        before / 1_000_000
    );
    if passed_too {
        note += "; the results of ranks that passed left out too";
    }
    note
}

/// A report small enough to send in one message of `max_bytes`: past it,
/// the ranks' timelines (phase marks, per-interval series, step times) are
/// left out, then the whole results of the ranks that passed; each step is
/// said in the report's notes. Returns whether anything was left out.
pub fn report_to_send(report: &mut Report, max_bytes: usize) -> bool {
    // Measured once: at 131,072 ranks a walk of the whole report.
    let before = report.encoded_len();
    if fits(before, max_bytes) {
        return false;
    }
    let n = ranks(report);
    report
        .nodes
        .iter_mut()
        .flat_map(|n| &mut n.ranks)
        .for_each(cut_timelines);
    cut_passed(report, before, n, max_bytes);
    true
}

/// [`report_to_send`] of a shared report. Not copied whole and then cut:
/// copied node by node, each rank cut as it is copied, so that a caller of
/// a report too big to send holds only what it sends (at 131,072 ranks the
/// whole report is ~250 MB decoded, and a whole copy per caller was the
/// biggest allocation at a job's end). A report no one else holds is cut in
/// place.
pub fn to_send(report: Arc<Report>, max_bytes: usize) -> Report {
    let report = match Arc::try_unwrap(report) {
        Ok(mut r) => {
            report_to_send(&mut r, max_bytes);
            return r;
        }
        Err(shared) => shared,
    };
    let before = report.encoded_len();
    if fits(before, max_bytes) {
        return Report::clone(&report);
    }
    let mut out = without_nodes(&report);
    out.nodes = report.nodes.iter().map(|n| cut_node(n, false)).collect();
    cut_passed(&mut out, before, ranks(&report), max_bytes);
    out
}

/// How many ranks `report` holds.
fn ranks(report: &Report) -> usize {
    report.nodes.iter().map(|n| n.ranks.len()).sum()
}

/// A copy of `node` with each rank's timelines cut as it is copied, and,
/// with `passed_too`, the results of its passed ranks left out.
fn cut_node(node: &NodeReport, passed_too: bool) -> NodeReport {
    let mut copy = without_ranks(node);
    copy.ranks = node
        .ranks
        .iter()
        .map(|r| {
            let mut r = r.clone();
            cut_timelines(&mut r);
            if passed_too {
                leave_out_if_passed(&mut r);
            }
            r
        })
        .collect();
    copy
}

/// `report` encoded as [`to_send`] would send it, for `GetReportPacked`:
/// a report that fits is encoded from the shared one, never copied (at
/// 131,072 ranks the copy was ~250 MB per caller, the encoding ~28 MB).
pub fn packed(report: Arc<Report>, max_bytes: usize) -> prost::bytes::Bytes {
    let before = report.encoded_len();
    if fits(before, max_bytes) {
        return report.encode_to_vec().into();
    }
    // Cut node by node as it is encoded: the cut copy of a 65,536-rank
    // report was 97 MB at a job's end (heap profile, docs/benchmarks.md).
    let mut head = without_nodes(&report);
    let cut_len: usize = report
        .nodes
        .iter()
        .map(|node| prost::encoding::message::encoded_len(NODES_TAG, &cut_node(node, false)))
        .sum::<usize>()
        + head.encoded_len();
    let passed_too = !fits(cut_len, max_bytes);
    head.notes
        .push(cut_note(before, ranks(&report), passed_too));
    // The first cut's size bounds the second's; neither is sized again.
    let mut out = Vec::with_capacity(cut_len.min(max_bytes) + 4096);
    head.encode_raw(&mut out);
    for node in &report.nodes {
        prost::encoding::message::encode(NODES_TAG, &cut_node(node, passed_too), &mut out);
    }
    out.into()
}

/// `Report.nodes`' field number (`gpuctl.proto`): [`packed`] encodes the
/// nodes one by one after the report's other fields.
const NODES_TAG: u32 = 9;

/// A copy of `node` without its ranks. Every field is named, so that a
/// field added to the message is decided on here.
fn without_ranks(node: &NodeReport) -> NodeReport {
    let NodeReport {
        name,
        verdict,
        reason,
        ranks,
        findings,
    } = node;
    NodeReport {
        name: name.clone(),
        verdict: *verdict,
        reason: reason.clone(),
        ranks: Vec::with_capacity(ranks.len()),
        findings: findings.clone(),
    }
}

/// A copy of `r` without its nodes; every field named, as above.
fn without_nodes(r: &Report) -> Report {
    let Report {
        job_id,
        workload,
        state,
        verdict,
        reason,
        duration_ms,
        started_unix_ms,
        finished_unix_ms,
        nodes: _,
        collectives,
        env,
        sdc_note,
        spec,
        world_size,
        backend,
        nccl_version,
        notes,
        telemetry,
        health,
        preflight,
        findings,
        links,
        bisect,
        hang_timeout_ms,
        telemetry_bytes,
        attempt,
        gpu_pairs,
        loader_gpu,
    } = r;
    Report {
        job_id: job_id.clone(),
        workload: workload.clone(),
        state: *state,
        verdict: *verdict,
        reason: reason.clone(),
        duration_ms: *duration_ms,
        started_unix_ms: *started_unix_ms,
        finished_unix_ms: *finished_unix_ms,
        nodes: Vec::with_capacity(r.nodes.len()),
        collectives: collectives.clone(),
        env: env.clone(),
        sdc_note: sdc_note.clone(),
        spec: spec.clone(),
        world_size: *world_size,
        backend: backend.clone(),
        nccl_version: nccl_version.clone(),
        notes: notes.clone(),
        telemetry: telemetry.clone(),
        health: health.clone(),
        preflight: preflight.clone(),
        findings: findings.clone(),
        links: links.clone(),
        bisect: bisect.clone(),
        hang_timeout_ms: *hang_timeout_ms,
        telemetry_bytes: *telemetry_bytes,
        attempt: *attempt,
        gpu_pairs: gpu_pairs.clone(),
        loader_gpu: loader_gpu.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb::{PhaseMark, RankResult};

    /// 64 ranks with long timelines; rank 7 failed.
    fn big_report() -> Report {
        let rank = |i: u32, v: Verdict| RankReport {
            rank: i,
            verdict: v as i32,
            result: Some(Box::new(RankResult {
                phases: (0..500)
                    .map(|t| PhaseMark {
                        phase: "gemm".into(),
                        unix_ms: t,
                        iterations: t,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })),
            ..Default::default()
        };
        Report {
            job_id: "job-000001".into(),
            notes: vec!["kept".into()],
            nodes: vec![NodeReport {
                name: "node-0".into(),
                ranks: (0..64)
                    .map(|i| rank(i, if i == 7 { Verdict::Fail } else { Verdict::Pass }))
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_report_too_big_to_send_is_cut_and_says_so() {
        let mut r = big_report();
        let whole = r.encoded_len();
        assert!(!report_to_send(&mut r, whole + 8192), "fits: untouched");
        assert!(report_to_send(&mut r, whole / 4));
        assert!(r.encoded_len() + 4096 <= whole / 4);
        assert!(r.notes[1].contains("64 ranks"), "{:?}", r.notes);
        assert!(!report_to_send(&mut r, whole / 4), "once is enough");
        assert!(report_to_send(&mut r, 5_000));
        assert!(r.notes[2].contains("ranks that passed"), "{:?}", r.notes);
        let ranks = &r.nodes[0].ranks;
        assert!(ranks[7].result.is_some(), "a failed rank keeps its result");
        assert!(ranks[0].result.is_none());
    }

    /// Cut from a shared report, rank by rank, a caller gets what the
    /// report cut whole gives, at every bound, and the shared one is left
    /// as it was.
    #[test]
    fn a_shared_report_is_cut_as_a_report_of_ones_own() {
        let shared = Arc::new(big_report());
        let whole = shared.encoded_len();
        for max in [whole + 8192, whole / 4, 5_000] {
            let mut own = big_report();
            report_to_send(&mut own, max);
            let held = shared.clone();
            assert_eq!(to_send(shared.clone(), max), own, "bound {max}");
            assert_eq!(*held, big_report(), "the shared report is untouched");
            // Held by no one else: cut in place, the same.
            assert_eq!(to_send(Arc::new(big_report()), max), own, "bound {max}");
            // Sent encoded: the same cut, and within the bound.
            let bytes = packed(shared.clone(), max);
            assert_eq!(Report::decode(bytes.clone()).unwrap(), own, "bound {max}");
            if max > 5_000 {
                assert!(bytes.len() <= max, "bound {max}: {} bytes", bytes.len());
            }
        }
    }
}

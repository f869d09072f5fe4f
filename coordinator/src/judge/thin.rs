//! A report cut to what one message can carry (the ranks' timelines were
//! thinned on the way in: [`gpuctl_core::timeline`]).

use gpuctl_core::timeline::thin;

/// A report small enough to send in one message of `max_bytes`: past it,
/// the ranks' timelines (phase marks, per-interval series, step times) are
/// left out, then the whole results of the ranks that passed; each step is
/// said in the report's notes. Returns whether anything was left out.
pub fn report_to_send(report: &mut gpuctl_proto::pb::Report, max_bytes: usize) -> bool {
    use gpuctl_proto::pb::Verdict;
    use prost::Message;
    // Headroom for the message framing and the notes added here.
    let fits = |r: &gpuctl_proto::pb::Report| r.encoded_len() + 4096 <= max_bytes;
    if fits(report) {
        return false;
    }
    let before = report.encoded_len();
    let n: usize = report.nodes.iter().map(|n| n.ranks.len()).sum();
    for rank in report.nodes.iter_mut().flat_map(|n| &mut n.ranks) {
        if let Some(r) = rank.result.as_mut() {
            thin(r, 2);
        }
    }
    let mut note = format!(
        "the report of {n} ranks was too big to send whole ({} MB): per-rank timelines cut to their ends",
        before / 1_000_000
    );
    if !fits(report) {
        for rank in report.nodes.iter_mut().flat_map(|n| &mut n.ranks) {
            if rank.verdict() == Verdict::Pass {
                rank.result = None;
            }
        }
        note += "; the results of ranks that passed left out too";
    }
    report.notes.push(note);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb::{PhaseMark, RankResult};

    #[test]
    fn a_report_too_big_to_send_is_cut_and_says_so() {
        use gpuctl_proto::pb::{NodeReport, RankReport, Report, Verdict};
        let rank = |i: u32, v: Verdict| RankReport {
            rank: i,
            verdict: v as i32,
            result: Some(RankResult {
                phases: (0..500)
                    .map(|t| PhaseMark {
                        phase: "gemm".into(),
                        unix_ms: t,
                        iterations: t,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut r = Report {
            nodes: vec![NodeReport {
                ranks: (0..64)
                    .map(|i| rank(i, if i == 7 { Verdict::Fail } else { Verdict::Pass }))
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let whole = prost::Message::encoded_len(&r);
        assert!(!report_to_send(&mut r, whole + 8192), "fits: untouched");
        assert!(report_to_send(&mut r, whole / 4));
        assert!(prost::Message::encoded_len(&r) + 4096 <= whole / 4);
        assert!(r.notes[0].contains("64 ranks"), "{:?}", r.notes);
        assert!(!report_to_send(&mut r, whole / 4), "once is enough");
        assert!(report_to_send(&mut r, 5_000));
        assert!(r.notes[1].contains("ranks that passed"), "{:?}", r.notes);
        let ranks = &r.nodes[0].ranks;
        assert!(ranks[7].result.is_some(), "a failed rank keeps its result");
        assert!(ranks[0].result.is_none());
    }
}

//! Node verdicts: a node fails when any of its ranks or GPUs fails, is
//! incomplete when any rank is, and passes otherwise. Each rank's report
//! carries its verdict, its reasons and its result.

use std::collections::BTreeMap;

use gpuctl_proto::pb::{NodeReport, Plan, RankReport, RankResult, Verdict};

use super::ranks::RankStates;

/// One report per planned node, in plan order. `gpu_faults` are the failures
/// of GPUs that no rank ran on, by node.
pub(super) fn verdicts(
    plan: &Plan,
    states: &RankStates,
    results: &BTreeMap<u32, RankResult>,
    mut gpu_faults: BTreeMap<String, Vec<String>>,
) -> Vec<NodeReport> {
    let mut nodes = Vec::new();
    for name in &plan.nodes {
        let mut ranks = Vec::new();
        for p in plan.ranks.iter().filter(|p| &p.node == name) {
            let st = &states[&p.rank];
            ranks.push(RankReport {
                rank: p.rank,
                local_rank: p.local_rank,
                device: p.device.clone(),
                device_name: p.device_name.clone(),
                gpu_uuid: p.gpu_uuid.clone(),
                verdict: st.verdict as i32,
                reason: st.reasons.join("; "),
                result: results.get(&p.rank).cloned(),
            });
        }
        let failed: Vec<String> = ranks
            .iter()
            .filter(|r| r.verdict() == Verdict::Fail)
            .map(|r| r.rank.to_string())
            .collect();
        let incomplete: Vec<String> = ranks
            .iter()
            .filter(|r| r.verdict() == Verdict::Incomplete)
            .map(|r| r.rank.to_string())
            .collect();
        let faults = gpu_faults.remove(name).unwrap_or_default();
        let (verdict, reason) = if !failed.is_empty() || !faults.is_empty() {
            let mut why = faults;
            if !failed.is_empty() {
                why.insert(0, format!("{} failed", ranks_word(&failed)));
            }
            (Verdict::Fail, why.join("; "))
        } else if !incomplete.is_empty() {
            (
                Verdict::Incomplete,
                format!("{} incomplete", ranks_word(&incomplete)),
            )
        } else {
            (Verdict::Pass, String::new())
        };
        nodes.push(NodeReport {
            name: name.clone(),
            verdict: verdict as i32,
            reason,
            ranks,
            findings: Vec::new(),
        });
    }
    nodes
}

fn ranks_word(ranks: &[String]) -> String {
    if ranks.len() == 1 {
        format!("rank {}", ranks[0])
    } else {
        format!("ranks {}", ranks.join(", "))
    }
}

//! Node verdicts: each node is judged on its own ranks, GPUs and findings. A
//! node fails when any of its ranks, GPUs or findings fails; warns when only
//! warnings were found; is incomplete when a rank has no result for a reason
//! of its own; is not judged when a rank's result did not reach the
//! coordinator; and passes otherwise, also when its workers were stopped only
//! because another node failed the job.

use std::collections::{BTreeMap, HashMap};

use gpuctl_proto::pb::{Finding, NodeReport, Plan, RankReport, RankResult, Verdict};

use super::ranks::{is_unreached, RankStates};

/// One report per planned node, in plan order. `gpu_faults` are the failures
/// of GPUs that no rank ran on, by node; `findings` every finding of the job
/// (those naming a node go to it). Ranks carry their `results` when given.
pub(super) fn verdicts(
    plan: &Plan,
    states: &RankStates,
    results: Option<&BTreeMap<u32, RankResult>>,
    mut gpu_faults: BTreeMap<String, Vec<String>>,
    findings: &[Finding],
) -> Vec<NodeReport> {
    let mut nodes = Vec::new();
    let mut stopped_only: Vec<bool> = Vec::new();
    let by_node = plan.ranks_by_node();
    let mut findings_of: HashMap<&str, Vec<&Finding>> = HashMap::new();
    for f in findings {
        findings_of.entry(f.node.as_str()).or_default().push(f);
    }
    for name in &plan.nodes {
        let mut ranks = Vec::new();
        let mut stopped = true;
        for p in by_node.get(name.as_str()).into_iter().flatten() {
            let st = &states[&p.rank];
            if st.verdict == Verdict::Incomplete && !st.stopped {
                stopped = false;
            }
            ranks.push(RankReport {
                rank: p.rank,
                local_rank: p.local_rank,
                device: p.device_label(),
                device_name: p.device_name.clone(),
                gpu_uuid: p.gpu_uuid.clone(),
                verdict: st.verdict as i32,
                reason: st.reason(),
                result: results.and_then(|r| r.get(&p.rank)).cloned().map(Box::new),
                gpu_index: p.gpu_index,
                ..Default::default()
            });
        }
        let mine: Vec<Finding> = findings_of
            .get(name.as_str())
            .into_iter()
            .flatten()
            .map(|f| (*f).clone())
            .collect();
        let with = |v: Verdict| -> Vec<String> {
            ranks
                .iter()
                .filter(|r| r.verdict() == v)
                .map(|r| r.rank.to_string())
                .collect()
        };
        let (failed, warned, incomplete) = (
            with(Verdict::Fail),
            with(Verdict::Warn),
            with(Verdict::Incomplete),
        );
        let unreached: Vec<String> = ranks
            .iter()
            .filter(|r| is_unreached(r))
            .map(|r| r.rank.to_string())
            .collect();
        let mut faults = gpu_faults.remove(name).unwrap_or_default();
        // Findings of the node itself (a job figure of a one-node job, a
        // preflight check at start); rank findings are in the ranks' verdicts.
        let own = |level: Verdict| -> Vec<String> {
            mine.iter()
                .filter(|f| f.rank.is_none() && f.metric != "health" && f.level() == level)
                .map(|f| f.detail.clone())
                .collect()
        };
        faults.extend(own(Verdict::Fail));
        let warned_health = mine
            .iter()
            .any(|f| f.metric == "health" && f.level() == Verdict::Warn);
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
        } else if !unreached.is_empty() {
            // What it measured never reached us: neither passed nor failed.
            (
                Verdict::Unspecified,
                format!(
                    "not judged: the result of {} did not reach the coordinator",
                    ranks_word(&unreached)
                ),
            )
        } else if !warned.is_empty() || warned_health || !own(Verdict::Warn).is_empty() {
            let mut why = own(Verdict::Warn);
            if !warned.is_empty() {
                why.insert(0, format!("{} warned", ranks_word(&warned)));
            }
            if warned_health {
                why.push("GPU health warnings".into());
            }
            (Verdict::Warn, why.join("; "))
        } else {
            (Verdict::Pass, String::new())
        };
        stopped_only.push(verdict == Verdict::Incomplete && stopped);
        nodes.push(NodeReport {
            name: name.clone(),
            verdict: verdict as i32,
            reason,
            ranks,
            findings: mine,
        });
    }
    let culprits: Vec<String> = nodes
        .iter()
        .filter(|n| n.verdict() == Verdict::Fail)
        .map(|n| n.name.clone())
        .collect();
    if !culprits.is_empty() {
        for (node, stopped) in nodes.iter_mut().zip(stopped_only) {
            if stopped {
                node.verdict = Verdict::Pass as i32;
                node.reason = format!(
                    "nothing failed here; its workers were stopped when the job failed on {}",
                    gpuctl_core::listing::names(&culprits)
                );
            }
        }
    }
    nodes
}

/// Whether `n` is not judged because a result of its own did not reach the
/// coordinator: it could not take part, through no fault of its own.
pub fn unreached(n: &NodeReport) -> bool {
    n.verdict() == Verdict::Unspecified && n.ranks.iter().any(is_unreached)
}

/// In a job that failed for its request no node was measured: every node
/// that its own GPUs or figures did not fail is not judged (unspecified),
/// which leaves it out of the fleet history and of acceptance.
pub(super) fn not_judged(nodes: &mut [NodeReport]) {
    for n in nodes.iter_mut().filter(|n| n.verdict() != Verdict::Fail) {
        n.verdict = Verdict::Unspecified as i32;
        n.reason = "not judged: the job's request could not run".into();
    }
}

fn ranks_word(ranks: &[String]) -> String {
    if ranks.len() == 1 {
        format!("rank {}", ranks[0])
    } else {
        format!("ranks {}", ranks.join(", "))
    }
}

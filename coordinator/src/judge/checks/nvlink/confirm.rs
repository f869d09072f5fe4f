//! A link down against the job's own bandwidth: `nvlink` fails its GPU only
//! where a bandwidth check of the same job failed on its node.

use std::collections::BTreeMap;

use crate::judge::checks::health::rules::HealthRules;
use crate::judge::checks::{Check, Level};

/// Raises `nvlink` findings to the `nvlink_down` level on nodes whose
/// bandwidth failed in this job (a job-wide figure counts for a job of one
/// node); elsewhere they stay at `nvlink_down_unconfirmed`, saying so.
pub fn confirm_nvlink<'a>(
    health: &mut [Check],
    bandwidth: impl Iterator<Item = &'a Check>,
    nodes: &[String],
    rules: &HealthRules,
) {
    let mut slow: BTreeMap<&str, String> = BTreeMap::new();
    for f in bandwidth.filter(|f| {
        f.level == Level::Fail
            && matches!(
                f.metric.as_str(),
                "busbw" | "link_busbw" | "p2p_gbps" | "p2p_pair"
            )
    }) {
        let node = match (f.node.as_str(), nodes) {
            ("", [only]) => only.as_str(),
            (n, _) => n,
        };
        slow.entry(node).or_insert_with(|| f.detail.clone());
    }
    for h in health.iter_mut().filter(|h| h.rule == "nvlink") {
        match (slow.get(h.node.as_str()), rules.nvlink_down.level()) {
            (Some(why), Some(level)) => {
                h.level = level;
                h.detail = format!("{}; confirmed by this job's bandwidth: {why}", h.detail);
            }
            _ => {
                h.detail = format!(
                    "{}; not confirmed by a bandwidth measurement in this job (`gpuctl submit nccl` on the node measures it)",
                    h.detail
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_down_fails_only_where_bandwidth_agrees() {
        let down = || Check {
            node: "n0".into(),
            gpu_index: Some(2),
            level: Level::Warn,
            rule: "nvlink".into(),
            detail: "up to 4 of 18 NVLinks down".into(),
            ..Default::default()
        };
        let slow = Check {
            node: String::new(),
            metric: "busbw".into(),
            level: Level::Fail,
            detail: "all_reduce 1 GiB busbw 120 GB/s".into(),
            ..Default::default()
        };
        let rules = HealthRules::default();
        let mut h = vec![down()];
        confirm_nvlink(&mut h, std::iter::once(&slow), &["n0".into()], &rules);
        assert_eq!(h[0].level, Level::Fail);
        assert!(
            h[0].detail.contains("confirmed by this job's bandwidth"),
            "{}",
            h[0].detail
        );
        // A job-wide figure of several nodes does not say which node is slow.
        let mut h = vec![down()];
        confirm_nvlink(
            &mut h,
            std::iter::once(&slow),
            &["n0".into(), "n1".into()],
            &rules,
        );
        assert_eq!(h[0].level, Level::Warn);
        assert!(h[0].detail.contains("not confirmed"), "{}", h[0].detail);
        let mut h = vec![down()];
        confirm_nvlink(&mut h, std::iter::empty(), &["n0".into()], &rules);
        assert_eq!(h[0].level, Level::Warn);
    }
}

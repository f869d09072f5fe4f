//! Acceptance certificates from the scheduler's side (issue 50): when a
//! suite ends, each node's outcome and identity are handed to a task of
//! their own that reads the stages' reports, signs and stores
//! (`crate::cert::issue`). At load, a node whose acceptance state names a
//! suite newer than its latest certificate (the coordinator stopped between
//! the two) gets that suite's certificate then.

use std::collections::BTreeMap;

use gpuctl_proto::pb::{Suite, Verdict};
use tracing::warn;

use super::Scheduler;
use crate::cert::{self, issue::Outcome, records};

impl Scheduler {
    /// Each node's certificate, issued off the task once the suite's state
    /// is written: signing and reading the stages' reports take time.
    pub(super) fn issue_certs(
        &self,
        suite: Suite,
        outcomes: Vec<(String, Verdict, String, String)>,
    ) {
        let outcomes = outcomes
            .into_iter()
            .map(|(node, verdict, stage, reason)| self.outcome(node, verdict, stage, reason))
            .collect();
        self.spawn_issue(suite, outcomes);
    }

    fn outcome(&self, node: String, verdict: Verdict, stage: String, reason: String) -> Outcome {
        Outcome {
            identity: self
                .nodes
                .get(&node)
                .map(|e| cert::identity::of_node(&e.node)),
            node,
            verdict: verdict.label().to_string(),
            stage,
            reason,
        }
    }

    fn spawn_issue(&self, suite: Suite, outcomes: Vec<Outcome>) {
        let Some(authority) = self.cfg.certs.clone() else {
            return;
        };
        let (store, rules, now) = (
            self.store.clone(),
            self.cfg.perf_rules.clone(),
            self.cfg.clock.now_ms(),
        );
        tokio::spawn(async move {
            // After the suite's own write, so the stages' reports are in.
            let _ = store.flush().wait().await;
            cert::issue::issue_suite(store, authority, rules, suite, outcomes, now).await;
        });
    }

    /// The certificates a stopped coordinator did not get to issue: each
    /// node's acceptance suite newer than its latest certificate.
    pub(super) async fn certify_missing(&self) {
        if self.cfg.certs.is_none() {
            return;
        }
        let acceptances = match self.store.acceptances().await {
            Ok(a) => a,
            Err(e) => {
                warn!("certificates not checked at load: {e}");
                return;
            }
        };
        let summaries = match records::summaries(&self.store).await {
            Ok(s) => s,
            Err(e) => {
                warn!("certificates not checked at load: {e}");
                return;
            }
        };
        let suite_of: BTreeMap<&str, &str> = summaries
            .iter()
            .map(|s| (s.node.as_str(), s.suite.as_str()))
            .collect();
        let mut due: BTreeMap<String, Vec<Outcome>> = BTreeMap::new();
        for a in acceptances {
            let latest = suite_of.get(a.node.as_str());
            if latest.is_some_and(|s| !records::later(&a.suite_id, s)) {
                continue;
            }
            let o = self.outcome(
                a.node.clone(),
                a.verdict(),
                a.stage.clone(),
                a.reason.clone(),
            );
            due.entry(a.suite_id.clone()).or_default().push(o);
        }
        for (id, outcomes) in due {
            if let Some(suite) = self.suites.get(&id) {
                self.spawn_issue(suite.clone(), outcomes);
            }
        }
    }
}

//! Acceptance suites (`gpuctl accept`): a suite's stages run one after the
//! other, each a job on the nodes still in; a node that fails a stage sits
//! out the later ones and the others go on. The suite ends with one verdict
//! per node, kept as that node's acceptance state for `gpuctl fleet`. The
//! suite lives in the store (`suites/…`): a restarted coordinator goes on
//! with it once its running stage's job ends.

use std::collections::BTreeMap;

use gpuctl_core::catalogue::NcclPattern;
use gpuctl_core::suite::Suite as SuiteDef;
use gpuctl_proto::pb::{
    Acceptance, JobSpec, JobState, NodeState, Report, SubmitSuiteRequest, Suite, SuiteNode,
    SuiteStage, Verdict,
};
use tracing::{info, warn};

use super::events::SuiteEvent;
use super::Scheduler;
use crate::error::CoordinatorError;
use crate::plan::planner;
use crate::store::Batch;

use gpuctl_core::suite::PREFLIGHT;

/// The note of a stage whose job failed without naming a node.
const UNNAMED_FAILURE: &str = "failed without naming a node";

/// The note of a stage refused, or failed, for its request (issue 47): no
/// node was measured, and no node's acceptance state changes for it.
const REQUEST_FAILURE: &str = "failed for its request, no node judged";

/// `acc-000001`.
fn suite_id(seq: u64) -> String {
    format!("acc-{seq:06}")
}

/// How bad a verdict is, to keep a node's worst.
fn rank(v: Verdict) -> u8 {
    match v {
        Verdict::Fail => 4,
        Verdict::Incomplete => 3,
        Verdict::Warn => 2,
        Verdict::Pass => 1,
        Verdict::Unspecified => 0,
    }
}

/// A node is out of the suite once a stage failed it (or it could not take
/// part: incomplete).
fn out(n: &SuiteNode) -> bool {
    matches!(n.verdict(), Verdict::Fail | Verdict::Incomplete)
}

/// Marks `node` with `verdict` from `stage`, keeping its first failure.
fn mark(suite: &mut Suite, node: &str, verdict: Verdict, stage: &str, reason: String) {
    let Some(n) = suite.verdicts.iter_mut().find(|n| n.node == node) else {
        return;
    };
    if out(n) || rank(verdict) <= rank(n.verdict()) {
        return;
    }
    n.verdict = verdict as i32;
    if matches!(verdict, Verdict::Fail | Verdict::Incomplete) {
        n.stage = stage.to_string();
        n.reason = reason;
    }
}

/// Adds `line` to the suite's message.
fn add_message(suite: &mut Suite, line: String) {
    suite.message = if suite.message.is_empty() {
        line
    } else {
        format!("{}; {line}", suite.message)
    };
}

/// Each stage's name and job spec (none for a preflight stage).
type StageSpecs = Vec<(String, Option<JobSpec>)>;

/// The definition a request asks for, and the job spec of each stage for
/// `gpu` nodes or CPU ones.
fn definition(
    req: &SubmitSuiteRequest,
    gpu: bool,
) -> Result<(SuiteDef, StageSpecs), CoordinatorError> {
    let def = match req.suite_toml.trim() {
        "" => SuiteDef::builtin(&req.level)?,
        text => SuiteDef::parse(text)?,
    };
    let total = (req.duration_ms > 0).then_some(req.duration_ms);
    let specs = def.job_specs(total, gpu)?;
    Ok((def, specs))
}

impl Scheduler {
    /// A person starts or cancels a suite; a stage's job that ends moves
    /// it on (`stage_ended`, from `reports`).
    pub(super) async fn on_suite(&mut self, ev: SuiteEvent) {
        match ev {
            SuiteEvent::SubmitSuite { req, reply } => {
                let _ = reply.send(self.submit_suite(req).await);
            }
            SuiteEvent::CancelSuite { id, reply } => {
                let _ = reply.send(self.cancel_suite(&id).await);
            }
        }
    }

    /// Starts a suite on the nodes a job with the request's selectors would
    /// run on now; every stage is checked first, so that bad input starts
    /// nothing.
    async fn submit_suite(&mut self, req: SubmitSuiteRequest) -> Result<Suite, CoordinatorError> {
        let probe = JobSpec {
            workload: "stress".into(),
            all_nodes: req.all_nodes,
            node_count: req.node_count,
            selectors: req.selectors.clone(),
            ..Default::default()
        };
        let cands = self.candidates();
        // Enough matching live nodes, busy or not: the first stage waits for them.
        planner::choose(&probe, &cands)?;
        let chosen = planner::likely(&probe, &cands);
        let gpu = !chosen.is_empty() && chosen.iter().all(|n| !n.gpus.is_empty());
        let nodes: Vec<String> = chosen.iter().map(|n| n.name.clone()).collect();
        let (def, specs) = definition(&req, gpu)?;
        let mut stages = Vec::new();
        for ((name, spec), d) in specs.into_iter().zip(&def.stages) {
            let spec = match spec {
                Some(mut s) => {
                    s.rules = req.rules.clone();
                    s.exclusive = req.exclusive;
                    let s = gpuctl_core::spec::normalize(&s).map_err(|e| {
                        CoordinatorError::InvalidField {
                            field: format!("stage {name}: {}", e.field),
                            message: e.message,
                        }
                    })?;
                    Some(s)
                }
                None => None,
            };
            stages.push(SuiteStage {
                name,
                workload: spec
                    .as_ref()
                    .map_or(PREFLIGHT.to_string(), |s| s.workload.clone()),
                duration_ms: spec.as_ref().map_or(0, |s| s.duration_ms),
                state: JobState::Pending as i32,
                min_nodes: d.min_nodes(gpu),
                spec,
                ..Default::default()
            });
        }
        let seq = self.suite_seq + 1;
        let id = suite_id(seq);
        let total = (req.duration_ms > 0).then_some(req.duration_ms);
        let suite = Suite {
            id: id.clone(),
            level: def.name.clone(),
            state: JobState::Running as i32,
            created_unix_ms: self.cfg.clock.now_ms(),
            verdicts: nodes
                .iter()
                .map(|n| SuiteNode {
                    node: n.clone(),
                    verdict: Verdict::Pass as i32,
                    ..Default::default()
                })
                .collect(),
            nodes,
            stages,
            estimate_ms: def.estimate_ms(total),
            request: Some(req),
            ..Default::default()
        };
        self.store
            .write(Batch::default().suite(&suite))
            .await
            .map_err(|e| CoordinatorError::store("could not store the suite", e))?;
        self.suite_seq = seq;
        info!(suite = %id, level = %suite.level, nodes = suite.nodes.len(), "suite submitted");
        self.suites.insert(id.clone(), suite);
        self.advance_suite(&id).await;
        Ok(self.suites[&id].clone())
    }

    pub(super) fn suite(&self, id: &str) -> Result<Suite, CoordinatorError> {
        self.suites
            .get(id)
            .cloned()
            .ok_or_else(|| CoordinatorError::JobNotFound(id.to_string()))
    }

    /// Cancels a suite: its running stage's job is cancelled and no later
    /// stage starts.
    async fn cancel_suite(&mut self, id: &str) -> Result<Suite, CoordinatorError> {
        let suite = self.suite(id)?;
        if JobState::try_from(suite.state).is_ok_and(|s| s.is_terminal()) {
            return Ok(suite);
        }
        if let Some(s) = self.suites.get_mut(id) {
            s.set_state(JobState::Cancelled);
            s.message = "cancelled by user".into();
            s.finished_unix_ms = self.cfg.clock.now_ms();
            let batch = Batch::default().suite(s);
            self.save(batch);
        }
        let job = suite
            .stages
            .get(suite.current as usize)
            .map(|s| s.job_id.clone())
            .unwrap_or_default();
        if !job.is_empty() {
            self.cancel(job, "the acceptance suite was cancelled".into())
                .await?;
        }
        self.suite(id)
    }

    /// Runs stages until one has to wait for its job (or the suite is over).
    pub(super) async fn advance_suite(&mut self, id: &str) {
        loop {
            let Some(suite) = self.suites.get_mut(id) else {
                return;
            };
            if suite.state() != JobState::Running {
                return;
            }
            let i = suite.current as usize;
            if i >= suite.stages.len() {
                self.end_suite(id);
                return;
            }
            let still_in: Vec<String> = suite
                .verdicts
                .iter()
                .filter(|n| !out(n))
                .map(|n| n.node.clone())
                .collect();
            match suite.stages[i].state() {
                JobState::Running => return,
                JobState::Pending => {}
                _ => {
                    suite.current += 1;
                    continue;
                }
            }
            if still_in.is_empty() {
                self.end_suite(id);
                return;
            }
            let stage = &mut suite.stages[i];
            stage.nodes = still_in.clone();
            stage.started_unix_ms = self.cfg.clock.now_ms();
            if (still_in.len() as u32) < stage.min_nodes {
                stage.note = format!(
                    "skipped: it needs {} nodes, {} {} still in",
                    stage.min_nodes,
                    still_in.len(),
                    if still_in.len() == 1 { "is" } else { "are" }
                );
                stage.set_state(JobState::Cancelled);
                stage.finished_unix_ms = self.cfg.clock.now_ms();
                suite.current += 1;
                continue;
            }
            if stage.workload == PREFLIGHT {
                self.preflight_stage(id);
                continue;
            }
            let mut spec = stage.spec.clone().unwrap_or_default();
            if let Some(p) = spec
                .params
                .get("pattern")
                .and_then(|p| NcclPattern::parse(p))
            {
                let runs = p.in_suite(still_in.len() as u32);
                if runs != p {
                    stage.note = format!(
                        "{} nodes still in: --pattern {} measured them instead of {}",
                        still_in.len(),
                        runs.name(),
                        p.name()
                    );
                    spec.params.insert("pattern".into(), runs.name().into());
                }
            }
            spec.all_nodes = true;
            spec.node_count = 0;
            spec.only_nodes = still_in;
            spec.name = format!("{id} {}", stage.name);
            let name = stage.name.clone();
            match self.submit(spec).await {
                Ok(job) => {
                    let suite = self.suites.get_mut(id).expect("the suite is there");
                    let stage = &mut suite.stages[i];
                    stage.job_id = job.id.clone();
                    stage.set_state(JobState::Running);
                    self.jobs_of_suites.insert(job.id.clone(), id.to_string());
                    info!(suite = %id, stage = %name, job = %job.id, "stage started");
                    let batch = Batch::default().suite(suite);
                    self.save(batch);
                    return;
                }
                Err(e @ CoordinatorError::InvalidField { .. }) => {
                    // The stage's request cannot run on these nodes: said,
                    // no node marked, and the later stages go on.
                    let suite = self.suites.get_mut(id).expect("the suite is there");
                    let stage = &mut suite.stages[i];
                    stage.set_state(JobState::Failed);
                    stage.finished_unix_ms = self.cfg.clock.now_ms();
                    stage.note = format!("{REQUEST_FAILURE}: refused: {e}");
                    let line = format!("stage {name} {}", stage.note);
                    warn!(suite = %id, "{line}");
                    add_message(suite, line);
                    suite.current += 1;
                }
                Err(e) => {
                    let suite = self.suites.get_mut(id).expect("the suite is there");
                    let stage = &mut suite.stages[i];
                    stage.set_state(JobState::Failed);
                    stage.finished_unix_ms = self.cfg.clock.now_ms();
                    stage.note = format!("could not start: {e}");
                    suite.message = format!("stage {name} could not start: {e}");
                    warn!(suite = %id, "{}", suite.message);
                    for n in &stage.nodes.clone() {
                        mark(suite, n, Verdict::Incomplete, &name, suite.message.clone());
                    }
                    suite.current += 1;
                }
            }
        }
    }

    /// A preflight stage: each node still in is judged by its own latest
    /// checks (agents re-run them every 30 s); a lost node is out.
    fn preflight_stage(&mut self, id: &str) {
        let Some(suite) = self.suites.get_mut(id) else {
            return;
        };
        let i = suite.current as usize;
        let name = suite.stages[i].name.clone();
        let mut failed = false;
        for n in suite.stages[i].nodes.clone() {
            let Some(e) = self.nodes.get(&n) else {
                mark(
                    suite,
                    &n,
                    Verdict::Incomplete,
                    &name,
                    "the node is gone".into(),
                );
                failed = true;
                continue;
            };
            if e.node.state() == NodeState::Lost {
                let why = format!("the node is lost: {}", e.node.state_reason);
                mark(suite, &n, Verdict::Incomplete, &name, why);
                failed = true;
                continue;
            }
            let bad: Vec<String> = e
                .node
                .preflight
                .iter()
                .filter(|c| c.verdict() == Verdict::Fail)
                .map(|c| format!("{}: {}", c.name, c.detail))
                .collect();
            if !bad.is_empty() {
                mark(suite, &n, Verdict::Fail, &name, bad.join("; "));
                failed = true;
            } else if e
                .node
                .preflight
                .iter()
                .any(|c| c.verdict() == Verdict::Warn)
            {
                mark(suite, &n, Verdict::Warn, &name, String::new());
            }
        }
        let stage = &mut suite.stages[i];
        stage.set_state(if failed {
            JobState::Failed
        } else {
            JobState::Succeeded
        });
        stage.finished_unix_ms = self.cfg.clock.now_ms();
        suite.current += 1;
        let batch = Batch::default().suite(suite);
        self.save(batch);
    }

    /// Suites found running at load: a running stage's job is followed
    /// again; one whose job ended meanwhile goes on from its stored report.
    pub(super) async fn resume_suites(&mut self) {
        let running: Vec<(String, String)> = self
            .suites
            .values()
            .filter(|s| s.state() == JobState::Running)
            .map(|s| {
                let job = s
                    .stages
                    .get(s.current as usize)
                    .filter(|st| st.state() == JobState::Running)
                    .map(|st| st.job_id.clone())
                    .unwrap_or_default();
                (s.id.clone(), job)
            })
            .collect();
        for (id, job) in running {
            if job.is_empty() {
                self.advance_suite(&id).await;
                continue;
            }
            self.jobs_of_suites.insert(job.clone(), id.clone());
            let ended = self
                .jobs
                .get(&job)
                .filter(|j| j.state().is_terminal())
                .map(|j| j.state());
            if let Some(state) = ended {
                match self.report(&job).await {
                    Ok(report) => self.stage_ended(&job, state, &report).await,
                    Err(e) => {
                        warn!(suite = %id, job = %job, "the stage's report is unreadable: {e}")
                    }
                }
            }
        }
    }

    /// Whether a job is a suite's stage (its report then decides who goes on).
    pub(super) fn is_stage(&self, job_id: &str) -> bool {
        self.jobs_of_suites.contains_key(job_id)
    }

    /// A stage's job ended with `report`: its failed and incomplete nodes
    /// are out, and the next stage starts on the others.
    pub(super) async fn stage_ended(&mut self, job_id: &str, state: JobState, report: &Report) {
        let Some(id) = self.jobs_of_suites.remove(job_id) else {
            return;
        };
        let Some(suite) = self.suites.get_mut(&id) else {
            return;
        };
        let Some(i) = suite.stages.iter().position(|s| s.job_id == job_id) else {
            return;
        };
        let name = suite.stages[i].name.clone();
        let out_before = suite.verdicts.iter().filter(|n| out(n)).count();
        let in_report: BTreeMap<&str, _> =
            report.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        for n in suite.stages[i].nodes.clone() {
            match in_report.get(n.as_str()) {
                Some(r) => {
                    let reason = if r.reason.is_empty() {
                        report.reason.clone()
                    } else {
                        r.reason.clone()
                    };
                    // One whose result did not reach us could not take
                    // part: out, not failed, and the stage names it.
                    let v = if crate::judge::report::unreached(r) {
                        Verdict::Incomplete
                    } else {
                        r.verdict()
                    };
                    mark(suite, &n, v, &name, reason);
                }
                None => {
                    let why = format!("not in the stage's job {job_id} ({})", report.reason);
                    mark(suite, &n, Verdict::Incomplete, &name, why);
                }
            }
        }
        let named = suite.verdicts.iter().filter(|n| out(n)).count() > out_before;
        let stage = &mut suite.stages[i];
        stage.set_state(state);
        stage.finished_unix_ms = self.cfg.clock.now_ms();
        let request = report
            .findings
            .iter()
            .any(|f| f.metric == gpuctl_core::request::FINDING_METRIC);
        if state == JobState::Failed && (request || !named) {
            // Failed as a whole (a job figure under its floor, say) without
            // naming a node: no node is blamed, and the suite cannot pass.
            let kind = if request {
                REQUEST_FAILURE
            } else {
                UNNAMED_FAILURE
            };
            stage.note = format!("{kind}: {}", report.reason);
            let line = format!("stage {name} {}", stage.note);
            add_message(suite, line);
        }
        if suite.current as usize == i {
            suite.current += 1;
        }
        info!(suite = %id, stage = %name, job = %job_id, state = state.label(), "stage ended");
        let batch = Batch::default().suite(suite);
        self.save(batch);
        self.advance_suite(&id).await;
    }

    /// The suite is over: one verdict per node, kept as each node's
    /// acceptance state.
    fn end_suite(&mut self, id: &str) {
        let Some(suite) = self.suites.get_mut(id) else {
            return;
        };
        let now = self.cfg.clock.now_ms();
        let failed: Vec<&SuiteNode> = suite.verdicts.iter().filter(|n| out(n)).collect();
        // A stage that failed as a whole, naming no node: the suite cannot
        // pass, though no node is to blame.
        let stage_failed = suite
            .stages
            .iter()
            .any(|s| s.note.starts_with(UNNAMED_FAILURE) || s.note.starts_with(REQUEST_FAILURE));
        // One that failed for its request measured nothing: the nodes it
        // did not blame keep the acceptance state they had.
        let request_failed = suite
            .stages
            .iter()
            .any(|s| s.note.starts_with(REQUEST_FAILURE));
        let state = if failed.is_empty() && !stage_failed {
            JobState::Succeeded
        } else {
            JobState::Failed
        };
        if suite.message.is_empty() && !failed.is_empty() {
            suite.message = failed
                .iter()
                .map(|n| format!("{} failed at {}", n.node, n.stage))
                .collect::<Vec<_>>()
                .join("; ");
        }
        suite.set_state(state);
        suite.finished_unix_ms = now;
        suite.current = suite.stages.len() as u32;
        let mut batch = Batch::default().suite(suite);
        let mut outcomes = Vec::new();
        for n in &suite.verdicts {
            if request_failed && !out(n) {
                // Not judged, so not accepted: its certificate says so.
                outcomes.push((
                    n.node.clone(),
                    Verdict::Incomplete,
                    String::new(),
                    suite.message.clone(),
                ));
                continue;
            }
            // A node no stage blamed in a suite that failed as a whole is not
            // accepted either, but not failed: incomplete, with the reason.
            let (verdict, reason) = if stage_failed && !out(n) {
                (Verdict::Incomplete as i32, suite.message.clone())
            } else {
                (n.verdict, n.reason.clone())
            };
            outcomes.push((
                n.node.clone(),
                Verdict::try_from(verdict).unwrap_or_default(),
                n.stage.clone(),
                reason.clone(),
            ));
            batch = batch.acceptance(&Acceptance {
                node: n.node.clone(),
                suite_id: suite.id.clone(),
                level: suite.level.clone(),
                verdict,
                stage: n.stage.clone(),
                reason,
                finished_unix_ms: now,
            });
        }
        info!(suite = %id, state = state.label(), "suite ended");
        let suite = suite.clone();
        self.save(batch);
        self.issue_certs(suite, outcomes);
    }
}

//! Bounded series a rank sends in its result: the phase timeline
//! (`RankResult.phases`, what `gpuctl trace` draws) and evenly thinned lists
//! such as a model's step times (`TrainResult.step_ms`).
//!
//! A long run must not grow its result without end, and the coordinator clips
//! past the same bounds (coordinator/src/service/worker.rs); thinning here
//! keeps what a reader needs: every phase change, the first and last marks,
//! and an even spread of the rest.

use gpuctl_core::stats::thin_evenly;
use gpuctl_proto::pb::{PhaseKind, PhaseMark};

/// Marks of one rank's timeline at most.
pub const MAX_PHASES: usize = 1024;
/// Step times of one model at most.
pub const MAX_STEP_TIMES: usize = 4096;
/// A phase's text at most (bytes).
pub const MAX_PHASE_TEXT: usize = 256;
/// Within a phase, a mark about this often (ms), so the iteration counter can
/// be drawn over time.
pub const MARK_EVERY_MS: u64 = 1000;

/// What a phase is on the timeline: the progress text without a trailing step
/// counter (`train step 3/30` is phase `train step`, `warmup 1/5` is
/// `warmup`), so that a phase is a stretch of work and the counter shows in
/// the marks' iterations. Other counters stay (`pairs round 2/6` is a phase
/// of its own: rounds are few, and each measures other links).
pub fn phase_key(phase: &str) -> &str {
    let t = phase.trim_end();
    let Some((head, last)) = t.rsplit_once(' ') else {
        return clip(t);
    };
    let counter = last.split_once('/').is_some_and(|(a, b)| {
        !a.is_empty()
            && !b.is_empty()
            && a.bytes().all(|c| c.is_ascii_digit())
            && b.bytes().all(|c| c.is_ascii_digit())
    });
    let steps = head.ends_with(" step") || head == "step" || head.ends_with("warmup");
    clip(if counter && steps { head.trim_end() } else { t })
}

fn clip(s: &str) -> &str {
    if s.len() <= MAX_PHASE_TEXT {
        return s;
    }
    let mut end = MAX_PHASE_TEXT;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A rank's phase marks: one at every phase change, one about every second
/// within a phase, at most `max` (older within-phase marks thinned first).
#[derive(Debug, Clone)]
pub struct Timeline {
    marks: Vec<PhaseMark>,
    max: usize,
    /// What the workload said it entered last; every mark carries it.
    kind: PhaseKind,
}

impl Default for Timeline {
    fn default() -> Self {
        Timeline::new(MAX_PHASES)
    }
}

impl Timeline {
    pub fn new(max: usize) -> Self {
        Timeline {
            marks: Vec::new(),
            max: max.max(2),
            kind: PhaseKind::Setup,
        }
    }

    /// The workload enters a phase of `kind`: a mark at once (with the
    /// phase text so far), so the phase starts when the workload said, not
    /// at its next progress line.
    pub fn enter(&mut self, kind: PhaseKind, unix_ms: u64, iterations: u64) {
        if kind == self.kind {
            return;
        }
        self.kind = kind;
        let phase = self
            .marks
            .last()
            .map(|m| m.phase.clone())
            .unwrap_or_default();
        self.push(phase, unix_ms, iterations);
    }

    /// Notes the progress `phase` at `unix_ms`; allocates only when a mark is
    /// taken (a new phase, or a second since the last mark).
    pub fn record(&mut self, phase: &str, unix_ms: u64, iterations: u64) {
        let key = phase_key(phase);
        if let Some(last) = self.marks.last() {
            if last.phase == key && unix_ms < last.unix_ms.saturating_add(MARK_EVERY_MS) {
                return;
            }
        }
        self.push(key.to_string(), unix_ms, iterations);
    }

    fn push(&mut self, phase: String, unix_ms: u64, iterations: u64) {
        if self.marks.len() >= self.max {
            self.thin();
        }
        self.marks.push(PhaseMark {
            phase,
            unix_ms,
            iterations,
            kind: self.kind as i32,
        });
    }

    pub fn marks(&self) -> &[PhaseMark] {
        &self.marks
    }

    /// Makes room: drops every other within-phase mark (the first and last
    /// mark and every change of phase or kind stay); a timeline of changes
    /// only is thinned evenly instead.
    fn thin(&mut self) {
        let n = self.marks.len();
        let within: Vec<usize> = (1..n.saturating_sub(1))
            .filter(|&i| {
                let (a, b) = (&self.marks[i - 1], &self.marks[i]);
                a.phase == b.phase && a.kind == b.kind
            })
            .collect();
        if within.is_empty() {
            self.marks = thin_evenly(&self.marks, self.max / 2 + 1);
            return;
        }
        let drop: std::collections::HashSet<usize> = within.iter().copied().step_by(2).collect();
        let mut i = 0;
        self.marks.retain(|_| {
            let keep = !drop.contains(&i);
            i += 1;
            keep
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_times_are_thinned_evenly_keeping_the_ends() {
        let many: Vec<f64> = (0..10_000).map(f64::from).collect();
        let t = thin_evenly(&many, MAX_STEP_TIMES);
        assert_eq!(t.len(), MAX_STEP_TIMES);
        assert_eq!((t[0], *t.last().unwrap()), (0.0, 9999.0));
        assert!(t.windows(2).all(|w| w[1] > w[0]));
        let gaps: Vec<f64> = t.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.iter().all(|g| (2.0..=3.0).contains(g)), "{gaps:?}");
    }

    #[test]
    fn phase_keys_drop_the_step_counter_only() {
        assert_eq!(phase_key("train step 3/30"), "train step");
        assert_eq!(phase_key("cnn: warmup 1/2"), "cnn: warmup");
        assert_eq!(phase_key("gemm bf16 n=8192"), "gemm bf16 n=8192");
        assert_eq!(phase_key("trial batch 64"), "trial batch 64");
        assert_eq!(phase_key("pairs/3"), "pairs/3");
        assert_eq!(phase_key("pairs round 2/6"), "pairs round 2/6");
        assert_eq!(phase_key("baseline step 1/10"), "baseline step");
        assert_eq!(
            phase_key("mobilenet_v2: baseline warmup 2/2"),
            "mobilenet_v2: baseline warmup"
        );
        assert_eq!(phase_key("x a/3"), "x a/3");
        assert_eq!(phase_key(&"é".repeat(300)).len(), MAX_PHASE_TEXT);
    }

    #[test]
    fn marks_at_changes_and_once_a_second_within_a_phase() {
        let mut t = Timeline::default();
        t.record("starting", 1_000, 0);
        t.record("starting", 1_500, 0);
        for step in 1..=30u64 {
            // a step every 100 ms
            t.record(&format!("train step {step}/30"), 2_000 + step * 100, step);
        }
        t.record("done", 6_000, 30);
        let got: Vec<(&str, u64)> = t
            .marks()
            .iter()
            .map(|m| (m.phase.as_str(), m.unix_ms))
            .collect();
        assert_eq!(
            got,
            [
                ("starting", 1_000),
                ("train step", 2_100),
                ("train step", 3_100),
                ("train step", 4_100),
                ("done", 6_000)
            ]
        );
        assert_eq!(t.marks()[2].iterations, 11);
    }

    #[test]
    fn entering_a_kind_marks_at_once_and_every_later_mark_carries_it() {
        let mut t = Timeline::default();
        t.record("train step 1/2", 1_000, 1);
        t.record("train step 2/2", 1_100, 2);
        t.enter(PhaseKind::Verify, 1_200, 2);
        t.enter(PhaseKind::Verify, 1_300, 2);
        t.record("verifying parameters", 1_400, 2);
        let got: Vec<(&str, u64, PhaseKind)> = t
            .marks()
            .iter()
            .map(|m| (m.phase.as_str(), m.unix_ms, m.kind()))
            .collect();
        assert_eq!(
            got,
            [
                ("train step", 1_000, PhaseKind::Setup),
                ("train step", 1_200, PhaseKind::Verify),
                ("verifying parameters", 1_400, PhaseKind::Verify),
            ]
        );
    }

    #[test]
    fn a_full_timeline_thins_within_phase_marks_and_keeps_every_change() {
        let mut t = Timeline::new(16);
        let mut ms = 0;
        let mut changes = Vec::new();
        for (phase, seconds) in [("a", 40), ("b", 3), ("c", 40), ("d", 1)] {
            changes.push((phase, ms));
            for _ in 0..seconds {
                t.record(phase, ms, ms / 1000);
                ms += 1000;
            }
        }
        let m = t.marks();
        assert!(m.len() <= 16, "{}", m.len());
        assert!(m.windows(2).all(|w| w[1].unix_ms > w[0].unix_ms));
        for (phase, at) in changes {
            assert!(
                m.iter().any(|x| x.phase == phase && x.unix_ms == at),
                "the change to {phase} at {at} was lost: {m:?}"
            );
        }
        assert_eq!(m[0].unix_ms, 0);
        assert_eq!(m.last().unwrap().unix_ms, ms - 1000);
        // Phase changes alone past the bound: thinned evenly, ends kept.
        let mut t = Timeline::new(8);
        for i in 0..100u64 {
            t.record(&format!("p{i}"), i, i);
        }
        let m = t.marks();
        assert!(m.len() <= 8 && m.len() >= 4, "{}", m.len());
        assert_eq!(m[0].phase, "p0");
        assert_eq!(m.last().unwrap().phase, "p99");
    }
}

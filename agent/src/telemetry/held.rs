//! Telemetry waiting to be sent: a job's samples held for the coordinator's
//! pace (`gpuctl_core::pace`), then sent as one batch. Nothing is held when no
//! pace is asked, and a job's samples go at once when its workers are gone,
//! so that its report, made when its last result comes, has them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gpuctl_proto::pb::TelemetryBatch;

use crate::workers::GpuJob;

/// Batches by job and attempt, each with when its first sample was held.
#[derive(Default)]
pub struct Held {
    jobs: BTreeMap<(String, u32), (Instant, TelemetryBatch)>,
}

impl Held {
    /// Takes this interval's batches; returns what is due: every batch when
    /// `every` is zero, else those held `every` or longer and those of jobs
    /// no longer running here (`running`).
    pub fn take(
        &mut self,
        fresh: Vec<TelemetryBatch>,
        running: &[GpuJob],
        every: Duration,
        now: Instant,
    ) -> Vec<TelemetryBatch> {
        for b in fresh {
            match self.jobs.entry((b.job_id.clone(), b.attempt)) {
                std::collections::btree_map::Entry::Occupied(mut e) => {
                    e.get_mut().1.samples.extend(b.samples)
                }
                std::collections::btree_map::Entry::Vacant(e) => {
                    e.insert((now, b));
                }
            }
        }
        let due = |(job, attempt): &(String, u32), since: Instant| {
            now.saturating_duration_since(since) >= every
                || !running
                    .iter()
                    .any(|j| &j.job_id == job && j.attempt == *attempt)
        };
        let keys: Vec<(String, u32)> = self
            .jobs
            .iter()
            .filter(|(k, (since, _))| due(k, *since))
            .map(|(k, _)| k.clone())
            .collect();
        keys.iter()
            .filter_map(|k| self.jobs.remove(k).map(|(_, b)| b))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb::GpuSample;

    fn batch(job: &str, gpu: u32) -> TelemetryBatch {
        TelemetryBatch {
            node: "n1".into(),
            job_id: job.into(),
            attempt: 0,
            samples: vec![GpuSample {
                index: gpu,
                ..Default::default()
            }],
        }
    }

    fn job(id: &str) -> GpuJob {
        GpuJob {
            job_id: id.into(),
            attempt: 0,
            gpus: vec![0],
        }
    }

    #[test]
    fn without_a_pace_every_batch_goes_at_once() {
        let mut held = Held::default();
        let out = held.take(
            vec![batch("a", 0)],
            &[job("a")],
            Duration::ZERO,
            Instant::now(),
        );
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn a_job_s_samples_wait_for_the_pace_and_go_together_or_when_it_ends() {
        let mut held = Held::default();
        let t0 = Instant::now();
        let every = Duration::from_secs(4);
        let s = Duration::from_secs(1);
        let running = [job("a"), job("b")];
        for i in 0..4 {
            let out = held.take(
                vec![batch("a", 0), batch("b", 0)],
                &running,
                every,
                t0 + s * i,
            );
            assert!(out.is_empty(), "sent before the pace at {i} s");
        }
        let out = held.take(vec![batch("a", 0)], &running, every, t0 + s * 4);
        assert_eq!(out.len(), 2, "both jobs are due");
        assert_eq!(out[0].samples.len(), 5, "a's five samples in one batch");
        assert_eq!(out[1].samples.len(), 4);
        // b ends: what it held goes with the next interval, not the pace.
        held.take(vec![batch("b", 0)], &running, every, t0 + s * 5);
        let out = held.take(vec![], &[job("a")], every, t0 + s * 6);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].job_id, "b");
    }
}

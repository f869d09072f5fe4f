//! A big running job's bounded view (`gpuctl status`, the live view), kept
//! a moment and answered again. At 16,384 nodes × 8 GPUs one view took the
//! scheduler's task ~30 ms (131,072 ranks sorted for the furthest behind),
//! and the bench's one `status` a second was a quarter of the task's time
//! (docs/benchmarks.md, "Where the scheduler's time goes"). Ranks of a
//! job that size report every 30 s, so a view up to a second old shows the
//! same; one whose state or count of results moved is made again.

use gpuctl_proto::pb::Job;

use super::state::{JobEntry, KeptView};

/// Ranks from which a job's bounded view is kept: below, one costs under a
/// millisecond and is made for every call.
const KEEP_FROM_RANKS: usize = 4_096;

/// How long a kept view is answered again (ms).
const KEPT_MS: u64 = 1_000;

impl JobEntry {
    /// [`JobEntry::view_of`], kept for [`KEPT_MS`] for a job of
    /// [`KEEP_FROM_RANKS`] ranks or more.
    pub fn view_at(&self, max_ranks: u32, now_ms: u64) -> Job {
        let world = self.job.plan.as_ref().map_or(0, |p| p.ranks.len());
        if max_ranks == 0 || world < KEEP_FROM_RANKS {
            return self.view_of(max_ranks);
        }
        let of = (
            max_ranks,
            self.job.attempt,
            self.state() as i32,
            self.job.results_in,
        );
        let mut kept = self.kept_view.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = kept.as_ref() {
            if k.of == of && now_ms.saturating_sub(k.made_ms) < KEPT_MS {
                return k.job.clone();
            }
        }
        let job = self.view_of(max_ranks);
        *kept = Some(KeptView {
            of,
            made_ms: now_ms,
            job: job.clone(),
        });
        job
    }
}

#[cfg(test)]
mod tests {
    use gpuctl_proto::pb::{JobState, Plan, RankPlacement, RankProgress};

    use super::*;

    fn job(world: u32) -> JobEntry {
        let mut e = JobEntry::default();
        e.job.plan = Some(Plan {
            ranks: (0..world)
                .map(|rank| RankPlacement {
                    rank,
                    ..Default::default()
                })
                .collect(),
            world_size: world,
            ..Default::default()
        });
        e.job.set_state(JobState::Running);
        for rank in 0..world {
            let p = RankProgress {
                rank,
                unix_ms: 10_000 + u64::from(rank),
                ..Default::default()
            };
            e.progress.insert(rank, p);
        }
        e
    }

    fn first_shown(v: &Job) -> u32 {
        v.plan.as_ref().unwrap().ranks[0].rank
    }

    #[test]
    fn a_big_jobs_view_is_answered_again_for_a_second_unless_the_job_moved() {
        let mut e = job(8_192);
        assert_eq!(first_shown(&e.view_at(64, 0)), 0, "the stalest first");
        // Rank 0 reports: within the second, the kept view is answered.
        e.progress.get_mut(&0).unwrap().unix_ms = 50_000;
        assert_eq!(first_shown(&e.view_at(64, 999)), 0);
        assert_eq!(first_shown(&e.view_at(64, 1_000)), 1, "made again");
        // Another bound, or a result in, is a view of its own.
        e.progress.get_mut(&1).unwrap().unix_ms = 50_000;
        assert_eq!(first_shown(&e.view_at(32, 1_001)), 2);
        e.progress.get_mut(&2).unwrap().unix_ms = 50_000;
        e.job.results_in = 1;
        assert_eq!(first_shown(&e.view_at(32, 1_002)), 3);
        // The job's end shows at once.
        e.job.set_state(JobState::Succeeded);
        assert_eq!(e.view_at(32, 1_003).state(), JobState::Succeeded);
    }

    #[test]
    fn a_small_jobs_view_is_made_for_every_call() {
        let mut e = job(64);
        assert_eq!(first_shown(&e.view_at(8, 0)), 0);
        e.progress.get_mut(&0).unwrap().unix_ms = 50_000;
        assert_eq!(first_shown(&e.view_at(8, 1)), 1);
    }
}

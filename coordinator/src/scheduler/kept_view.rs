//! A big job's bounded view (`gpuctl status`, the live view), kept a
//! moment and answered again. At 16,384 nodes × 8 GPUs one view took the
//! scheduler's task ~30 ms (131,072 ranks sorted for the furthest behind),
//! and the bench's one `status` a second was a quarter of the task's time
//! (docs/benchmarks.md, "Where the scheduler's time goes"). Ranks of a
//! job that size report every 30 s, so a view up to a second old shows the
//! same; one whose state or count of results moved is made again.
//!
//! Views people read are also kept beside the scheduler ([`KeptViews`]),
//! made again by it as [`super::listing`]'s listings are: a `status` that
//! waited for the task at a job's start or end, its fleet's 131,072 results
//! ahead of it, took 290-515 ms.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use gpuctl_proto::pb::Job;

use super::listing::{Pace, WANTED_MS};
use super::state::{JobEntry, KeptView};
use super::Scheduler;

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

/// Views kept beside the scheduler: `status` is read about once a second
/// and shows the furthest behind of ranks that report every 30 s.
pub const VIEWS: Pace = Pace {
    fresh_ms: 2_000,
    redo_ms: 1_000,
    gap_ms: 0,
};

/// Views kept beside the scheduler at most: each is a bounded view, a few
/// hundred ranks.
const MOST_VIEWS: usize = 16;

/// One view people asked for.
#[derive(Default)]
struct Beside {
    asked_ms: u64,
    /// The job changes counted ([`super::listing::JobListing::changes`])
    /// and the clock when it was made, whether it moves, and the view
    /// (`None`: the scheduler answers it, a small job's or none).
    made: Option<(u64, u64, bool, Option<Arc<Job>>)>,
}

/// Big jobs' bounded views people read, by (job, ranks asked for), kept
/// made by the scheduler; shared with its handles.
#[derive(Default)]
pub struct KeptViews(Mutex<BTreeMap<(String, u32), Beside>>);

impl KeptViews {
    /// The view of `job` bounded to `max_ranks` for a caller at `now_ms`,
    /// when one is kept and no job changed (`changes`) since it was made.
    pub fn current(&self, job: &str, max_ranks: u32, now_ms: u64, changes: u64) -> Option<Job> {
        let mut views = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let key = (job.to_string(), max_ranks);
        if !views.contains_key(&key) && views.len() >= MOST_VIEWS {
            let oldest = views.iter().min_by_key(|(_, b)| b.asked_ms);
            let oldest = oldest.map(|(k, _)| k.clone());
            views.remove(&oldest.expect("full"));
        }
        let b = views.entry(key).or_default();
        b.asked_ms = b.asked_ms.max(now_ms);
        match b.made.as_ref()? {
            (c, built, moving, Some(v))
                if *c == changes && (!moving || now_ms.saturating_sub(*built) < VIEWS.fresh_ms) =>
            {
                Some(Job::clone(v))
            }
            _ => None,
        }
    }

    /// The views to make again at `now_ms` (job changes counted:
    /// `changes`); those no one asked for in [`WANTED_MS`] are let go.
    fn due(&self, now_ms: u64, changes: u64) -> Vec<(String, u32)> {
        let mut views = self.0.lock().unwrap_or_else(|e| e.into_inner());
        views.retain(|_, b| now_ms.saturating_sub(b.asked_ms) < WANTED_MS);
        let due = |b: &Beside| {
            b.made.as_ref().is_none_or(|(c, built, moving, _)| {
                *c != changes || (*moving && now_ms.saturating_sub(*built) >= VIEWS.redo_ms)
            })
        };
        views
            .iter()
            .filter(|(_, b)| due(b))
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn keep(&self, key: (String, u32), made: (u64, u64, bool, Option<Arc<Job>>)) {
        let mut views = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = views.get_mut(&key) {
            b.made = Some(made);
        }
    }
}

impl Scheduler {
    /// The views people read made again when due ([`KeptViews`]): a big
    /// job's, running or ended; a small job's is made for every call.
    pub(super) fn keep_views(&self, now: u64) {
        let changes = self.job_listing.changes();
        for key in self.views.due(now, changes) {
            let (id, max_ranks) = (&key.0, key.1);
            let view = self.jobs.get(id).and_then(|e| {
                let world = e.job.plan.as_ref().map_or(0, |p| p.ranks.len());
                if e.retired {
                    let v = e.retired_view.as_ref()?;
                    (max_ranks == gpuctl_proto::VIEW_RANKS).then(|| (false, v.clone()))
                } else if world >= KEEP_FROM_RANKS && max_ranks > 1 {
                    Some((!e.state().is_terminal(), e.view_at(max_ranks, now)))
                } else {
                    None
                }
            });
            let made = match view {
                Some((moving, v)) => (changes, now, moving, Some(Arc::new(v))),
                None => (changes, now, true, None),
            };
            self.views.keep(key, made);
        }
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
    fn a_view_beside_is_current_until_a_job_changes_or_it_ages() {
        let views = KeptViews::default();
        assert!(views.current("job-1", 64, 1_000, 7).is_none(), "none made");
        assert_eq!(views.due(1_000, 7), vec![("job-1".to_string(), 64)]);
        let made = |v: u32| {
            Some(Arc::new(Job {
                results_in: v,
                ..Default::default()
            }))
        };
        views.keep(("job-1".into(), 64), (7, 1_000, true, made(3)));
        assert!(views.due(1_000 + VIEWS.redo_ms - 1, 7).is_empty());
        assert_eq!(
            views.current("job-1", 64, 2_000, 7).map(|j| j.results_in),
            Some(3)
        );
        assert!(
            views.current("job-1", 64, 2_000, 8).is_none(),
            "a job changed"
        );
        assert!(
            views
                .current("job-1", 64, 1_000 + VIEWS.fresh_ms, 7)
                .is_none(),
            "too old"
        );
        // A view the scheduler answers itself (a small job's, or none).
        views.keep(("job-1".into(), 64), (7, 3_000, true, None));
        assert!(views.current("job-1", 64, 3_000, 7).is_none());
        // No one asks for a minute: let go.
        assert!(views.due(3_000 + WANTED_MS, 7).is_empty());
        views.keep(("job-1".into(), 64), (7, 3_000, false, made(4)));
        assert!(views.current("job-1", 64, 3_000, 7).is_none(), "let go");
    }

    #[test]
    fn views_beside_are_bounded_the_least_asked_for_let_go() {
        let views = KeptViews::default();
        for i in 0..MOST_VIEWS as u64 + 4 {
            views.current(&format!("job-{i}"), 64, 1_000 + i, 0);
        }
        let due = views.due(2_000, 0);
        assert_eq!(due.len(), MOST_VIEWS);
        assert!(!due.contains(&("job-0".to_string(), 64)), "asked first");
    }

    #[tokio::test]
    async fn the_scheduler_keeps_a_big_jobs_view_made_for_status() {
        use super::super::tests::{Fixture, T0};
        let mut f = Fixture::new(std::time::Duration::from_secs(3_600)).await;
        f.join("n1").await;
        let mut big = job(8_192);
        big.job.id = "job-big".into();
        f.sched.jobs.insert("job-big".into(), big);
        f.sched.job_listing.changed();
        let changes = f.sched.job_listing.changes();
        let views = f.sched.views.clone();
        assert!(views.current("job-big", 64, T0, changes).is_none());
        f.beat("n1").await;
        let kept = views.current("job-big", 64, T0, changes).expect("made");
        assert_eq!(
            first_shown(&kept),
            0,
            "the stalest first, as the task shows it"
        );
        // A small job's is the scheduler's to answer, every call.
        f.sched.jobs.insert("job-small".into(), job(64));
        f.sched.job_listing.changed();
        let changes = f.sched.job_listing.changes();
        f.beat("n1").await;
        assert!(views.current("job-small", 64, T0, changes).is_none());
        f.beat("n1").await;
        assert!(views.current("job-small", 64, T0, changes).is_none());
        // Any job's change: the scheduler answers until made again.
        f.sched.job_listing.changed();
        let changes = f.sched.job_listing.changes();
        assert!(views.current("job-big", 64, T0, changes).is_none());
        f.beat("n1").await;
        assert!(views.current("job-big", 64, T0, changes).is_some());
    }

    #[test]
    fn a_small_jobs_view_is_made_for_every_call() {
        let mut e = job(64);
        assert_eq!(first_shown(&e.view_at(8, 0)), 0);
        e.progress.get_mut(&0).unwrap().unix_ms = 50_000;
        assert_eq!(first_shown(&e.view_at(8, 1)), 1);
    }
}

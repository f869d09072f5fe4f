//! The report of the job that ended last, kept in memory a little while.
//!
//! When a big job ends, everyone following it (`gpuctl submit --wait`,
//! `gpuctl watch`, scripts polling `gpuctl status`) asks for its report at
//! once. Read back from the store, a 32,768-rank report cost each of them
//! a few hundred milliseconds and its results decoded anew; from here each
//! gets it shared, and cuts what it sends from it off the scheduler's task
//! ([`crate::judge::thin::to_send`]). One report at most, given up
//! when another job starts (its results will want the memory) or after
//! [`RECENT_MS`].

use std::sync::Arc;

use gpuctl_proto::pb::Report;

use super::background::drop_later;
use super::events::ReportReply;

/// How long the last report stays in memory when no job starts.
pub const RECENT_MS: u64 = 10_000;

#[derive(Default)]
pub struct Recent(Option<(String, Arc<Report>, u64)>);

impl Recent {
    /// Keeps `report` of job `id` in place of the one kept before.
    pub fn keep(&mut self, id: &str, report: Arc<Report>, now_ms: u64) {
        self.forget();
        self.0 = Some((id.to_string(), report, now_ms + RECENT_MS));
    }

    pub fn get(&self, id: &str) -> Option<Arc<Report>> {
        self.0
            .as_ref()
            .filter(|(kept, _, _)| kept == id)
            .map(|(_, r, _)| r.clone())
    }

    /// Gives the report up once its time is over.
    pub fn expire(&mut self, now_ms: u64) {
        if self
            .0
            .as_ref()
            .is_some_and(|(_, _, until)| now_ms >= *until)
        {
            self.forget();
        }
    }

    /// Gives the report up now; it is freed off the task.
    pub fn forget(&mut self) {
        if let Some((_, report, _)) = self.0.take() {
            drop_later(report);
        }
    }
}

/// Answers each of `waiting` with `report`, shared: each caller cuts from
/// it what it sends, off the scheduler's task.
pub fn answer(waiting: Vec<ReportReply>, report: Arc<Report>) {
    for w in waiting {
        let _ = w.send(Ok(report.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(id: &str) -> Arc<Report> {
        Arc::new(Report {
            job_id: id.into(),
            ..Default::default()
        })
    }

    #[test]
    fn one_report_is_kept_until_its_time_is_over() {
        let mut recent = Recent::default();
        recent.keep("job-1", report("job-1"), 1_000);
        assert!(recent.get("job-1").is_some());
        recent.keep("job-2", report("job-2"), 2_000);
        assert!(recent.get("job-1").is_none(), "one report at most");
        recent.expire(2_000 + RECENT_MS - 1);
        assert_eq!(recent.get("job-2").unwrap().job_id, "job-2");
        recent.expire(2_000 + RECENT_MS);
        assert!(recent.get("job-2").is_none());
    }

    #[tokio::test]
    async fn everyone_waiting_gets_a_copy() {
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..3).map(|_| tokio::sync::oneshot::channel()).unzip();
        answer(txs, report("job-1"));
        for rx in rxs {
            assert_eq!(rx.await.unwrap().unwrap().job_id, "job-1");
        }
    }
}

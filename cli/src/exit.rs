//! One exit-code scheme for every verb, so a script can tell a failed job from
//! a typo, a wrong job id or a coordinator that is down without reading text.
//! Verbs say what happened as an [`Exit`]; errors are classified by
//! [`Exit::of_error`]; `main` turns either into the process status.

use gpuctl_proto::pb;
use tonic::Code;

use crate::error::UsageError;

/// What `gpuctl --help` and README.md show; keep the two in step with [`Exit::code`].
pub const HELP: &str = "\
Exit codes (every verb):
  0    done; the job passed, warnings included (submit --wait, report), or has not
       failed (status, watch)
  1    the job failed its verdict or was cancelled (submit --wait, status, report, watch), a check
       failed (plan, doctor), or another error
  2    bad input: a flag or value was refused, nothing was sent
  3    not found: no such job (or node)
  4    coordinator unreachable, or it did not answer in time
  130  interrupted (Ctrl-C) while following a job; the job goes on";

/// The outcome of one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Ok,
    /// The job failed or was cancelled, a check failed, or an error of no other kind.
    Failed,
    /// Bad input; nothing was sent.
    Usage,
    /// The job or node named does not exist.
    NotFound,
    /// The coordinator could not be reached or did not answer in time.
    Unreachable,
    /// Ctrl-C while following a job (which goes on).
    Interrupted,
}

impl Exit {
    pub fn code(self) -> i32 {
        match self {
            Exit::Ok => 0,
            Exit::Failed => 1,
            Exit::Usage => 2,
            Exit::NotFound => 3,
            Exit::Unreachable => 4,
            // 128 + SIGINT, as shells report a command stopped by Ctrl-C.
            Exit::Interrupted => 130,
        }
    }

    /// `Failed` when a check found something wrong, else `Ok`.
    pub fn failed_if(failed: bool) -> Exit {
        if failed {
            Exit::Failed
        } else {
            Exit::Ok
        }
    }

    /// A job as `status` and `watch` see it: failed or cancelled is a failure;
    /// pending, running or succeeded is not.
    pub fn of_job(job: &pb::Job) -> Exit {
        Exit::failed_if(matches!(
            job.state(),
            pb::JobState::Failed | pb::JobState::Cancelled
        ))
    }

    /// A report's verdict: `Ok` only for a job that succeeded and passed
    /// (warnings included: they are listed, they do not fail the acceptance),
    /// so CI can gate on `submit --wait` or `report` alone.
    pub fn of_report(report: &pb::Report) -> Exit {
        let passed = matches!(report.verdict(), pb::Verdict::Pass | pb::Verdict::Warn);
        Exit::failed_if(report.state() != pb::JobState::Succeeded || !passed)
    }

    /// What kind of failure an error is: by type where the cause is kept (a
    /// usage error, a gRPC status, a transport error), else by the sentences
    /// the coordinator client writes for unreachable, timed-out and not-found.
    pub fn of_error(e: &anyhow::Error) -> Exit {
        for cause in e.chain() {
            if cause.is::<UsageError>() || cause.is::<clap::Error>() {
                return Exit::Usage;
            }
            if let Some(s) = cause.downcast_ref::<tonic::Status>() {
                return Exit::of_status(s.code(), s.message());
            }
            if let Some(r) = cause.downcast_ref::<crate::client::RpcError>() {
                return Exit::of_status(r.code, &r.text);
            }
            if cause.is::<tonic::transport::Error>()
                || cause.is::<tonic::ConnectError>()
                || cause.is::<tonic::TimeoutExpired>()
            {
                return Exit::Unreachable;
            }
        }
        Exit::of_text(&e.root_cause().to_string())
    }

    /// A gRPC status code (and message, for tonic's client-side timeout).
    pub fn of_status(code: Code, message: &str) -> Exit {
        match code {
            Code::NotFound => Exit::NotFound,
            Code::Unavailable | Code::DeadlineExceeded => Exit::Unreachable,
            // tonic reports its own request timeout as Cancelled.
            Code::Cancelled if is_timeout(message) => Exit::Unreachable,
            Code::InvalidArgument => Exit::Usage,
            _ => Exit::Failed,
        }
    }

    /// The client's sentences once the status is gone: "cannot reach
    /// coordinator at ...", the coordinator's "no job `x`", "... (NotFound)".
    fn of_text(text: &str) -> Exit {
        let t = text.trim();
        if t.starts_with("cannot reach coordinator")
            || is_timeout(t)
            || t.contains("(Unavailable)")
            || t.contains("(DeadlineExceeded)")
        {
            Exit::Unreachable
        } else if t.starts_with("no job `")
            || t.starts_with("no node `")
            || t.ends_with(": not found")
            || t.contains("(NotFound)")
        {
            Exit::NotFound
        } else if t.contains("(InvalidArgument)") {
            Exit::Usage
        } else {
            Exit::Failed
        }
    }
}

fn is_timeout(text: &str) -> bool {
    let t = text.to_ascii_lowercase();
    t.contains("timeout expired") || t.contains("timed out") || t.contains("deadline exceeded")
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::anyhow;

    #[test]
    fn codes_are_the_documented_ones() {
        for (exit, code) in [
            (Exit::Ok, 0),
            (Exit::Failed, 1),
            (Exit::Usage, 2),
            (Exit::NotFound, 3),
            (Exit::Unreachable, 4),
            (Exit::Interrupted, 130),
        ] {
            assert_eq!(exit.code(), code);
            assert!(
                HELP.contains(&format!("\n  {code}  ")),
                "{code} is documented"
            );
        }
    }

    #[test]
    fn readme_documents_every_code() {
        let readme = include_str!("../../README.md");
        for code in [0, 1, 2, 3, 4, 130] {
            assert!(
                readme.contains(&format!("\n| {code} | ")),
                "README.md's exit-code table lacks {code}"
            );
        }
    }

    #[test]
    fn jobs_fail_only_when_failed_or_cancelled() {
        let job = |s: pb::JobState| pb::Job {
            state: s as i32,
            ..Default::default()
        };
        assert_eq!(Exit::of_job(&job(pb::JobState::Failed)), Exit::Failed);
        assert_eq!(Exit::of_job(&job(pb::JobState::Cancelled)), Exit::Failed);
        assert_eq!(Exit::of_job(&job(pb::JobState::Running)), Exit::Ok);
        assert_eq!(Exit::of_job(&job(pb::JobState::Succeeded)), Exit::Ok);
    }

    #[test]
    fn reports_need_success_and_pass() {
        let report = |s: pb::JobState, v: pb::Verdict| pb::Report {
            state: s as i32,
            verdict: v as i32,
            ..Default::default()
        };
        use pb::{JobState as S, Verdict as V};
        assert_eq!(Exit::of_report(&report(S::Succeeded, V::Pass)), Exit::Ok);
        // Warnings are listed; they do not fail an acceptance run.
        assert_eq!(Exit::of_report(&report(S::Succeeded, V::Warn)), Exit::Ok);
        assert_eq!(
            Exit::of_report(&report(S::Succeeded, V::Fail)),
            Exit::Failed
        );
        assert_eq!(Exit::of_report(&report(S::Failed, V::Fail)), Exit::Failed);
        assert_eq!(
            Exit::of_report(&report(S::Cancelled, V::Pass)),
            Exit::Failed
        );
    }

    #[test]
    fn errors_by_type() {
        let usage = anyhow::Error::from(UsageError("--nodes: 0".into()));
        assert_eq!(Exit::of_error(&usage), Exit::Usage);
        use tonic::Status;
        let cases = [
            (Status::not_found("no job `x`"), Exit::NotFound),
            (Status::unavailable("refused"), Exit::Unreachable),
            (Status::deadline_exceeded("slow"), Exit::Unreachable),
            (Status::cancelled("Timeout expired"), Exit::Unreachable),
            (Status::invalid_argument("bad"), Exit::Usage),
            (Status::failed_precondition("5 nodes"), Exit::Failed),
        ];
        for (status, want) in cases {
            let text = status.to_string();
            let e = anyhow::Error::from(status).context("get job");
            assert_eq!(Exit::of_error(&e), want, "{text}");
        }
    }

    #[test]
    fn errors_by_the_clients_sentences() {
        let cases = [
            (
                "cannot reach coordinator at http://127.0.0.1:1: Connection refused (os error 111)",
                Exit::Unreachable,
            ),
            (
                "get job failed: Timeout expired (Cancelled)",
                Exit::Unreachable,
            ),
            ("get job failed: slow (DeadlineExceeded)", Exit::Unreachable),
            (
                "no job `job-9`; `gpuctl jobs` lists the jobs",
                Exit::NotFound,
            ),
            ("report: not found", Exit::NotFound),
            (
                "submit refused by the coordinator: asked for 5 nodes",
                Exit::Failed,
            ),
            (
                "job-1 succeeded but its report could not be read",
                Exit::Failed,
            ),
        ];
        for (text, want) in cases {
            assert_eq!(Exit::of_error(&anyhow!("{text}")), want, "{text}");
        }
        // Context added on the way up does not hide the cause.
        let lost =
            anyhow!("cannot reach coordinator at http://x: gone").context("lost track of job-1");
        assert_eq!(Exit::of_error(&lost), Exit::Unreachable);
    }

    #[test]
    fn exit_code_needs_success_and_pass() {
        use crate::output::fixtures::{nccl_report, stress_report};
        assert_eq!(Exit::of_report(&nccl_report()), Exit::Ok);
        assert_eq!(Exit::of_report(&stress_report()), Exit::Failed);
        let mut r = nccl_report();
        r.state = pb::JobState::Cancelled as i32;
        assert_eq!(Exit::of_report(&r), Exit::Failed);
    }
}

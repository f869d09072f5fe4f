//! Job-spec rules: which workloads exist, the checks of a job's parameters
//! (against `catalogue`), node selectors. The CLI checks a spec before sending it and the coordinator checks
//! it again before storing anything, both with this code, so a bad spec gets the
//! same clear error wherever it is caught.

use crate::catalogue::{check_given, check_shape, err};
use gpuctl_proto::pb::{JobSpec, Node};

pub use crate::catalogue::{parse_memory, MemoryTarget, SpecError, COLLECTIVE_OPS, MODELS};

/// A workload; its parameters are in [`crate::catalogue::PARAMS`].
#[derive(Debug, Clone, Copy)]
pub struct WorkloadDef {
    pub name: &'static str,
    pub help: &'static str,
    /// Runs for `--duration` (otherwise it runs until its work is done).
    pub timed: bool,
}

pub const WORKLOADS: &[WorkloadDef] = &[
    WorkloadDef {
        name: "stress",
        help: "GEMM loop for --duration with a bit-for-bit result check across ranks",
        timed: true,
    },
    WorkloadDef {
        name: "nccl",
        help: "collective bandwidth, nccl-tests style (TCP ring backend on CPU)",
        timed: false,
    },
    WorkloadDef {
        name: "ddp",
        help: "data-parallel training, gradients all-reduced in buckets",
        timed: false,
    },
    WorkloadDef {
        name: "fsdp",
        help: "sharded data-parallel training (flat parameters sharded)",
        timed: false,
    },
    WorkloadDef {
        name: "maxbatch",
        help: "largest batch per GPU before out-of-memory, with a safety margin",
        timed: false,
    },
    WorkloadDef {
        name: "p2p",
        help: "bandwidth inside each node: every GPU pair both ways, and host<->GPU over PCIe",
        timed: false,
    },
];

pub fn workload(name: &str) -> Option<&'static WorkloadDef> {
    WORKLOADS.iter().find(|w| w.name == name)
}

pub fn workload_names() -> Vec<&'static str> {
    WORKLOADS.iter().map(|w| w.name).collect()
}

/// Default run time of timed workloads when none is given.
pub const DEFAULT_DURATION_MS: u64 = 60_000;

/// Timed workloads may run their duration plus this (start-up, reporting)
/// before their workers are killed, unless the spec sets `timeout_ms`.
pub const TIMED_GRACE_MS: u64 = 120_000;
/// What an untimed workload may run, unless the spec sets `timeout_ms`.
pub const DEFAULT_TIMEOUT_MS: u64 = 3_600_000;
/// Grace after a job's deadline before the coordinator fails it itself; the
/// agent kills the workers at the deadline and should report first.
pub const DEADLINE_GRACE_MS: u64 = 10_000;
/// A timed worker ends its work this long before the job's deadline, so its
/// result is sent before the agent kills it.
pub const WORKER_END_MARGIN_MS: u64 = 5_000;

/// How long a job may run before its workers are killed.
pub fn job_budget_ms(spec: &JobSpec) -> u64 {
    let timed = workload(&spec.workload).is_some_and(|w| w.timed);
    if spec.timeout_ms > 0 {
        spec.timeout_ms
    } else if timed {
        spec.duration_ms.saturating_add(TIMED_GRACE_MS)
    } else {
        DEFAULT_TIMEOUT_MS
    }
}

/// A rank that makes no progress for this long fails its job as hung, unless
/// the spec sets `hang_timeout_ms`.
pub const DEFAULT_HANG_TIMEOUT_MS: u64 = 120_000;
/// Bounds of `--hang-timeout`: shorter would catch ranks that are only slow
/// to start; longer than a day is no watch at all.
pub const MIN_HANG_TIMEOUT_MS: u64 = 5_000;
pub const MAX_HANG_TIMEOUT_MS: u64 = 86_400_000;

/// The hang timeout that applies to a job (0 in the spec: the default).
pub fn hang_timeout_ms(spec: &JobSpec) -> u64 {
    if spec.hang_timeout_ms == 0 {
        DEFAULT_HANG_TIMEOUT_MS
    } else {
        spec.hang_timeout_ms
    }
}

/// Progress reports a coordinator takes a second from one job's ranks: at
/// 32,768 ranks a report per rank each second is most of its work.
pub const PROGRESS_REPORTS_PER_S: u64 = 4_096;

/// How often each rank of a job reports progress: every second up to
/// [`PROGRESS_REPORTS_PER_S`] ranks, then less often, but always at least
/// four times per hang timeout, so that a rank that only reports late is
/// never taken for a hung one.
pub fn progress_interval_ms(world_size: u32, spec: &JobSpec) -> u64 {
    let by_size = u64::from(world_size) * 1_000 / PROGRESS_REPORTS_PER_S;
    by_size.min(hang_timeout_ms(spec) / 4).max(1_000)
}

/// The pause before a rank's next progress report: the interval the
/// coordinator asked for, spread over ±25 % by rank and report count. Ranks
/// start together, and 32,768 reports arriving in the same instant every few
/// seconds would hold up everything else the coordinator answers.
pub fn progress_pause_ms(every_ms: u64, rank: u32, sent: u64) -> u64 {
    (every_ms as f64 * (0.75 + 0.5 * spread(u64::from(rank) + sent))) as u64
}

/// When a rank sends its first progress report, in ms after it starts: at
/// once in a job of up to [`PROGRESS_REPORTS_PER_S`] ranks; past that,
/// spread by rank over its first interval, which is a quarter of the hang
/// timeout at most. At once, 131,072 ranks' first reports came in one
/// second, on top of a short job's results.
pub fn first_progress_ms(world_size: u32, spec: &JobSpec, rank: u32) -> u64 {
    let every = progress_interval_ms(world_size, spec);
    if every <= 1_000 {
        return 0;
    }
    (every as f64 * spread(u64::from(rank))) as u64
}

/// `n` spread evenly over [0, 1): consecutive ranks land far apart.
fn spread(n: u64) -> f64 {
    const GOLDEN: f64 = 0.618_033_988_749_895;
    (n as f64 * GOLDEN).fract()
}

/// Checks a spec and fills the defaults the coordinator relies on. Returns the
/// spec to store; on error nothing should be stored or started.
pub fn normalize(spec: &JobSpec) -> Result<JobSpec, SpecError> {
    let mut spec = spec.clone();
    crate::limits::spec(&spec)?;
    let def = workload(&spec.workload).ok_or_else(|| {
        err(
            "workload",
            format!(
                "unknown workload `{}`; choose one of {}",
                spec.workload,
                workload_names().join(", ")
            ),
        )
    })?;
    if !spec.all_nodes && spec.node_count == 0 {
        return Err(err(
            "--nodes",
            "0 is not a node count; give a number of nodes (1 or more) or `all`",
        ));
    }
    for s in &spec.selectors {
        parse_selector(s)?;
    }
    let hang = spec.hang_timeout_ms;
    if hang != 0 && !(MIN_HANG_TIMEOUT_MS..=MAX_HANG_TIMEOUT_MS).contains(&hang) {
        return Err(err(
            "--hang-timeout",
            format!(
                "{hang} ms is out of range: give between {} s and {} h",
                MIN_HANG_TIMEOUT_MS / 1000,
                MAX_HANG_TIMEOUT_MS / 3_600_000
            ),
        ));
    }
    if def.timed && spec.duration_ms == 0 {
        spec.duration_ms = DEFAULT_DURATION_MS;
    }
    spec.params = check_given(def.name, &spec.params)?;
    check_shape(
        def.name,
        &spec.params,
        (!spec.all_nodes).then_some(spec.node_count),
    )?;
    for key in spec.env.keys() {
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(err(
                "--env",
                format!("`{key}` is not an environment variable name; use K=V with K made of letters, digits and _"),
            ));
        }
        if let Some(why) = reserved_env(key) {
            return Err(err("--env", format!("`{key}` {why}; remove it")));
        }
    }
    Ok(spec)
}

/// The names the agent sets for every worker: torchrun's, the GPU it owns,
/// and how it reaches the coordinator with its own credentials. A user's
/// value would give a rank another rank's identity, another GPU or another
/// coordinator, so `--env` may not set them.
pub const RESERVED_ENV: &[&str] = &[
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
    "GPUCTL_COORDINATOR",
    "GPUCTL_COORDINATOR_URLS",
    crate::auth::RANK_SECRET_ENV,
    crate::client::TLS_CA_ENV,
    crate::client::TLS_CERT_ENV,
    crate::client::TLS_KEY_ENV,
];

/// Why `--env` may not set `key`, if it may not.
pub fn reserved_env(key: &str) -> Option<&'static str> {
    RESERVED_ENV.contains(&key).then_some(
        "is set by the agent for each rank (its rank, its GPU, its coordinator and credentials)",
    )
}

/// How a selector compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectorOp {
    Eq,
    Ne,
}

/// `key=value` or `key!=value`. Keys: any agent label, `gpu` (GPU model,
/// case-insensitive substring), `node` (node name), `gpus` (GPU count).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    pub key: String,
    pub op: SelectorOp,
    pub value: String,
}

pub fn parse_selector(text: &str) -> Result<Selector, SpecError> {
    let bad = || {
        err(
            "--selector",
            format!("`{text}` is not a selector; write key=value or key!=value, e.g. gpu=H200 or rack=a1"),
        )
    };
    let (key, op, value) = if let Some((k, v)) = text.split_once("!=") {
        (k, SelectorOp::Ne, v)
    } else if let Some((k, v)) = text.split_once('=') {
        (k, SelectorOp::Eq, v)
    } else {
        return Err(bad());
    };
    let (key, value) = (key.trim(), value.trim());
    let key_ok = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
    if !key_ok || value.is_empty() || value.contains('=') {
        return Err(bad());
    }
    Ok(Selector {
        key: key.to_string(),
        op,
        value: value.to_string(),
    })
}

impl Selector {
    pub fn matches(&self, node: &Node) -> bool {
        let hit = match self.key.as_str() {
            "gpu" => {
                let want = self.value.to_ascii_lowercase();
                !node.gpus.is_empty()
                    && node
                        .gpus
                        .iter()
                        .all(|g| g.name.to_ascii_lowercase().contains(&want))
            }
            "node" | "name" => node.name == self.value,
            "gpus" => node.gpus.len().to_string() == self.value,
            key => node
                .facts
                .as_ref()
                .and_then(|f| f.labels.get(key))
                .is_some_and(|v| *v == self.value),
        };
        match self.op {
            SelectorOp::Eq => hit,
            SelectorOp::Ne => !hit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(workload: &str) -> JobSpec {
        JobSpec {
            workload: workload.into(),
            node_count: 1,
            ..Default::default()
        }
    }

    #[test]
    fn env_may_not_set_what_the_agent_sets_for_a_rank() {
        for key in ["RANK", "CUDA_VISIBLE_DEVICES", "GPUCTL_RANK_SECRET"] {
            let mut s = spec("stress");
            s.env.insert(key.into(), "3".into());
            let e = normalize(&s).unwrap_err();
            assert_eq!(e.field, "--env", "{key}");
            assert!(
                e.to_string().contains(key) && e.to_string().contains("remove it"),
                "{e}"
            );
        }
        let mut s = spec("stress");
        s.env.insert("NCCL_DEBUG".into(), "INFO".into());
        s.env.insert("GPUCTL_NO_ALLOC_STATS".into(), "1".into());
        assert!(normalize(&s).is_ok());
    }

    #[test]
    fn unknown_workload_is_named() {
        let e = normalize(&spec("burn")).unwrap_err();
        assert_eq!(e.field, "workload");
        assert!(e.message.contains("`burn`") && e.message.contains("stress"));
    }

    #[test]
    fn zero_nodes_is_refused() {
        let mut s = spec("stress");
        s.node_count = 0;
        assert_eq!(normalize(&s).unwrap_err().field, "--nodes");
        s.all_nodes = true;
        assert!(normalize(&s).is_ok());
    }

    #[test]
    fn timed_workloads_get_a_duration() {
        assert_eq!(
            normalize(&spec("stress")).unwrap().duration_ms,
            DEFAULT_DURATION_MS
        );
        assert_eq!(normalize(&spec("nccl")).unwrap().duration_ms, 0);
    }

    #[test]
    fn budgets_follow_the_spec() {
        let mut s = JobSpec {
            workload: "stress".into(),
            duration_ms: 60_000,
            ..Default::default()
        };
        assert_eq!(job_budget_ms(&s), 180_000);
        s.timeout_ms = 5_000;
        assert_eq!(job_budget_ms(&s), 5_000);
        let n = JobSpec {
            workload: "nccl".into(),
            ..Default::default()
        };
        assert_eq!(job_budget_ms(&n), 3_600_000);
    }

    #[test]
    fn hang_timeout_is_bounded_and_defaults() {
        let mut s = spec("nccl");
        assert_eq!(
            hang_timeout_ms(&normalize(&s).unwrap()),
            DEFAULT_HANG_TIMEOUT_MS
        );
        s.hang_timeout_ms = 30_000;
        assert_eq!(hang_timeout_ms(&normalize(&s).unwrap()), 30_000);
        for bad in [
            1,
            MIN_HANG_TIMEOUT_MS - 1,
            MAX_HANG_TIMEOUT_MS + 1,
            u64::MAX,
        ] {
            s.hang_timeout_ms = bad;
            let e = normalize(&s).unwrap_err();
            assert_eq!(e.field, "--hang-timeout", "{bad}");
            assert!(
                e.message.contains("5 s") && e.message.contains("24 h"),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn params_are_checked_per_workload() {
        let mut s = spec("nccl");
        s.params.insert("ops".into(), "all_reduce,alltoall".into());
        s.params.insert("min_bytes".into(), "1K".into());
        s.params.insert("max_bytes".into(), "1M".into());
        assert!(normalize(&s).is_ok());
        s.params.insert("ops".into(), "all_reduce,bogus".into());
        assert!(normalize(&s).unwrap_err().message.contains("`bogus`"));
        s.params.insert("ops".into(), "all".into());
        s.params.insert("min_bytes".into(), "2M".into());
        assert_eq!(normalize(&s).unwrap_err().field, "--min-bytes");
        let mut s = spec("stress");
        s.params.insert("factor".into(), "2".into());
        assert!(normalize(&s)
            .unwrap_err()
            .message
            .contains("no parameter `factor`"));
    }

    #[test]
    fn pairs_on_one_node_is_refused_when_the_count_is_known() {
        let mut s = spec("nccl");
        s.params.insert("pattern".into(), "pairs".into());
        assert_eq!(normalize(&s).unwrap_err().field, "--pattern");
        s.node_count = 2;
        assert!(normalize(&s).is_ok());
        s.node_count = 1;
        s.all_nodes = true;
        assert!(normalize(&s).is_ok());
    }

    #[test]
    fn booleans_are_stored_true_or_false() {
        let mut s = spec("stress");
        s.params.insert("with_comm".into(), "yes".into());
        assert_eq!(normalize(&s).unwrap().params["with_comm"], "true");
        s.params.insert("with_comm".into(), "0".into());
        assert_eq!(normalize(&s).unwrap().params["with_comm"], "false");
        s.params.insert("with_comm".into(), "maybe".into());
        assert_eq!(normalize(&s).unwrap_err().field, "--with-comm");
    }

    #[test]
    fn selectors_parse_and_match() {
        assert!(parse_selector("gpu=H200").is_ok());
        assert_eq!(parse_selector("rack!=a1").unwrap().op, SelectorOp::Ne);
        for bad in ["gpu", "=x", "a=", "a==b", "a b=c"] {
            assert_eq!(
                parse_selector(bad).unwrap_err().field,
                "--selector",
                "{bad}"
            );
        }
        let mut node = Node {
            name: "n1".into(),
            ..Default::default()
        };
        node.facts = Some(Default::default());
        node.facts
            .as_mut()
            .unwrap()
            .labels
            .insert("rack".into(), "a1".into());
        node.gpus.push(gpuctl_proto::pb::GpuInfo {
            name: "NVIDIA H200".into(),
            ..Default::default()
        });
        assert!(parse_selector("gpu=h200").unwrap().matches(&node));
        assert!(parse_selector("rack=a1").unwrap().matches(&node));
        assert!(!parse_selector("rack!=a1").unwrap().matches(&node));
        assert!(!parse_selector("gpu=A100").unwrap().matches(&node));
    }

    #[test]
    fn progress_pauses_are_spread_around_the_interval() {
        let pauses: Vec<u64> = (0..1000).map(|r| progress_pause_ms(8_000, r, 0)).collect();
        assert!(pauses.iter().all(|p| (6_000..10_000).contains(p)));
        // Spread, not bunched: every 400 ms slot of the range gets some.
        for slot in 0..10 {
            let lo = 6_000 + slot * 400;
            assert!(pauses.iter().any(|p| (lo..lo + 400).contains(p)), "{lo}");
        }
        let mean = pauses.iter().sum::<u64>() as f64 / 1000.0;
        assert!((mean - 8_000.0).abs() < 100.0, "{mean}");
    }

    #[test]
    fn big_jobs_report_progress_less_often_but_within_their_hang_timeout() {
        let mut spec = JobSpec::default();
        assert_eq!(progress_interval_ms(8, &spec), 1_000);
        assert_eq!(progress_interval_ms(4_096, &spec), 1_000);
        assert_eq!(progress_interval_ms(32_768, &spec), 8_000);
        assert_eq!(
            progress_interval_ms(1 << 20, &spec),
            30_000,
            "a quarter of 120 s"
        );
        spec.hang_timeout_ms = MIN_HANG_TIMEOUT_MS;
        assert_eq!(progress_interval_ms(32_768, &spec), 1_250);
        // The first report: at once up to 4,096 ranks, then spread over the
        // first interval, never past it.
        assert_eq!(first_progress_ms(4_096, &JobSpec::default(), 4_095), 0);
        let firsts: Vec<u64> = (0..131_072)
            .map(|r| first_progress_ms(131_072, &JobSpec::default(), r))
            .collect();
        assert!(firsts.iter().all(|&t| t < 30_000));
        let in_first_second = firsts.iter().filter(|&&t| t < 1_000).count();
        assert!(
            in_first_second < 131_072 / 20,
            "{in_first_second} in the first second"
        );
    }
}

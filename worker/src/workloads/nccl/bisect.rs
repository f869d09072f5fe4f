//! `--pattern bisect`: a search for one slow node by halving.
//!
//! The search itself ([`plan::Search`]) is pure: it names the groups of nodes a
//! round measures and decides from their busbw. This module measures: in a
//! round, the L ranks of each node of a group (GPU i of every node, group rank
//! `position of the node in the group × L + local rank`) open a communicator of
//! their own under the rendezvous prefix `bisect/{round}/{group}/comm`, and run
//! all_reduce at `max_bytes`, out-of-place. The group's rank 0 publishes its
//! busbw under `bisect/{round}/{group}@{its job rank}`, a key only that rank
//! may write; after the round's barrier of all ranks
//! (`barrier/bisect-{round}`, where nodes outside every group wait) each rank
//! reads every group's figure and takes the same decision.

pub mod plan;

use std::cell::RefCell;
use std::time::Duration;

use anyhow::{Context, Result};
use gpuctl_core::catalogue::{NcclParams, NcclPattern};
use gpuctl_core::rendezvous_keys::owned;
use gpuctl_core::units::format_bytes;
use gpuctl_proto::pb::{rank_result::Detail, CollectiveResult};
use tch::Device;

use super::pairs::{check_shape, opener, round_timeout, Opener, Place};
use super::sweep::{config, measure, Peer, SweepConfig};
use super::{bandwidth, report_progress, sizes, Pattern};
use crate::comm::Op;
use crate::context::Ctx;
use crate::rendezvous::{barrier, Rendezvous, Scoped};
use crate::workloads::Outcome;

/// What one rank saw: the rounds (the same on every rank) and the wrong
/// elements of its own groups.
#[derive(Debug, Clone)]
pub struct Bisected {
    pub result: CollectiveResult,
    pub wrong: u64,
    /// "round r nodes a, b" for each of its groups with wrong elements.
    pub wrong_in: Vec<String>,
}

pub fn run(ctx: &Ctx, params: &NcclParams) -> Result<Outcome> {
    let cfg = config(params)?;
    let place = Place::from_env(NcclPattern::Bisect, &ctx.env)?;
    let version = RefCell::new(None);
    let open = opener(ctx, &version);
    let out = bisect(
        &place,
        &cfg,
        ctx.rdzv.as_ref(),
        &open,
        ctx.dev.device,
        round_timeout(ctx),
        params.slow_ratio,
        &report_progress(ctx),
    )?;
    Ok(out
        .rounds_if_carried(&place)
        .into_outcome("bisect", version.take()))
}

impl Bisected {
    /// The rounds dropped unless this rank carries them
    /// ([`gpuctl_core::search::carries_rounds`]); the verdict stays.
    pub fn rounds_if_carried(mut self, place: &Place) -> Self {
        if !gpuctl_core::search::carries_rounds(place.node, place.local_rank) {
            self.result.bisect.clear();
        }
        self
    }

    /// The rank's outcome; wrong elements in `what`'s all_reduces fail it.
    pub fn into_outcome(self, what: &str, nccl_version: Option<String>) -> Outcome {
        let error = (self.wrong > 0).then(|| {
            format!(
                "{} wrong elements in the {what} all_reduce results ({})",
                self.wrong,
                self.wrong_in.join(", ")
            )
        });
        Outcome {
            detail: Detail::Collectives(self.result),
            nccl_version,
            error,
            more_train: Vec::new(),
        }
    }
}

/// This rank's group in `groups`: (group index, rank in the group, group size).
fn my_group(groups: &[Vec<usize>], place: &Place) -> Option<(usize, usize, usize)> {
    let l = place.local_world;
    groups.iter().enumerate().find_map(|(i, g)| {
        let pos = g.iter().position(|&k| k == place.node)?;
        Some((i, pos * l + place.local_rank, g.len() * l))
    })
}

/// A search that names the groups of nodes each round measures and decides
/// from their busbw: bisect's [`plan::Search`], and `--pattern search`'s
/// [`gpuctl_core::search::Search`].
pub trait Rounds {
    /// The round about to be measured (0-based), after [`Rounds::groups`].
    fn round(&self) -> usize;
    /// The groups of the next round, disjoint; `None` when it is over.
    fn groups(&mut self) -> Option<Vec<Vec<usize>>>;
    /// The busbw of each group, in order; what the round decided, in words.
    fn decide(&mut self, busbw: &[f64]) -> String;
}

impl Rounds for plan::Search {
    fn round(&self) -> usize {
        plan::Search::round(self)
    }
    fn groups(&mut self) -> Option<Vec<Vec<usize>>> {
        plan::Search::groups(self)
    }
    fn decide(&mut self, busbw: &[f64]) -> String {
        plan::Search::decide(self, busbw)
    }
}

impl Rounds for gpuctl_core::search::Search {
    fn round(&self) -> usize {
        self.outcome().rounds.saturating_sub(1)
    }
    fn groups(&mut self) -> Option<Vec<Vec<usize>>> {
        self.tests()
    }
    fn decide(&mut self, busbw: &[f64]) -> String {
        gpuctl_core::search::Search::decide(self, busbw)
    }
}

/// Runs the search on this rank; `progress(phase, fraction, busbw of this
/// rank's group in the round just done)`. `open` makes each group's
/// communicator; `round_timeout` bounds the wait at a round's barrier.
#[allow(clippy::too_many_arguments)]
pub fn bisect(
    place: &Place,
    cfg: &SweepConfig,
    rdzv: &dyn Rendezvous,
    open: &Opener,
    dev: Device,
    round_timeout: Duration,
    slow_ratio: f64,
    progress: &dyn Fn(&str, f64, Option<f64>),
) -> Result<Bisected> {
    check_shape(NcclPattern::Bisect, place, rdzv, round_timeout)?;
    let mut search = plan::Search::new(place.nnodes, slow_ratio);
    // About ⌈log₂ N⌉ + 1 rounds for one slow node: a guess for the fraction done.
    let expect = (usize::BITS - (place.nnodes - 1).leading_zeros()) as f64 + 1.0;
    let env = RoundsEnv {
        place,
        cfg,
        rdzv,
        open,
        dev,
        round_timeout,
        progress,
    };
    let mut out = run_rounds(&env, &mut search, NcclPattern::Bisect, expect)?;
    let verdict = search
        .verdict()
        .expect("the loop ends when the search does");
    out.result.bisect_culprit = verdict.culprit.map(|k| k as u32);
    out.result.bisect_note = verdict.note.clone();
    Ok(out)
}

/// What measuring a round needs, whichever search names the groups.
pub struct RoundsEnv<'a> {
    pub place: &'a Place,
    pub cfg: &'a SweepConfig,
    pub rdzv: &'a dyn Rendezvous,
    pub open: &'a Opener<'a>,
    pub dev: Device,
    pub round_timeout: Duration,
    pub progress: &'a dyn Fn(&str, f64, Option<f64>),
}

/// Measures the rounds `search` names until it is over. Keys live under the
/// pattern's name: a group's communicator under `{name}/{round}/{group}/comm`,
/// its busbw at `{name}/{round}/{group}@{job rank of its group rank 0}`, the
/// round's barrier `{name}-{round}`.
pub fn run_rounds(
    env: &RoundsEnv,
    search: &mut dyn Rounds,
    pattern: NcclPattern,
    expect: f64,
) -> Result<Bisected> {
    let RoundsEnv {
        place,
        cfg,
        rdzv,
        open,
        dev,
        round_timeout,
        progress,
    } = *env;
    let name = pattern.name();
    let (l, es) = (place.local_world, cfg.kind.elt_size_in_bytes());
    // The smallest group is two nodes.
    if sizes(Op::AllReduce, cfg.max_bytes, es, 2 * l).count == 0 {
        return Err(gpuctl_core::request::RequestError(format!(
            "--max-bytes {} holds no {} element; give at least {es} bytes",
            cfg.max_bytes, cfg.dtype
        ))
        .into());
    }
    let mut out = Bisected {
        result: CollectiveResult {
            world_size: place.world as u32,
            ..Default::default()
        },
        wrong: 0,
        wrong_in: Vec::new(),
    };
    let mut backend = None;
    while let Some(groups) = search.groups() {
        let r = search.round();
        let phase = format!("{name} round {r}");
        let frac = |k: usize| (k as f64 / (expect + 1.0)).min(0.95);
        progress(&phase, frac(r), None);
        let mut mine = None;
        // Each group's figure, owned by the job rank of its group rank 0.
        let figure =
            |gi: usize| owned(&format!("{name}/{r}/{gi}"), place.first_rank(groups[gi][0]));
        if let Some((gi, g, n)) = my_group(&groups, place) {
            let what = format!("{phase}, nodes {:?}", groups[gi]);
            let members = place.members(&groups[gi]);
            let scoped = Scoped::new(rdzv, &format!("{name}/{r}/{gi}/comm"), members);
            let mut comm = open(g, n, &scoped)
                .with_context(|| format!("{what}: opening their communicator"))?;
            backend.get_or_insert(comm.backend());
            let s = sizes(Op::AllReduce, cfg.max_bytes, es, n);
            let pat = Pattern::new(cfg.kind, n);
            let m = measure(
                comm.as_mut(),
                Op::AllReduce,
                cfg,
                &s,
                &pat,
                dev,
                false,
                Peer::Ring,
                1,
            )
            .with_context(|| format!("{what}: all_reduce {}", format_bytes(s.bytes(es))))?;
            let (t, wrong) = (m.time_us, m.wrong);
            let (alg, bus) = bandwidth(Op::AllReduce, &s, es, n, t);
            if g == 0 {
                tracing::info!(
                    "{what}: all_reduce {} {t:.1} us algbw {alg:.2} busbw {bus:.2} GB/s #wrong {wrong}{}",
                    format_bytes(s.bytes(es)),
                    if m.below_floor { " (below the floor: cut short)" } else { "" },
                );
                // Display of an f64 reads back to the same f64: every rank
                // decides on the very same number.
                rdzv.put(&figure(gi), bus.to_string().as_bytes())?;
            }
            if wrong > 0 {
                tracing::error!("{what}: all_reduce has {wrong} wrong elements");
                out.wrong += wrong;
                out.wrong_in
                    .push(format!("round {r} nodes {:?}", groups[gi]));
            }
            mine = Some(bus);
        }
        barrier(
            rdzv,
            &format!("{name}-{r}"),
            place.rank,
            place.world,
            round_timeout,
        )
        .with_context(|| format!("{phase}: waiting for the other groups"))?;
        let busbw = (0..groups.len())
            .map(|gi| {
                let v = rdzv
                    .get(&figure(gi), round_timeout)
                    .with_context(|| format!("{phase}: group {gi}'s busbw"))?;
                let v = String::from_utf8_lossy(&v);
                v.parse::<f64>()
                    .with_context(|| format!("{phase}: group {gi}'s busbw {v:?}"))
            })
            .collect::<Result<Vec<f64>>>()?;
        let decision = search.decide(&busbw);
        if place.rank == 0 {
            tracing::info!("{phase}: {decision}");
        }
        out.result.bisect.push(gpuctl_core::search::wire::round(
            r, &groups, &busbw, decision,
        ));
        progress(&phase, frac(r + 1), mine);
    }
    out.result.backend = backend.unwrap_or_default().into();
    Ok(out)
}

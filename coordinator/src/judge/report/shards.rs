//! FSDP's shards after training: each rank digests its own fp32 shard
//! (`shard_digest`) and every rank's shard as it gathered them
//! (`gathered_shard_digests`, rank order). For shard `s`, owned by rank `s`:
//!
//! * the ranks other than the owner agree on what they gathered and the
//!   owner's own digest differs: the owner sent something other than its
//!   shard, and is named (with two ranks only when the owner's own gathered
//!   copy agrees with the other rank too: otherwise sender and receiver
//!   cannot be told apart, and both fail saying so);
//! * otherwise the gathered copies are voted on (a tie goes to the copy that
//!   matches the owner's digest), and each rank whose copy differs from the
//!   winner is named: it received something else; with no winner every rank
//!   whose copy differs from the owner's digest fails, asking for a rerun.
//!
//! A correct run has every copy equal to its owner's digest: no finding.
//! Ranks that report no shard digests (ddp, a worker before shard digests)
//! are left out; a shard whose owner reported none is judged by its copies.

use std::collections::BTreeMap;

use gpuctl_proto::pb::{JobSpec, RankResult};

use super::digests::{leaders, short};
use super::ranks::RankStates;

/// One model's shard digests, by rank: (own shard, every shard as gathered).
type Views<'a> = BTreeMap<u32, (&'a str, &'a [String])>;

/// Checks the shards of every fsdp model of the job; returns a note when any
/// were compared.
pub(super) fn check(
    results: &BTreeMap<u32, RankResult>,
    spec: &JobSpec,
    states: &mut RankStates,
) -> Option<String> {
    // By model name: a job trains each model of its list once.
    let mut models: BTreeMap<&str, Views> = BTreeMap::new();
    for (rank, r) in results {
        for t in crate::judge::figures::train_results(r) {
            let fsdp = t.mode == "fsdp" || (t.mode.is_empty() && spec.workload == "fsdp");
            if fsdp && !t.gathered_shard_digests.is_empty() {
                models.entry(t.model.as_str()).or_default().insert(
                    *rank,
                    (t.shard_digest.as_str(), t.gathered_shard_digests.as_slice()),
                );
            }
        }
    }
    if models.is_empty() {
        return None;
    }
    let several = models.len() > 1;
    let mut parts = Vec::new();
    for (model, views) in &models {
        let named = judge_model(views, states);
        let label = if several {
            format!("`{model}`: ")
        } else {
            String::new()
        };
        let shards = views.values().map(|(_, g)| g.len()).max().unwrap_or(0);
        parts.push(if named == 0 {
            format!(
                "{label}all {shards} shards match what {} ranks gathered",
                views.len()
            )
        } else {
            format!("{label}{named} rank(s) named")
        });
    }
    Some(format!(
        "FSDP shards compared with what every rank gathered of them: {}",
        parts.join("; ")
    ))
}

/// Judges every shard of one model; returns how many ranks it failed.
fn judge_model(views: &Views, states: &mut RankStates) -> usize {
    let shards = views.values().map(|(_, g)| g.len()).max().unwrap_or(0);
    let mut failed = std::collections::BTreeSet::new();
    let mut fail = |rank: u32, why: String, failed: &mut std::collections::BTreeSet<u32>| {
        if let Some(st) = states.get_mut(&rank) {
            st.fail(why);
            failed.insert(rank);
        }
    };
    for s in 0..shards as u32 {
        // Every rank's copy of shard s (ranks with a list too short for it
        // gathered something else than the others: their list is judged by
        // its length below).
        let copies: Vec<(u32, &str)> = views
            .iter()
            .filter_map(|(q, (_, g))| g.get(s as usize).map(|d| (*q, d.as_str())))
            .collect();
        let own = views.get(&s).map(|(d, _)| *d).filter(|d| !d.is_empty());
        let others: Vec<&(u32, &str)> = copies.iter().filter(|(q, _)| *q != s).collect();
        let owner_copy = copies.iter().find(|(q, _)| *q == s).map(|(_, d)| *d);
        // The others agree among themselves and not with the owner.
        if let (Some(own), Some((_, first))) = (own, others.first()) {
            if others.iter().all(|(_, d)| d == first) && own != *first {
                if others.len() >= 2 || owner_copy == Some(*first) {
                    fail(
                        s,
                        format!(
                            "silent data corruption: its fsdp shard (digest {}) does not match what it sent: the other {} rank(s) gathered {}",
                            short(own),
                            others.len(),
                            short(first)
                        ),
                        &mut failed,
                    );
                } else {
                    let q = others[0].0;
                    let why = format!(
                        "silent data corruption: rank {s}'s fsdp shard has digest {} and rank {q} gathered {}; with two ranks the sender cannot be told from the receiver (rerun on more ranks to find the odd one)",
                        short(own),
                        short(first)
                    );
                    fail(s, why.clone(), &mut failed);
                    fail(q, why, &mut failed);
                }
                continue;
            }
        }
        // Vote on the copies; a tie goes to the owner's digest.
        let (best, leaders) = leaders(copies.iter().map(|(_, d)| *d));
        let winner = match (leaders.as_slice(), own) {
            ([one], _) => Some(*one),
            (_, Some(own)) if leaders.contains(&own) => Some(own),
            _ => None,
        };
        match winner {
            Some(w) => {
                if own.is_some_and(|o| o != w) {
                    // The majority gathered something the owner does not
                    // hold: it sent something else (its own copy is local).
                    let why = format!(
                        "silent data corruption: its fsdp shard (digest {}) does not match what it sent: {best} of {} ranks gathered {}",
                        short(own.unwrap_or_default()),
                        copies.len(),
                        short(w)
                    );
                    fail(s, why, &mut failed);
                }
                for (q, d) in &copies {
                    if *d != w && !(own.is_some_and(|o| o != w) && *q == s) {
                        let why = format!(
                            "silent data corruption: it received something else of rank {s}'s fsdp shard: gathered {}, {best} of {} ranks gathered {}",
                            short(d),
                            copies.len(),
                            short(w)
                        );
                        fail(*q, why, &mut failed);
                    }
                }
            }
            None => {
                for (q, d) in &copies {
                    if Some(*d) != own {
                        let why = format!(
                            "silent data corruption: the ranks' copies of rank {s}'s fsdp shard disagree with no majority (this rank gathered {}); rerun on more ranks to find the odd one",
                            short(d)
                        );
                        fail(*q, why, &mut failed);
                    }
                }
            }
        }
    }
    // A rank that gathered fewer shards than the others got a different
    // all_gather altogether.
    for (q, (_, g)) in views {
        if g.len() < shards {
            let why = format!(
                "its fsdp result lists {} gathered shard digests where other ranks list {shards}",
                g.len()
            );
            fail(*q, why, &mut failed);
        }
    }
    failed.len()
}

#[cfg(test)]
mod tests {
    use super::super::ranks::RankState;
    use super::*;
    use gpuctl_proto::pb::{rank_result::Detail, TrainResult, Verdict};

    /// A rank of an fsdp run: its own shard and the copies it gathered.
    fn rank(rank: u32, own: &str, gathered: &[&str]) -> (u32, RankResult) {
        let t = TrainResult {
            model: "gpt".into(),
            mode: "fsdp".into(),
            param_digest: "p".into(),
            shard_digest: own.into(),
            gathered_shard_digests: gathered.iter().map(|d| d.to_string()).collect(),
            ..Default::default()
        };
        let r = RankResult {
            rank,
            ok: true,
            detail: Some(Detail::Train(t)),
            ..Default::default()
        };
        (rank, r)
    }

    fn judge(ranks: Vec<(u32, RankResult)>) -> (Option<String>, RankStates) {
        let results: BTreeMap<u32, RankResult> = ranks.into_iter().collect();
        let mut states: RankStates = results
            .keys()
            .map(|r| {
                let st = RankState {
                    verdict: Verdict::Pass,
                    reasons: vec![],
                    stopped: false,
                };
                (*r, st)
            })
            .collect();
        let spec = JobSpec {
            workload: "fsdp".into(),
            ..Default::default()
        };
        let note = check(&results, &spec, &mut states);
        (note, states)
    }

    fn failed(states: &RankStates) -> Vec<u32> {
        states
            .iter()
            .filter(|(_, s)| s.verdict == Verdict::Fail)
            .map(|(r, _)| *r)
            .collect()
    }

    fn reason(states: &RankStates, r: u32) -> String {
        states[&r].reason()
    }

    const ALL: [&str; 4] = ["s0", "s1", "s2", "s3"];

    #[test]
    fn a_correct_run_names_nobody() {
        let (note, st) = judge((0..4).map(|r| rank(r, ALL[r as usize], &ALL)).collect());
        assert_eq!(failed(&st), Vec::<u32>::new());
        let note = note.unwrap();
        assert!(
            note.contains("all 4 shards match what 4 ranks gathered"),
            "{note}"
        );
        let two = ["s0", "s1"];
        let (_, st) = judge(vec![rank(0, "s0", &two), rank(1, "s1", &two)]);
        assert_eq!(failed(&st), Vec::<u32>::new());
    }

    #[test]
    fn ranks_without_shard_digests_are_not_judged() {
        let (note, st) = judge(vec![rank(0, "", &[]), rank(1, "", &[])]);
        assert_eq!(note, None);
        assert_eq!(failed(&st), Vec::<u32>::new());
    }

    #[test]
    fn an_owner_whose_shard_differs_from_what_all_others_gathered_is_named() {
        // Rank 2 holds s2 but every rank, itself included, gathered x2.
        let seen = ["s0", "s1", "x2", "s3"];
        let (_, st) = judge((0..4).map(|r| rank(r, ALL[r as usize], &seen)).collect());
        assert_eq!(failed(&st), [2]);
        assert!(
            reason(&st, 2).contains("does not match what it sent"),
            "{}",
            reason(&st, 2)
        );
        assert!(reason(&st, 2).contains("other 3 rank(s) gathered x2"));
        // Its own copy may be the local, right one: the others still agree.
        let (_, st) = judge(
            (0..4)
                .map(|r| rank(r, ALL[r as usize], if r == 2 { &ALL } else { &seen }))
                .collect(),
        );
        assert_eq!(failed(&st), [2]);
        // With two ranks, when the owner's own copy agrees with the other's.
        let (_, st) = judge(vec![
            rank(0, "s0", &["x0", "s1"]),
            rank(1, "s1", &["x0", "s1"]),
        ]);
        assert_eq!(failed(&st), [0]);
        assert!(reason(&st, 0).contains("does not match what it sent"));
    }

    #[test]
    fn a_rank_that_gathered_something_else_is_named() {
        // Rank 3 received shard 1 wrong; the others agree with its owner.
        let (_, st) = judge(
            (0..4)
                .map(|r| {
                    let bad = ["s0", "x1", "s2", "s3"];
                    rank(r, ALL[r as usize], if r == 3 { &bad } else { &ALL })
                })
                .collect(),
        );
        assert_eq!(failed(&st), [3]);
        let why = reason(&st, 3);
        assert!(
            why.contains("received something else of rank 1's fsdp shard"),
            "{why}"
        );
        assert!(
            why.contains("gathered x1, 3 of 4 ranks gathered s1"),
            "{why}"
        );
        // Three ranks: one odd copy among two others that agree with the owner.
        let three = ["s0", "s1", "s2"];
        let (_, st) = judge(vec![
            rank(0, "s0", &three),
            rank(1, "s1", &["s0", "s1", "x2"]),
            rank(2, "s2", &three),
        ]);
        assert_eq!(failed(&st), [1]);
    }

    #[test]
    fn two_ranks_that_disagree_both_fail_saying_why() {
        // Rank 1 gathered x0 while rank 0 holds and kept s0: either rank 0
        // sent x0 or rank 1 received it; nothing tells which.
        let (_, st) = judge(vec![
            rank(0, "s0", &["s0", "s1"]),
            rank(1, "s1", &["x0", "s1"]),
        ]);
        assert_eq!(failed(&st), [0, 1]);
        assert!(
            reason(&st, 1).contains("cannot be told"),
            "{}",
            reason(&st, 1)
        );
    }

    #[test]
    fn copies_with_no_majority_fail_those_that_differ_from_the_owner() {
        // Shard 0: owner s0 kept it, ranks 1..3 gathered three other things;
        // the tie of four goes to the owner's digest.
        let (_, st) = judge(vec![
            rank(0, "s0", &ALL),
            rank(1, "s1", &["a", "s1", "s2", "s3"]),
            rank(2, "s2", &["b", "s1", "s2", "s3"]),
            rank(3, "s3", &["c", "s1", "s2", "s3"]),
        ]);
        assert_eq!(failed(&st), [1, 2, 3]);
        assert!(reason(&st, 1).contains("received something else"));
        // A short list is its own finding.
        let (_, st) = judge(vec![
            rank(0, "s0", &["s0", "s1", "s2"]),
            rank(1, "s1", &["s0", "s1", "s2"]),
            rank(2, "s2", &["s0", "s1"]),
        ]);
        assert_eq!(failed(&st), [2]);
        assert!(reason(&st, 2).contains("lists 2 gathered shard digests"));
    }
}

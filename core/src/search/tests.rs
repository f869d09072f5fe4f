//! The search against a model fleet: node and link speeds, a healthy spread
//! of ±5 % per measurement, bad nodes and links at a third of the speed.
//! Many random draws per fleet size and culprit count: every culprit found,
//! nothing else blamed, rounds within the targets.

use super::model::{draw, run};
use super::*;

fn ceil_log2(n: usize) -> usize {
    (usize::BITS - (n - 1).leading_zeros()) as usize
}

#[test]
fn every_culprit_is_found_and_nothing_else_is_blamed() {
    for n in [16usize, 64, 256, 1024] {
        for k in [0usize, 1, 2, 4, 8] {
            if k * 2 > n / 8 {
                continue;
            }
            let draws = if n >= 1024 { 20 } else { 60 };
            for seed in 0..draws {
                let (mut m, nodes, links) = draw(n, k, 0.05, seed * 7919 + n as u64 + k as u64);
                let out = run(&mut m);
                let mut got_nodes = BTreeSet::new();
                let mut got_links = BTreeSet::new();
                for b in &out.blamed {
                    match b {
                        Blame::Node {
                            node,
                            first,
                            confirm,
                            ..
                        } => {
                            assert!(*first < 0.8 && *confirm < 0.8, "{b:?}");
                            got_nodes.insert(*node);
                        }
                        Blame::Link { a, b, .. } => {
                            got_links.insert((*a, *b));
                        }
                    }
                }
                let ctx = format!("n={n} k={k} seed={seed}: {out:?}");
                assert_eq!(got_nodes, nodes, "nodes, {ctx}");
                // A slow link can only be found where it is tested; it is
                // never blamed where it is not.
                assert!(got_links.is_subset(&links), "a false link, {ctx}");
                assert_eq!(got_links, links, "links, {ctx}");
                assert!(out.undecided.is_empty(), "{ctx}");
                let log = ceil_log2(n);
                let bound = match k {
                    0 => 3,
                    1 => log + 2,
                    _ => k * log + 3,
                };
                assert!(
                    out.rounds <= bound,
                    "{} rounds > {bound}, {ctx}",
                    out.rounds
                );
            }
        }
    }
}

#[test]
fn a_healthy_fleet_takes_one_round_and_few_tests() {
    let mut m = draw(232, 0, 0.05, 1).0;
    let out = run(&mut m);
    assert_eq!(out.rounds, 1);
    assert!(out.blamed.is_empty());
    // The cluster-readiness engine's 22-57 tests at 232 nodes.
    assert!(out.tests < 22, "{} tests", out.tests);
    let mut m = draw(232, 1, 0.05, 2).0;
    let out = run(&mut m);
    assert_eq!(out.blamed.len(), 1);
    assert!(out.tests < 22 + 10, "{} tests", out.tests);
}

#[test]
fn a_noisy_first_look_is_cleared_not_blamed() {
    // Node 5's group of four and its half measure slow once, and so does
    // node 5's first pair with a cleared node from elsewhere; then it is as
    // fast as any.
    let mut s = Search::new(16, 0.8, None);
    let mut first_pair_of_5 = true;
    while let Some(tests) = s.tests() {
        let f: Vec<f64> = tests
            .iter()
            .map(|t| {
                let round = s.outcome().rounds;
                if (t.len() > 2 && t.contains(&5) && round == 1)
                    || (t.len() == 2 && t.contains(&5) && t.contains(&4) && round == 2)
                {
                    0.3 // its group and its half, once
                } else if t.len() == 2
                    && t.contains(&5)
                    && t.iter().any(|x| !(4..8).contains(x))
                    && first_pair_of_5
                {
                    first_pair_of_5 = false;
                    0.3
                } else {
                    1.0
                }
            })
            .collect();
        let _ = s.decide(&f);
    }
    let out = s.outcome();
    assert!(out.blamed.is_empty(), "{out:?}");
    assert!(
        out.cleared_on_second_look.iter().any(|(n, _)| *n == 5),
        "{out:?}"
    );
}

#[test]
fn with_no_cleared_node_the_search_says_undecided() {
    let mut s = Search::new(2, 0.8, Some(1.0));
    while let Some(tests) = s.tests() {
        let f = vec![0.3; tests.len()];
        let _ = s.decide(&f);
    }
    let out = s.outcome();
    assert!(out.blamed.is_empty());
    assert_eq!(out.undecided, vec![0, 1]);
}

//! The round-robin schedule of `gpuctl submit nccl --pattern pairs`: every pair
//! of nodes meets exactly once, and the pairs of one round are disjoint, so a
//! round's pairs run at the same time. The worker runs it; the coordinator reads
//! it to lay out the link matrix.
//!
//! The circle method: node 0 stays put, the others turn one place a round, and
//! the node at each position meets the one at the mirrored position. An odd
//! number of nodes gets a phantom node; whoever meets it sits the round out.

/// The rounds for `n` nodes: `n − 1` rounds of `n / 2` pairs for even `n`,
/// `n` rounds of `(n − 1) / 2` pairs for odd `n` (one node sits out each).
/// Pairs are `(lower, higher)` node ranks, sorted within a round. Fewer than
/// two nodes have no pair: no round.
pub fn round_robin(n: usize) -> Vec<Vec<(usize, usize)>> {
    if n < 2 {
        return Vec::new();
    }
    // Positions hold nodes 0..m; node n (odd n only) is the phantom.
    let m = n + n % 2;
    let mut ring: Vec<usize> = (0..m).collect();
    let mut rounds = Vec::with_capacity(m - 1);
    for _ in 0..m - 1 {
        let mut round: Vec<(usize, usize)> = (0..m / 2)
            .map(|i| (ring[i], ring[m - 1 - i]))
            .filter(|&(a, b)| a < n && b < n)
            .map(|(a, b)| (a.min(b), a.max(b)))
            .collect();
        round.sort_unstable();
        rounds.push(round);
        // Node at position 0 stays; the rest turn by one.
        ring[1..].rotate_right(1);
    }
    rounds
}

/// The pair of `round` that `node` is in, if it plays that round.
pub fn pair_of(round: &[(usize, usize)], node: usize) -> Option<(usize, usize)> {
    round.iter().copied().find(|&(a, b)| a == node || b == node)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn every_pair_once_and_no_node_twice_in_a_round() {
        for n in 1..=9usize {
            let rounds = round_robin(n);
            let want_rounds = match n {
                0 | 1 => 0,
                _ if n % 2 == 0 => n - 1,
                _ => n,
            };
            assert_eq!(rounds.len(), want_rounds, "n = {n}");
            let mut seen = HashSet::new();
            for (r, round) in rounds.iter().enumerate() {
                assert_eq!(round.len(), n / 2, "n = {n} round {r}: {round:?}");
                let mut busy = HashSet::new();
                for &(a, b) in round {
                    assert!(a < b && b < n, "n = {n} round {r}: pair {a}-{b}");
                    assert!(
                        busy.insert(a) && busy.insert(b),
                        "n = {n} round {r}: a node in two pairs: {round:?}"
                    );
                    assert!(seen.insert((a, b)), "n = {n}: pair {a}-{b} twice");
                }
                // Odd n: exactly one node sits each round out.
                assert_eq!(n - busy.len(), n % 2, "n = {n} round {r}");
            }
            assert_eq!(seen.len(), n * (n.saturating_sub(1)) / 2, "n = {n}");
        }
    }

    #[test]
    fn odd_node_counts_rest_each_node_once() {
        for n in [3usize, 5, 7, 9] {
            let rounds = round_robin(n);
            let mut rested: Vec<usize> = rounds
                .iter()
                .map(|round| {
                    let resting: Vec<usize> =
                        (0..n).filter(|&k| pair_of(round, k).is_none()).collect();
                    assert_eq!(resting.len(), 1, "n = {n}: {round:?}");
                    resting[0]
                })
                .collect();
            rested.sort_unstable();
            assert_eq!(rested, (0..n).collect::<Vec<_>>(), "n = {n}");
        }
    }

    #[test]
    fn small_schedules_read_as_expected() {
        assert_eq!(round_robin(2), vec![vec![(0, 1)]]);
        assert_eq!(
            round_robin(3),
            vec![vec![(1, 2)], vec![(0, 2)], vec![(0, 1)]]
        );
        let r4 = round_robin(4);
        assert_eq!(r4[0], vec![(0, 3), (1, 2)]);
        assert_eq!(pair_of(&r4[0], 2), Some((1, 2)));
        assert_eq!(pair_of(&round_robin(3)[0], 0), None);
    }
}

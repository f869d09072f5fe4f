//! How nccl jobs measure: which ranks measure together ([`NcclPattern`]), the
//! message sizes of a sweep, and which of them bandwidth is judged at. Its
//! own file because the checks at submit, the typed parameters, the suite
//! and the worker's sweeps all ask the same answers, and none of it depends
//! on the rest of the catalogue.

/// Which ranks measure together (`--pattern`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NcclPattern {
    /// nccl-tests' sweep: every collective over every rank of the job.
    All,
    /// Every pair of nodes, in the rounds of [`crate::pairs::round_robin`]: sendrecv
    /// and all_reduce at `max_bytes` between GPU i of one node and GPU i of the other.
    Pairs,
    /// A search for one slow node: all_reduce at `max_bytes` over the whole set,
    /// then over halves of the suspect set measured at the same time, until one
    /// node is left (the worker's `nccl::bisect`).
    Bisect,
    /// Every slow node and link, by adaptive group testing
    /// ([`crate::search`]), each confirmed with other partners.
    Search,
}

impl NcclPattern {
    /// What refuses `pairs` on fewer than two nodes (normalize, else the worker).
    pub const PAIRS_NEED_NODES: &'static str =
        "--pattern pairs needs 2 nodes or more; choose more nodes (--nodes, --selector) or use --pattern all";
    /// What refuses `bisect` on fewer than three nodes: with two, a slow pair
    /// cannot say which of its nodes is slow.
    pub const BISECT_NEED_NODES: &'static str =
        "--pattern bisect needs 3 nodes or more (with 2, nothing tells which of the two is slow); choose more nodes (--nodes, --selector) or use --pattern pairs";

    /// What refuses `search` on fewer than three nodes.
    pub const SEARCH_NEED_NODES: &'static str =
        "--pattern search needs 3 nodes or more (a suspect is confirmed with a node already cleared); choose more nodes (--nodes, --selector) or use --pattern pairs";

    /// The fewest nodes the pattern can run on, and what refuses fewer.
    pub fn min_nodes(self) -> (u32, &'static str) {
        match self {
            NcclPattern::All => (1, ""),
            NcclPattern::Pairs => (2, Self::PAIRS_NEED_NODES),
            NcclPattern::Bisect => (3, Self::BISECT_NEED_NODES),
            NcclPattern::Search => (3, Self::SEARCH_NEED_NODES),
        }
    }

    /// The pattern a suite's stage runs on `nodes` nodes: a search on two
    /// nodes has no third to confirm with, and measures their one link as
    /// pairs do (one home for that choice: the suite runner and the stage's
    /// node count both ask here).
    pub fn in_suite(self, nodes: u32) -> NcclPattern {
        match self {
            NcclPattern::Search if nodes < 3 => NcclPattern::Pairs,
            p => p,
        }
    }

    /// Whether the pattern measures at `max_bytes` only (`min_bytes` does not apply).
    pub fn max_bytes_only(self) -> bool {
        self != NcclPattern::All
    }

    /// The pattern named by a `--pattern` word.
    pub fn parse(word: &str) -> Option<NcclPattern> {
        match word.trim() {
            "all" => Some(NcclPattern::All),
            "pairs" => Some(NcclPattern::Pairs),
            "bisect" => Some(NcclPattern::Bisect),
            "search" => Some(NcclPattern::Search),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            NcclPattern::All => "all",
            NcclPattern::Pairs => "pairs",
            NcclPattern::Bisect => "bisect",
            NcclPattern::Search => "search",
        }
    }
}

/// The sizes of an nccl-tests sweep, in bytes: `min`, then times `factor`
/// up to `max`.
pub fn size_steps(min: u64, max: u64, factor: u64) -> Vec<u64> {
    let mut v = Vec::new();
    let mut s = min.max(1);
    while s <= max {
        v.push(s);
        s = match s.checked_mul(factor.max(2)) {
            Some(x) => x,
            None => break,
        };
    }
    v
}

/// Collective sizes from which bandwidth is judged (nccl-tests' large
/// messages); a sweep that stops below it is judged at its largest size.
pub const BUSBW_MIN_BYTES: u64 = 64 << 20;

/// Timed runs of `iters` at each judged size; the median run is the figure.
/// One run of 20 all_reduces at 64 MiB takes ~7 ms on 4 H100s, and one in
/// four such runs dipped to 0.77x of the others (docs/benchmarks.md,
/// 2026-11-26): a judged figure rests on more than one run.
pub const JUDGED_RUNS: usize = 3;

/// Which sizes of a sweep bandwidth is judged at: every size from
/// [`BUSBW_MIN_BYTES`] up, or the largest when the sweep stops below it.
pub fn judged_sizes(sizes: &[u64]) -> Vec<u64> {
    let large: Vec<u64> = sizes
        .iter()
        .copied()
        .filter(|b| *b >= BUSBW_MIN_BYTES)
        .collect();
    if !large.is_empty() {
        return large;
    }
    sizes.iter().copied().max().into_iter().collect()
}

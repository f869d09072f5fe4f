//! Node warnings that a whole fleet can give at once: a rack's switch going
//! down, or every agent going away, closed 7,402 sessions in one second of
//! a 16,384-node run, one log line each. Each second the first few are said
//! one by one, naming their node; the rest are counted and said together at
//! the next tick, with a few of their names, so that the log stays readable
//! and no node's warning is lost from the count.

use tracing::warn;

/// Warnings of one kind said on their own each second.
const EACH_PER_SECOND: u32 = 20;
/// Nodes named in a summary.
const NAMED: usize = 8;

/// One kind of node warning.
#[derive(Debug, Default)]
pub(super) struct Burst {
    second: u64,
    said: u32,
    left_out: u64,
    names: Vec<String>,
}

impl Burst {
    /// Whether `node`'s warning at `now_ms` is said on its own; if not, it
    /// is counted toward the next [`Burst::summary`].
    pub(super) fn each(&mut self, now_ms: u64, node: &str) -> bool {
        let second = now_ms / 1000;
        if second != self.second {
            self.second = second;
            self.said = 0;
        }
        if self.said < EACH_PER_SECOND {
            self.said += 1;
            return true;
        }
        self.left_out += 1;
        if self.names.len() < NAMED {
            self.names.push(node.to_string());
        }
        false
    }

    /// The warnings not said since the last summary: how many, and the
    /// first few nodes' names.
    pub(super) fn summary(&mut self) -> Option<(u64, Vec<String>)> {
        (self.left_out > 0).then(|| {
            (
                std::mem::take(&mut self.left_out),
                std::mem::take(&mut self.names),
            )
        })
    }
}

/// The kinds of node warning that come in bursts.
#[derive(Debug, Default)]
pub(super) struct Bursts {
    /// An agent's session closed.
    pub(super) closed: Burst,
    /// A node lost: no heartbeat for the node timeout.
    pub(super) lost: Burst,
}

impl Bursts {
    /// Says what each kind left out since the last call (the scheduler's tick).
    pub(super) fn say_left_out(&mut self) {
        if let Some((n, names)) = self.closed.summary() {
            warn!(
                count = n,
                "{n} more agent sessions closed ({}{}); each node is lost unless it reconnects within the node timeout",
                names.join(", "),
                if n as usize > names.len() { ", …" } else { "" }
            );
        }
        if let Some((n, names)) = self.lost.summary() {
            warn!(
                count = n,
                "{n} more nodes lost ({}{})",
                names.join(", "),
                if n as usize > names.len() {
                    ", …"
                } else {
                    ""
                }
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_says_the_first_each_second_and_counts_the_rest() {
        let mut b = Burst::default();
        let said = (0..100)
            .filter(|i| b.each(5_000 + i, &format!("node-{i}")))
            .count();
        assert_eq!(said, EACH_PER_SECOND as usize);
        let (n, names) = b.summary().expect("80 left out");
        assert_eq!(n, 80);
        assert_eq!(names.len(), NAMED);
        assert_eq!(names[0], "node-20");
        assert_eq!(b.summary(), None, "said once");
        // A new second: said on their own again.
        assert!(b.each(6_000, "node-x"));
    }
}

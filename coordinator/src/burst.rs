//! Node warnings that a whole fleet can give at once: a rack's switch going
//! down, or every agent going away. At the end of a 16,384-node run 7,402
//! sessions closed in one second, and 4,400 ended with telemetry dropped,
//! one log line each. Each kind says its first few a second one by one,
//! naming the node; the rest are counted and said together at the
//! scheduler's next tick (or as it stops), with a few of their names, so
//! that the log stays readable and no node is lost from the count.

use std::sync::Mutex;

use tracing::warn;

/// Warnings of one kind said on their own each second.
const EACH_PER_SECOND: u32 = 20;
/// Nodes named in a summary.
const NAMED: usize = 8;

/// An agent's session closed.
pub static SESSIONS_CLOSED: Burst = Burst::new(
    "more agent sessions closed, not each logged; each node is lost unless it reconnects within the node timeout",
);
/// A node lost: no heartbeat for the node timeout.
pub static NODES_LOST: Burst =
    Burst::new("more nodes lost, not each logged: no heartbeat for the node timeout");
/// A session ended with telemetry samples dropped (the amount: samples).
pub static TELEMETRY_DROPPED: Burst = Burst::new(
    "more sessions ended with telemetry samples dropped while the scheduler was busy, not each logged",
);

/// One kind of node warning.
pub struct Burst {
    what: &'static str,
    state: Mutex<State>,
}

struct State {
    second: u64,
    said: u32,
    left_out: u64,
    amount: u64,
    names: Vec<String>,
}

impl Burst {
    const fn new(what: &'static str) -> Burst {
        Burst {
            what,
            state: Mutex::new(State {
                second: 0,
                said: 0,
                left_out: 0,
                amount: 0,
                names: Vec::new(),
            }),
        }
    }

    /// Whether `node`'s warning is said on its own now; if not, it and its
    /// `amount` are counted toward the next [`say_left_out`].
    pub fn each(&self, node: &str, amount: u64) -> bool {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.each_at(now_ms, node, amount)
    }

    fn each_at(&self, now_ms: u64, node: &str, amount: u64) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let second = now_ms / 1000;
        if second != s.second {
            s.second = second;
            s.said = 0;
        }
        if s.said < EACH_PER_SECOND {
            s.said += 1;
            return true;
        }
        s.left_out += 1;
        s.amount += amount;
        if s.names.len() < NAMED {
            s.names.push(node.to_string());
        }
        false
    }

    /// The warnings not said since the last call: how many, their amounts
    /// summed, and the first few nodes' names.
    fn left_out(&self) -> Option<(u64, u64, Vec<String>)> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        (s.left_out > 0).then(|| {
            let names = std::mem::take(&mut s.names);
            (
                std::mem::take(&mut s.left_out),
                std::mem::take(&mut s.amount),
                names,
            )
        })
    }
}

/// Says, for each kind, what was left out since the last call.
pub fn say_left_out() {
    for b in [&SESSIONS_CLOSED, &NODES_LOST, &TELEMETRY_DROPPED] {
        if let Some((n, amount, names)) = b.left_out() {
            let more = if n as usize > names.len() {
                ", …"
            } else {
                ""
            };
            let nodes = format!("{}{more}", names.join(", "));
            warn!(count = n, amount, nodes = %nodes, "{n} {}", b.what);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_says_the_first_each_second_and_counts_the_rest() {
        let b = Burst::new("test");
        let said = (0..100)
            .filter(|i| b.each_at(5_000 + i, &format!("node-{i}"), 2))
            .count();
        assert_eq!(said, EACH_PER_SECOND as usize);
        let (n, amount, names) = b.left_out().expect("80 left out");
        assert_eq!((n, amount), (80, 160));
        assert_eq!(names.len(), NAMED);
        assert_eq!(names[0], "node-20");
        assert!(b.left_out().is_none(), "said once");
        // A new second: said on their own again.
        assert!(b.each_at(6_000, "node-x", 0));
    }
}

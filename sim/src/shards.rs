//! A simulated fleet split over processes. One process holds at most its
//! open-files limit in connections (20,000 on the bench's host, and not
//! raisable there): 16,384 agents reconnecting after a failover ran the
//! simulator, not the coordinator, out of descriptors. Each shard is a
//! `gpuctl-sim fleet --counts` child running a slice of the nodes (and
//! `--own-addresses` where the fleet has them); it prints its counts once
//! registered and every 100 ms after, and [`Shards::counts`] adds up the
//! latest of each.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::counters::Stats;
use crate::fleet::FleetConfig;

/// What a shard prints on each `counts` line.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Counts {
    pub registered: u64,
    pub results_refused: u64,
    pub rpc_errors: u64,
    pub descriptors_short: u64,
    /// Assignments taken, by job.
    pub assignments: Vec<(String, u64)>,
}

const PREFIX: &str = "counts ";

impl Counts {
    pub fn of(stats: &Stats) -> Counts {
        use std::sync::atomic::Ordering::Relaxed;
        Counts {
            registered: stats.registered.load(Relaxed),
            results_refused: stats.results_refused.load(Relaxed),
            rpc_errors: stats.rpc_errors.load(Relaxed),
            descriptors_short: stats.descriptors_short.load(Relaxed),
            assignments: stats.assignments(),
        }
    }

    fn add(&mut self, other: &Counts) {
        self.registered += other.registered;
        self.results_refused += other.results_refused;
        self.rpc_errors += other.rpc_errors;
        self.descriptors_short += other.descriptors_short;
        for (job, n) in &other.assignments {
            match self.assignments.iter_mut().find(|(j, _)| j == job) {
                Some((_, m)) => *m += n,
                None => self.assignments.push((job.clone(), *n)),
            }
        }
    }

    /// Assignments of `job` taken so far.
    pub fn assigned(&self, job: &str) -> u64 {
        self.assignments
            .iter()
            .find(|(j, _)| j == job)
            .map_or(0, |(_, n)| *n)
    }

    /// The line a shard prints.
    pub fn line(&self) -> String {
        format!(
            "{PREFIX}{}",
            serde_json::to_string(self).expect("plain fields")
        )
    }
}

/// The child side: prints `stats`' counts every 100 ms until `stop`, from a
/// thread of its own. On the runtime, behind 8,192 agents' and 65,536 ranks'
/// tasks on a crowded host, the 100 ms tick came every 6-8 s, and the parent
/// read registrations in bursts that were not there.
pub fn print_counts(stats: Arc<Stats>, stop: gpuctl_core::shutdown::Shutdown) {
    std::thread::spawn(move || {
        while !stop.is_cancelled() {
            println!("{}", Counts::of(&stats).line());
            std::thread::sleep(Duration::from_millis(100));
        }
    });
}

/// The `[first, first + nodes)` slices of `nodes` split `parts` ways.
pub fn slices(nodes: usize, parts: usize) -> Vec<(usize, usize)> {
    let parts = parts.clamp(1, nodes.max(1));
    (0..parts)
        .map(|k| {
            let first = nodes * k / parts;
            (first, nodes * (k + 1) / parts - first)
        })
        .filter(|&(_, n)| n > 0)
        .collect()
}

/// The child shards, killed when dropped.
pub struct Shards {
    children: Vec<Child>,
    latest: Arc<Mutex<Vec<Option<Counts>>>>,
}

impl Shards {
    /// Starts a `gpuctl-sim fleet` for each slice but the first (the
    /// caller's own), with `fleet`'s shape and the CPU priority `nice`; their
    /// logs go to `dir/shard-K.log`.
    pub fn start(
        sim: &Path,
        fleet: &FleetConfig,
        parts: usize,
        nice: i32,
        dir: &Path,
    ) -> Result<Shards> {
        let latest = Arc::new(Mutex::new(Vec::new()));
        let mut children = Vec::new();
        for (k, (first, nodes)) in slices(fleet.nodes, parts).into_iter().enumerate().skip(1) {
            let log = std::fs::File::create(dir.join(format!("shard-{k}.log")))?;
            let mut child = Command::new(sim)
                .arg("fleet")
                .args(["--coordinator", &fleet.url])
                .args(["--nodes", &nodes.to_string()])
                .args(["--first-node", &first.to_string()])
                .args(["--gpus", &fleet.gpus.to_string()])
                .args(["--connections", &fleet.connections.min(nodes).to_string()])
                .args(["--interval", &format!("{}ms", fleet.interval.as_millis())])
                .args(fleet.own_addresses.then_some("--own-addresses"))
                .args(["--fleet-nice", &nice.to_string()])
                .arg("--counts")
                .stdout(Stdio::piped())
                .stderr(log)
                .spawn()
                .with_context(|| format!("starting {} fleet", sim.display()))?;
            let out = child.stdout.take().expect("piped");
            latest.lock().unwrap().push(None);
            let (latest, slot) = (latest.clone(), children.len());
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if let Some(json) = line.strip_prefix(PREFIX) {
                        if let Ok(c) = serde_json::from_str::<Counts>(json) {
                            latest.lock().unwrap()[slot] = Some(c);
                        }
                    }
                }
            });
            children.push(child);
        }
        Ok(Shards { children, latest })
    }

    /// Waits until every shard registered its nodes (its first counts).
    pub async fn registered(&mut self, within: Duration, dir: &Path) -> Result<()> {
        let began = Instant::now();
        loop {
            if self.latest.lock().unwrap().iter().all(Option::is_some) {
                return Ok(());
            }
            for (k, c) in self.children.iter_mut().enumerate() {
                if let Ok(Some(status)) = c.try_wait() {
                    bail!(
                        "shard {} of the fleet exited ({status}) before registering; see {}",
                        k + 1,
                        dir.join(format!("shard-{}.log", k + 1)).display()
                    );
                }
            }
            if began.elapsed() > within {
                bail!("the fleet's shards did not register within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `own` counts with the shards' latest added.
    pub fn counts(&self, own: &Stats) -> Counts {
        let mut sum = Counts::of(own);
        for c in self.latest.lock().unwrap().iter().flatten() {
            sum.add(c);
        }
        sum
    }
}

impl Drop for Shards {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_every_node_once() {
        for (nodes, parts) in [(16_384, 2), (7, 3), (3, 8), (1, 1)] {
            let s = slices(nodes, parts);
            assert_eq!(s[0].0, 0);
            let mut next = 0;
            for (first, n) in &s {
                assert_eq!(*first, next, "{nodes} in {parts}: {s:?}");
                next += n;
            }
            assert_eq!(next, nodes, "{nodes} in {parts}: {s:?}");
        }
        assert_eq!(slices(16_384, 2), vec![(0, 8192), (8192, 8192)]);
    }

    #[test]
    fn counts_add_up_by_job() {
        let mut a = Counts {
            registered: 2,
            assignments: vec![("j1".into(), 2)],
            ..Default::default()
        };
        let line = Counts {
            registered: 3,
            descriptors_short: 1,
            assignments: vec![("j1".into(), 3), ("j2".into(), 1)],
            ..Default::default()
        }
        .line();
        let b: Counts = serde_json::from_str(line.strip_prefix(PREFIX).unwrap()).unwrap();
        a.add(&b);
        assert_eq!((a.registered, a.descriptors_short), (5, 1));
        assert_eq!(
            (a.assigned("j1"), a.assigned("j2"), a.assigned("j3")),
            (5, 1, 0)
        );
    }
}

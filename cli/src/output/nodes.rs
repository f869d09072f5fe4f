//! The nodes' listing (`gpuctl nodes`): a row per node with its state, what
//! it runs ranks on, its heartbeat's age and its job; also `-o csv|md`.

use gpuctl_core::units::format_bytes;
use gpuctl_proto::listing::NodeRow;

use crate::output::{self, table::Table};

/// "8 gpu" or "2 cpu": what the node runs ranks on.
fn slots(n: &NodeRow) -> String {
    let kind = if n.model.is_empty() { "cpu" } else { "gpu" };
    format!("{} {kind}", n.slots)
}

pub fn render(rows: &[NodeRow], now: u64) -> String {
    grid(rows, now).render()
}

/// The nodes' table before layout (also `-o csv|md`).
pub fn grid(rows: &[NodeRow], now: u64) -> Table {
    let mut t = Table::new(&[
        "NAME",
        "STATE",
        "RANKS",
        "GPU",
        "SHM",
        "HEARTBEAT",
        "JOB",
        "REASON",
    ])
    .right(&[2]);
    for n in rows {
        let shm = match n.shm_bytes {
            0 => "-".into(),
            b => format_bytes(b),
        };
        t.row([
            n.name.to_string(),
            n.state.label().to_string(),
            slots(n),
            output::dash(n.model),
            shm,
            output::age(n.last_heartbeat_unix_ms, now),
            output::dash(n.job),
            output::truncate(&output::dash(n.reason), 50),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb;

    #[test]
    fn cpu_and_gpu_nodes_render() {
        let cpu = NodeRow {
            name: "local-0",
            state: pb::NodeState::Ready,
            slots: 2,
            last_heartbeat_unix_ms: 9_000,
            shm_bytes: 64 << 20,
            ..Default::default()
        };
        let gpu = NodeRow {
            name: "gpu-1",
            state: pb::NodeState::Busy,
            slots: 8,
            model: "NVIDIA H200",
            job: "job-000007",
            ..Default::default()
        };
        let s = render(&[cpu, gpu], 10_000);
        let lines: Vec<&str> = s.lines().collect();
        assert!(lines[0].starts_with("NAME"));
        assert!(
            lines[1].contains("local-0")
                && lines[1].contains("ready")
                && lines[1].contains("2 cpu")
        );
        assert!(lines[1].contains("64 MiB") && lines[1].contains("1s ago"));
        assert!(
            lines[2].contains("busy")
                && lines[2].contains("8 gpu")
                && lines[2].contains("NVIDIA H200")
        );
        assert!(lines[2].contains("job-000007"));
    }
}

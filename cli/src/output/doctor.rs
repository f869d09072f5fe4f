//! `gpuctl doctor`'s checks as a table (failures first, with their fix) or
//! JSON.

use gpuctl_agent::preflight::{verdict_of, verdict_word, LocalRun};
use gpuctl_proto::pb::PreflightCheck;
use serde_json::json;

use crate::output::{self, table::Table};

/// The whole local run for scripts: every check with its detail and fix,
/// and the host facts the checks looked at.
pub fn json(local: &LocalRun, ok: bool) -> serde_json::Value {
    let f = &local.facts;
    json!({
        "node": f.hostname,
        "ok": ok,
        "checks": local.checks.iter().map(check_json).collect::<Vec<_>>(),
        "facts": {
            "driver_version": f.driver_version,
            "cuda_driver_version": f.cuda_driver_version,
            "nvml_status": f.nvml_status,
            "gpus": local.gpus.iter().map(|g| json!({
                "index": g.index, "uuid": g.uuid, "name": g.name,
                "nvlinks_active": g.nvlinks_active,
            })).collect::<Vec<_>>(),
            "libtorch": f.libtorch,
            "torch_version": f.torch_version,
            "nccl_version": f.nccl_version,
            "shm_bytes": f.shm_bytes,
            "memlock_bytes": f.memlock_bytes,
            "nvidia_peermem": f.nvidia_peermem,
            "ib_devices": f.ib_devices,
            "interfaces": f.interfaces.iter().map(|i| json!({
                "name": i.name, "ipv4": i.ipv4, "mtu": i.mtu, "speed_mbps": i.speed_mbps,
            })).collect::<Vec<_>>(),
        },
    })
}

fn check_json(c: &PreflightCheck) -> serde_json::Value {
    json!({
        "name": c.name,
        "verdict": verdict_word(verdict_of(c)),
        "detail": c.detail,
        "fix": c.fix,
    })
}

/// CHECK, VERDICT, DETAIL, FIX; the whole text (people copy fixes from it).
pub fn render(checks: &[PreflightCheck]) -> String {
    let mut t = Table::new(&["CHECK", "VERDICT", "DETAIL", "FIX"]);
    for c in checks {
        t.row([
            c.name.clone(),
            verdict_word(verdict_of(c)).to_string(),
            output::dash(&c.detail),
            output::dash(&c.fix),
        ]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb::Verdict;

    #[test]
    fn table_has_every_check_and_its_fix() {
        let checks = vec![
            PreflightCheck {
                node: "n".into(),
                name: "shm".into(),
                verdict: Verdict::Warn as i32,
                detail: "/dev/shm is 64 MiB".into(),
                fix: "docker run --shm-size=16g".into(),
            },
            PreflightCheck {
                node: "n".into(),
                name: "libtorch".into(),
                verdict: Verdict::Pass as i32,
                detail: "torch 2.11.0".into(),
                fix: String::new(),
            },
        ];
        let text = render(&checks);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("CHECK"));
        assert!(lines[1].starts_with("shm") && lines[1].contains("warn"));
        assert!(lines[1].ends_with("docker run --shm-size=16g"), "{text}");
        assert!(lines[2].contains("pass") && lines[2].trim_end().ends_with('-'));
        assert_eq!(check_json(&checks[0])["verdict"], "warn");
    }
}

//! The network between nodes: InfiniBand/RoCE ports up and at one rate
//! (`infiniband`), and GPUDirect RDMA (`gpudirect_rdma`) where they are up.
//!
//! Together in one file because both judge NCCL's way between nodes, from
//! the ports `facts.rs` read.

use gpuctl_proto::pb::{PreflightCheck, Verdict};

use super::{check, dash};
use crate::facts::IbPort;

pub fn infiniband(node: &str, ports: &[IbPort]) -> PreflightCheck {
    const NAME: &str = "infiniband";
    if ports.is_empty() {
        return check(
            node,
            NAME,
            Verdict::Pass,
            "no InfiniBand/RoCE device: NCCL uses TCP sockets between nodes".into(),
            "",
        );
    }
    let describe = |p: &IbPort| {
        let mut s = format!("{}/{} {}", p.device, p.port, dash(&p.state));
        if !p.rate.is_empty() {
            s.push_str(&format!(" {}", p.rate));
        }
        if !p.link_layer.is_empty() {
            s.push_str(&format!(" {}", p.link_layer));
        }
        s
    };
    let all = ports.iter().map(describe).collect::<Vec<_>>().join(", ");
    let down: Vec<String> = ports
        .iter()
        .filter(|p| !p.active())
        .map(|p| format!("{}/{} is {}", p.device, p.port, dash(&p.state)))
        .collect();
    if !down.is_empty() {
        let none_up = down.len() == ports.len();
        return check(
            node,
            NAME,
            Verdict::Warn,
            format!(
                "{}{}; ports: {all}",
                down.join(", "),
                if none_up { " (no ACTIVE port: NCCL will not use InfiniBand)" } else { "" }
            ),
            "check cables, switch ports and the subnet manager (`ibstat`, `ibv_devinfo`); leave unused devices out with NCCL_IB_HCA",
        );
    }
    let mut rates: Vec<&str> = ports
        .iter()
        .map(|p| p.rate.as_str())
        .filter(|r| !r.is_empty())
        .collect();
    rates.sort();
    rates.dedup();
    if rates.len() > 1 {
        return check(
            node,
            NAME,
            Verdict::Warn,
            format!("active ports run at different rates ({}); ports: {all}", rates.join(" / ")),
            "a port below its rated speed has a bad cable or transceiver: check with `ibstat` and `mlxlink`",
        );
    }
    check(node, NAME, Verdict::Pass, all, "")
}

pub fn gpudirect_rdma(node: &str, peermem: bool, has_ib: bool, gpu_host: bool) -> PreflightCheck {
    const NAME: &str = "gpudirect_rdma";
    if peermem {
        return check(
            node,
            NAME,
            Verdict::Pass,
            "nvidia_peermem is loaded".into(),
            "",
        );
    }
    if !gpu_host {
        return check(
            node,
            NAME,
            Verdict::Pass,
            "not needed without GPUs".into(),
            "",
        );
    }
    if !has_ib {
        return check(
            node,
            NAME,
            Verdict::Pass,
            "not needed without an active InfiniBand port".into(),
            "",
        );
    }
    check(
        node,
        NAME,
        Verdict::Warn,
        "InfiniBand is up but nvidia_peermem is not loaded: GPU memory crosses the network through host memory (slower)".into(),
        "modprobe nvidia_peermem, and list it in /etc/modules-load.d/ so that it loads at boot",
    )
}

//! A registered node's identity in the certificate's form: what its agent
//! read of the host and its GPUs, nothing the coordinator adds.

use gpuctl_cert::{GpuIdentity, Identity};
use gpuctl_proto::pb::Node;

pub fn of_node(n: &Node) -> Identity {
    let f = n.facts.clone().unwrap_or_default();
    let mut ib = f.ib_devices.clone();
    ib.sort();
    Identity {
        hostname: f.hostname,
        product_serial: f.product_serial,
        board_serial: f.board_serial,
        boot_id: f.boot_id,
        os: f.os,
        kernel: f.kernel,
        cpu_model: f.cpu_model,
        cpu_count: f.cpu_count,
        cpu_ranks: if n.gpus.is_empty() { f.cpu_ranks } else { 0 },
        memory_total_bytes: f.memory_total_bytes,
        driver_version: f.driver_version,
        cuda_driver_version: f.cuda_driver_version,
        nccl_version: f.nccl_version,
        torch_version: f.torch_version,
        agent_version: f.agent_version,
        ib_devices: ib,
        gpus: n
            .gpus
            .iter()
            .map(|g| GpuIdentity {
                index: g.index,
                uuid: g.uuid.clone(),
                name: g.name.clone(),
                serial: g.serial.clone(),
                board_part_number: g.board_part_number.clone(),
                vbios_version: g.vbios_version.clone(),
                inforom_image_version: g.inforom_image_version.clone(),
                memory_total_bytes: g.memory_total_bytes,
                pci_bus_id: g.pci_bus_id.clone(),
                pcie_gen_max: g.pcie_gen_max,
                pcie_width_max: g.pcie_width_max,
                nvlinks_active: g.nvlinks_active,
                nvlink_remotes: g.nvlink_remotes.clone(),
                pcie_paths: g.pcie_paths.clone(),
            })
            .collect(),
    }
}

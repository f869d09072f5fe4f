//! A live node against its certificate: every difference named, so that
//! "the certificate no longer holds" says which GPU, firmware or link moved.

use crate::model::{GpuIdentity, Identity};

/// Each way `live` differs from `certified`, in words; empty when it holds.
/// The boot id and agent version change with every reboot and upgrade
/// without changing the hardware: they are left out.
pub fn differences(certified: &Identity, live: &Identity) -> Vec<String> {
    let mut out = Vec::new();
    let mut field = |name: &str, a: &str, b: &str| {
        if a != b {
            out.push(format!("{name}: certified `{a}`, now `{b}`"));
        }
    };
    field("hostname", &certified.hostname, &live.hostname);
    field(
        "product_serial",
        &certified.product_serial,
        &live.product_serial,
    );
    field("board_serial", &certified.board_serial, &live.board_serial);
    field("os", &certified.os, &live.os);
    field("kernel", &certified.kernel, &live.kernel);
    field("cpu_model", &certified.cpu_model, &live.cpu_model);
    field(
        "driver_version",
        &certified.driver_version,
        &live.driver_version,
    );
    field(
        "cuda_driver_version",
        &certified.cuda_driver_version,
        &live.cuda_driver_version,
    );
    field("nccl_version", &certified.nccl_version, &live.nccl_version);
    field(
        "torch_version",
        &certified.torch_version,
        &live.torch_version,
    );
    field(
        "cpu_count",
        &certified.cpu_count.to_string(),
        &live.cpu_count.to_string(),
    );
    field(
        "cpu_ranks",
        &certified.cpu_ranks.to_string(),
        &live.cpu_ranks.to_string(),
    );
    field(
        "memory_total_bytes",
        &certified.memory_total_bytes.to_string(),
        &live.memory_total_bytes.to_string(),
    );
    field(
        "ib_devices",
        &certified.ib_devices.join(","),
        &live.ib_devices.join(","),
    );
    out.extend(gpu_differences(&certified.gpus, &live.gpus));
    out
}

/// GPUs matched by UUID: one gone, one new, or one whose firmware or
/// attachment changed.
fn gpu_differences(certified: &[GpuIdentity], live: &[GpuIdentity]) -> Vec<String> {
    let mut out = Vec::new();
    for c in certified {
        match live.iter().find(|g| g.uuid == c.uuid) {
            None => out.push(format!("GPU {} ({}) is gone", c.index, c.uuid)),
            Some(l) => {
                let pairs = [
                    ("index", c.index.to_string(), l.index.to_string()),
                    ("serial", c.serial.clone(), l.serial.clone()),
                    (
                        "board_part_number",
                        c.board_part_number.clone(),
                        l.board_part_number.clone(),
                    ),
                    (
                        "vbios_version",
                        c.vbios_version.clone(),
                        l.vbios_version.clone(),
                    ),
                    (
                        "inforom_image_version",
                        c.inforom_image_version.clone(),
                        l.inforom_image_version.clone(),
                    ),
                    ("pci_bus_id", c.pci_bus_id.clone(), l.pci_bus_id.clone()),
                    (
                        "pcie_gen_max",
                        c.pcie_gen_max.to_string(),
                        l.pcie_gen_max.to_string(),
                    ),
                    (
                        "pcie_width_max",
                        c.pcie_width_max.to_string(),
                        l.pcie_width_max.to_string(),
                    ),
                    (
                        "nvlinks_active",
                        c.nvlinks_active.to_string(),
                        l.nvlinks_active.to_string(),
                    ),
                    (
                        "nvlink_remotes",
                        c.nvlink_remotes.join(","),
                        l.nvlink_remotes.join(","),
                    ),
                    ("pcie_paths", c.pcie_paths.join(","), l.pcie_paths.join(",")),
                ];
                for (name, a, b) in pairs {
                    if a != b {
                        out.push(format!(
                            "GPU {} ({}) {name}: certified `{a}`, now `{b}`",
                            c.index, c.uuid
                        ));
                    }
                }
            }
        }
    }
    for l in live {
        if !certified.iter().any(|c| c.uuid == l.uuid) {
            out.push(format!(
                "GPU {} ({}) is new: not certified",
                l.index, l.uuid
            ));
        }
    }
    out
}

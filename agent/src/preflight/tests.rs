use std::collections::BTreeSet;

use gpuctl_proto::pb::{PreflightCheck, Verdict};

use super::checks::{self, MIN_SHM_BYTES};
use super::*;

use crate::facts::fixture::{ib_port, write};

fn by_name<'a>(checks: &'a [PreflightCheck], name: &str) -> &'a PreflightCheck {
    checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no check {name} in {checks:?}"))
}

fn v(c: &PreflightCheck) -> Verdict {
    verdict_of(c)
}

fn gpu(index: u32, name: &str) -> GpuState {
    GpuState {
        index,
        uuid: format!("GPU-{index}"),
        name: name.into(),
        persistence: Some(true),
        ecc: Some(true),
        nvlinks_active: 18,
        nvlinks_present: 18,
        foreign: Vec::new(),
    }
}

fn torch_ok(cuda_lib: bool) -> Result<TorchInfo, String> {
    Ok(TorchInfo {
        location: "/opt/sp".into(),
        version: Some("2.11.0+cu130".into()),
        cuda: Some("13.0".into()),
        has_cuda_lib: cuda_lib,
    })
}

/// A healthy 2-GPU host with InfiniBand: every check passes.
fn healthy() -> Snapshot {
    let mut s = Snapshot::empty("gpu-01");
    s.nvml_status = "ok".into();
    s.driver_version = "580.65.06".into();
    s.cuda_driver_version = "13.0".into();
    s.driver_loaded = true;
    s.gpus = vec![gpu(0, "NVIDIA H200"), gpu(1, "NVIDIA H200")];
    s.pairs = vec![GpuPair {
        a: 0,
        b: 1,
        pcie: "SYS".into(),
    }];
    s.torch = torch_ok(true);
    s.nccl = NcclState::Loaded {
        path: "/opt/sp/nvidia/nccl/lib/libnccl.so.2".into(),
        version: "2.28.9".into(),
    };
    s.shm_bytes = 64 << 30;
    s.memlock_bytes = u64::MAX;
    s.ib_ports = vec![IbPort {
        device: "mlx5_0".into(),
        port: "1".into(),
        state: "ACTIVE".into(),
        rate: "400 Gb/sec (4X NDR)".into(),
        link_layer: "InfiniBand".into(),
    }];
    s.peermem = true;
    s
}

#[test]
fn a_healthy_gpu_host_passes_everything() {
    let checks = evaluate(&healthy());
    assert_eq!(checks.len(), 12);
    for c in &checks {
        assert_eq!(v(c), Verdict::Pass, "{c:?}");
        assert!(c.fix.is_empty(), "a pass has no fix: {c:?}");
        assert_eq!(c.node, "gpu-01");
    }
    assert_eq!(by_name(&checks, "gpus").detail, "2 × NVIDIA H200");
    assert!(by_name(&checks, "topology")
        .detail
        .contains("NVLink 18/18 active on every GPU"));
    assert!(by_name(&checks, "topology").detail.contains("1×SYS"));
    assert!(by_name(&checks, "nccl").detail.starts_with("NCCL 2.28.9"));
    assert_eq!(failures("gpu-01", &checks), None);
}

#[test]
fn shm_size_is_an_input() {
    let c = checks::shm("n", 64 << 20);
    assert_eq!(v(&c), Verdict::Warn);
    assert!(c.detail.contains("64"), "{}", c.detail);
    assert!(
        c.fix.contains("--shm-size") && c.fix.contains("--ipc=host"),
        "{}",
        c.fix
    );
    assert_eq!(v(&checks::shm("n", MIN_SHM_BYTES)), Verdict::Pass);
    assert_eq!(v(&checks::shm("n", 0)), Verdict::Warn);
}

#[test]
fn memlock_matters_only_with_infiniband() {
    let c = checks::memlock("n", 64 * 1024, true);
    assert_eq!(v(&c), Verdict::Warn);
    assert!(c.fix.contains("ulimit -l unlimited") && c.fix.contains("LimitMEMLOCK=infinity"));
    assert_eq!(v(&checks::memlock("n", 64 * 1024, false)), Verdict::Pass);
    assert_eq!(v(&checks::memlock("n", u64::MAX, true)), Verdict::Pass);
}

/// Fixture tree: IB ports up and down, modules with and without peermem,
/// read through the same `Preflight::snapshot` the agent uses.
#[test]
fn infiniband_and_peermem_from_a_fixture_tree() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    let pf = || {
        Preflight::new(
            "fx",
            HostRoot::new(r),
            Err("not found".into()),
            &crate::gpus::GpuInventory::none("unavailable: test"),
            2,
        )
    };
    let none = BTreeSet::new();

    // No IB at all.
    let s = pf().snapshot(&none);
    let c = checks::infiniband("fx", &s.ib_ports);
    assert_eq!(v(&c), Verdict::Pass);
    assert!(c.detail.contains("TCP sockets"));

    ib_port(
        r,
        "mlx5_0",
        "4: ACTIVE",
        "400 Gb/sec (4X NDR)",
        "InfiniBand",
    );
    ib_port(r, "mlx5_1", "1: DOWN", "10 Gb/sec (4X SDR)", "InfiniBand");
    write(
        r,
        "proc/modules",
        "nvidia 1 0 - Live 0x0\nmlx5_ib 2 0 - Live 0x0\n",
    );
    let mut s = pf().snapshot(&none);
    assert_eq!(s.ib_ports.len(), 2);
    let c = checks::infiniband("fx", &s.ib_ports);
    assert_eq!(v(&c), Verdict::Warn);
    assert!(c.detail.starts_with("mlx5_1/1 is DOWN"), "{}", c.detail);
    assert!(
        c.detail
            .contains("mlx5_0/1 ACTIVE 400 Gb/sec (4X NDR) InfiniBand"),
        "{}",
        c.detail
    );
    assert!(!c.detail.contains("no ACTIVE port"));

    // A GPU host with an active IB port and no peermem: warn.
    assert!(!s.peermem);
    s.gpus = vec![gpu(0, "NVIDIA H200")];
    let checks = evaluate(&s);
    let c = by_name(&checks, "gpudirect_rdma");
    assert_eq!(v(c), Verdict::Warn);
    assert!(c.fix.contains("modprobe nvidia_peermem"));
    // The same host without GPUs does not need it.
    assert_eq!(
        v(&checks::gpudirect_rdma("fx", false, true, false)),
        Verdict::Pass
    );

    write(
        r,
        "proc/modules",
        "nvidia_peermem 16384 0 - Live 0x0\nnvidia 1 1 nvidia_peermem, Live 0x0\n",
    );
    let s = pf().snapshot(&none);
    assert!(s.peermem);
    assert_eq!(
        v(&checks::gpudirect_rdma("fx", s.peermem, true, true)),
        Verdict::Pass
    );

    // Every port down: still a warning, saying NCCL will not use IB.
    write(r, "sys/class/infiniband/mlx5_0/ports/1/state", "1: DOWN\n");
    let s = pf().snapshot(&none);
    let c = checks::infiniband("fx", &s.ib_ports);
    assert_eq!(v(&c), Verdict::Warn);
    assert!(c.detail.contains("no ACTIVE port"), "{}", c.detail);
    // ... and then memlock no longer matters.
    assert_eq!(v(&checks::memlock("fx", 1024, false)), Verdict::Pass);
}

#[test]
fn active_ports_at_different_rates_warn() {
    let mut s = healthy();
    let mut slow = s.ib_ports[0].clone();
    slow.device = "mlx5_1".into();
    slow.rate = "200 Gb/sec (4X HDR)".into();
    s.ib_ports.push(slow);
    let c = checks::infiniband("n", &s.ib_ports);
    assert_eq!(v(&c), Verdict::Warn);
    assert!(c.detail.contains("different rates"));
}

#[test]
fn missing_libtorch_fails_and_the_refusal_names_the_fix() {
    let mut s = healthy();
    s.torch = Err("not found in /root/.cache/gpuctl/libtorch-2.11.0 (no such folder)".into());
    let checks = evaluate(&s);
    let c = by_name(&checks, "libtorch");
    assert_eq!(v(c), Verdict::Fail);
    assert!(c.detail.contains("workers cannot start"));
    let msg = failures("gpu-01", &checks).expect("a failing check");
    assert!(
        msg.starts_with("node gpu-01: preflight failed: libtorch: "),
        "{msg}"
    );
    assert!(
        msg.contains("(fix: run scripts/install-libtorch.sh"),
        "{msg}"
    );
    assert_eq!(checks.iter().filter(|c| v(c) == Verdict::Fail).count(), 1);
}

#[test]
fn libtorch_versions_and_cuda() {
    let mut s = healthy();
    s.torch = torch_ok(false);
    let c = checks::libtorch(&s);
    assert_eq!(v(&c), Verdict::Fail, "a GPU host needs libtorch_cuda.so");
    s.gpus.clear();
    assert_eq!(
        v(&checks::libtorch(&s)),
        Verdict::Pass,
        "a CPU host does not"
    );
    s.torch = Ok(TorchInfo {
        location: "/x".into(),
        version: Some("2.9.1+cpu".into()),
        cuda: None,
        has_cuda_lib: false,
    });
    let c = checks::libtorch(&s);
    assert_eq!(v(&c), Verdict::Warn);
    assert!(c.detail.contains("built for 2.11.0"), "{}", c.detail);
}

#[test]
fn driver_too_old_for_torch_cuda_fails() {
    let mut s = healthy();
    s.cuda_driver_version = "12.4".into();
    let c = checks::driver(&s);
    assert_eq!(v(&c), Verdict::Fail);
    assert!(c.detail.contains("CUDA 13.0"), "{}", c.detail);
    s.cuda_driver_version = "13.1".into();
    assert_eq!(v(&checks::driver(&s)), Verdict::Pass);

    // No NVML: fine on a CPU host, a warning where the driver is loaded.
    let mut cpu = Snapshot::empty("c");
    assert_eq!(v(&checks::driver(&cpu)), Verdict::Pass);
    cpu.driver_loaded = true;
    assert_eq!(v(&checks::driver(&cpu)), Verdict::Warn);
}

#[test]
fn nccl_on_gpu_and_cpu_hosts() {
    let mut s = healthy();
    s.nccl = NcclState::NotFound;
    assert_eq!(v(&checks::nccl(&s)), Verdict::Warn);
    s.nccl = NcclState::Broken {
        path: "/x/libnccl.so.2".into(),
        error: "cannot load it".into(),
    };
    assert_eq!(v(&checks::nccl(&s)), Verdict::Fail);
    s.nccl = NcclState::Loaded {
        path: "/x".into(),
        version: "2.21.5".into(),
    };
    assert_eq!(
        v(&checks::nccl(&s)),
        Verdict::Warn,
        "older than the worker's 2.28"
    );
    s.gpus.clear();
    s.nccl = NcclState::NotFound;
    let c = checks::nccl(&s);
    assert_eq!(v(&c), Verdict::Pass);
    assert!(c.detail.contains("CPU-only"));
}

#[test]
fn broken_nccl_in_libtorch_folders_is_found_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let sp = dir.path().join("sp");
    write(&sp, "torch/lib/libtorch_cpu.so", "");
    write(&sp, "torch/version.py", "__version__ = '2.11.0+cpu'\n");
    write(&sp, "nvidia/nccl/lib/libnccl.so.2", "not a library");
    let lt = crate::libtorch::resolve(&sp).unwrap();
    let pf = Preflight::new(
        "fx",
        HostRoot::new(dir.path()),
        Ok(lt),
        &crate::gpus::GpuInventory::none("unavailable: test"),
        1,
    );
    let (s, checks) = pf.run(&BTreeSet::new());
    match &s.nccl {
        NcclState::Broken { path, error } => {
            assert!(path.ends_with("nvidia/nccl/lib/libnccl.so.2"), "{path}");
            assert!(error.starts_with("cannot load it"), "{error}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        v(by_name(&checks, "nccl")),
        Verdict::Warn,
        "CPU host: warn only"
    );
    assert_eq!(v(by_name(&checks, "libtorch")), Verdict::Pass);
    assert_eq!(failures("fx", &checks), None);
    let mut facts = gpuctl_proto::pb::HostFacts::default();
    s.apply_to_facts(&mut facts);
    assert_eq!(facts.torch_version, "2.11.0+cpu");
    assert_eq!(facts.nccl_version, "");
}

#[test]
fn gpu_models_links_modes_and_foreign_processes() {
    let mut s = healthy();
    s.gpus.push(gpu(2, "NVIDIA A100-SXM4-80GB"));
    let c = checks::gpus(&s);
    assert_eq!(v(&c), Verdict::Warn);
    assert!(c.detail.contains("GPU 0, 1: NVIDIA H200"), "{}", c.detail);

    let mut s = healthy();
    s.gpus[1].nvlinks_active = 0;
    let c = checks::topology(&s);
    assert_eq!(v(&c), Verdict::Warn);
    assert!(
        c.detail.starts_with("GPU 1 has NVLink but no active link"),
        "{}",
        c.detail
    );
    assert!(c.fix.contains("fabricmanager"));
    s.gpus[1].nvlinks_active = 12;
    let c = checks::topology(&s);
    assert_eq!(v(&c), Verdict::Warn);
    assert!(c.detail.contains("GPU 1 has 12 of 18"), "{}", c.detail);
    // Links that did not answer are unknown: a GPU whose reads failed is
    // not called short of links.
    s.gpus[1].nvlinks_present = 12;
    assert_eq!(v(&checks::topology(&s)), Verdict::Pass);
    // PCIe-only GPUs (no NVLink at all) are not a problem.
    for g in &mut s.gpus {
        g.nvlinks_active = 0;
        g.nvlinks_present = 0;
    }
    assert_eq!(v(&checks::topology(&s)), Verdict::Pass);

    let mut s = healthy();
    s.gpus[0].persistence = Some(false);
    s.gpus[1].ecc = Some(false);
    let checks = evaluate(&s);
    let c = by_name(&checks, "persistence_mode");
    assert_eq!((v(c), c.detail.as_str()), (Verdict::Warn, "off on GPU 0"));
    assert!(c.fix.contains("nvidia-smi -pm 1"));
    let c = by_name(&checks, "ecc_mode");
    assert_eq!((v(c), c.detail.as_str()), (Verdict::Warn, "off on GPU 1"));

    let mut s = healthy();
    s.gpus[1].foreign.push(GpuProcess {
        pid: 4242,
        used_bytes: Some(20 << 30),
        command: "python3".into(),
    });
    let c = checks::gpu_processes(&s);
    assert_eq!(v(&c), Verdict::Warn);
    assert!(
        c.detail.contains("GPU 1: pid 4242 (python3) 20480 MiB"),
        "{}",
        c.detail
    );
    // Warnings never refuse an assignment.
    assert_eq!(failures("n", &evaluate(&s)), None);
}

#[test]
fn a_cpu_host_without_anything_fails_only_on_libtorch() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("dev/shm")).unwrap();
    let pf = Preflight::new(
        "cpu-1",
        HostRoot::new(dir.path()),
        Err("--libtorch /nope: no such folder".into()),
        &crate::gpus::GpuInventory::none("unavailable: test"),
        3,
    );
    let (s, checks) = pf.run(&BTreeSet::new());
    assert!(s.shm_bytes > 0, "statvfs of the fixture's dev/shm");
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| v(c) == Verdict::Fail)
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(failed, vec!["libtorch"]);
    assert_eq!(by_name(&checks, "gpus").detail, "no GPU: 3 CPU ranks");
    assert!(failures("cpu-1", &checks)
        .unwrap()
        .contains("--libtorch /nope"));
}

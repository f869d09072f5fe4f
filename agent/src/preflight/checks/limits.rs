//! The host's limits on the agent's process: `/dev/shm`'s size (`shm`) and
//! the locked-memory limit (`memlock`).
//!
//! Together in one file because both are container or service settings
//! (Docker's `--shm-size`, `--ulimit memlock`, systemd), not hardware, and
//! both are fixed in the same place.

use gpuctl_core::units::format_bytes;
use gpuctl_proto::pb::{PreflightCheck, Verdict};

use super::check;

/// `/dev/shm` below this gets a warning: NCCL's shared-memory transport and
/// data loaders need more than Docker's default 64 MiB.
pub const MIN_SHM_BYTES: u64 = 1 << 30;

/// `bytes` is the size of `/dev/shm` (0: missing or unreadable).
pub fn shm(node: &str, bytes: u64) -> PreflightCheck {
    const FIX: &str = "give the agent's container more shared memory: docker run --shm-size=16g (or --ipc=host); Kubernetes: an emptyDir with medium: Memory mounted at /dev/shm";
    if bytes == 0 {
        return check(
            node,
            "shm",
            Verdict::Warn,
            "/dev/shm is missing or unreadable".into(),
            FIX,
        );
    }
    if bytes < MIN_SHM_BYTES {
        return check(
            node,
            "shm",
            Verdict::Warn,
            format!(
                "/dev/shm is {}, under {}: NCCL's shared-memory transport can fail",
                format_bytes(bytes),
                format_bytes(MIN_SHM_BYTES)
            ),
            FIX,
        );
    }
    check(
        node,
        "shm",
        Verdict::Pass,
        format!("/dev/shm is {}", format_bytes(bytes)),
        "",
    )
}

/// `limit` is RLIMIT_MEMLOCK (`u64::MAX`: unlimited).
pub fn memlock(node: &str, limit: u64, has_ib: bool) -> PreflightCheck {
    let shown = if limit == u64::MAX {
        "unlimited".to_string()
    } else {
        format_bytes(limit)
    };
    if limit != u64::MAX && has_ib {
        return check(
            node,
            "memlock",
            Verdict::Warn,
            format!("locked-memory limit is {shown}: RDMA over InfiniBand needs it unlimited"),
            "run the agent with `ulimit -l unlimited` (systemd: LimitMEMLOCK=infinity; Docker: --ulimit memlock=-1)",
        );
    }
    let why = if has_ib || limit == u64::MAX {
        ""
    } else {
        " (no InfiniBand: enough)"
    };
    check(
        node,
        "memlock",
        Verdict::Pass,
        format!("locked-memory limit is {shown}{why}"),
        "",
    )
}

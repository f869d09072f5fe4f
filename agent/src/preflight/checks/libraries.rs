//! The libraries the workers load: libtorch (`libtorch`: found, the version
//! the worker is built for, with CUDA on a GPU host) and NCCL (`nccl`:
//! loadable, new enough).
//!
//! Together in one file because both judge what the worker will load at
//! start, found through the same `--libtorch` folders.

use gpuctl_proto::pb::{PreflightCheck, Verdict};

use super::check;
use crate::libtorch::TORCH_VERSION;
use crate::preflight::{libs::major_minor, NcclState, Snapshot};

/// The NCCL the worker is built for (cudarc's `nccl-02028`).
pub const MIN_NCCL: (u32, u32) = (2, 28);

pub fn libtorch(s: &Snapshot) -> PreflightCheck {
    const NAME: &str = "libtorch";
    let n = &s.node;
    let t = match &s.torch {
        Err(e) => {
            return check(
                n,
                NAME,
                Verdict::Fail,
                format!("{e}: workers cannot start"),
                "run scripts/install-libtorch.sh, or pass --libtorch DIR (a site-packages holding torch/, or a libtorch folder)",
            )
        }
        Ok(t) => t,
    };
    let Some(v) = &t.version else {
        return check(
            n,
            NAME,
            Verdict::Warn,
            format!(
                "found in {}, but without torch/version.py or build-version: version unknown",
                t.location
            ),
            &format!(
                "point --libtorch at a torch {TORCH_VERSION} install (scripts/install-libtorch.sh)"
            ),
        );
    };
    let base = v.split('+').next().unwrap_or(v);
    if base != TORCH_VERSION {
        return check(
            n,
            NAME,
            Verdict::Warn,
            format!("torch {v} in {}; the worker is built for {TORCH_VERSION}", t.location),
            &format!("install torch {TORCH_VERSION} (scripts/install-libtorch.sh) and pass --libtorch to it"),
        );
    }
    if !s.gpus.is_empty() && !t.has_cuda_lib {
        return check(
            n,
            NAME,
            Verdict::Fail,
            format!("torch {v} in {} has no libtorch_cuda.so: GPU workers cannot use CUDA", t.location),
            &format!("pass --libtorch with a full CUDA build of torch {TORCH_VERSION} (pip install torch=={TORCH_VERSION} into a folder)"),
        );
    }
    check(
        n,
        NAME,
        Verdict::Pass,
        format!("torch {v} in {}", t.location),
        "",
    )
}

pub fn nccl(s: &Snapshot) -> PreflightCheck {
    const NAME: &str = "nccl";
    let n = &s.node;
    let gpu_host = !s.gpus.is_empty();
    const FIX_INSTALL: &str = "pip install nvidia-nccl-cu13 into libtorch's site-packages (pip install --target), or pass --libtorch with a full torch install";
    match &s.nccl {
        NcclState::NotFound if gpu_host => check(
            n,
            NAME,
            Verdict::Warn,
            "no libnccl.so.2 in libtorch's folders: GPU workers may load another NCCL than libtorch_cuda, or none".into(),
            FIX_INSTALL,
        ),
        NcclState::NotFound => check(
            n,
            NAME,
            Verdict::Pass,
            "not needed on a CPU-only host (workers use the TCP ring)".into(),
            "",
        ),
        NcclState::Broken { path, error } => check(
            n,
            NAME,
            if gpu_host { Verdict::Fail } else { Verdict::Warn },
            format!("{path}: {error}"),
            FIX_INSTALL,
        ),
        NcclState::Loaded { path, version } => {
            let old = major_minor(version).is_some_and(|v| v < MIN_NCCL);
            if old && gpu_host {
                check(
                    n,
                    NAME,
                    Verdict::Warn,
                    format!("NCCL {version} ({path}); the worker is built for NCCL {}.{} or newer", MIN_NCCL.0, MIN_NCCL.1),
                    "install the NCCL that torch 2.11 ships (pip install nvidia-nccl-cu13) into libtorch's site-packages",
                )
            } else {
                check(n, NAME, Verdict::Pass, format!("NCCL {version} ({path})"), "")
            }
        }
    }
}

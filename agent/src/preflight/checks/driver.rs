//! The `driver` check: an NVIDIA driver that NVML can use, and new enough
//! for the CUDA torch was built for.
//!
//! Its own file because it is the one check that judges the driver against
//! libtorch, and the one that tells a CPU-only host from a GPU host whose
//! GPUs the agent cannot see (each case with its own fix).

use gpuctl_proto::pb::{PreflightCheck, Verdict};

use super::{check, dash};
use crate::preflight::{libs::major_minor, Snapshot};

pub fn driver(s: &Snapshot) -> PreflightCheck {
    const NAME: &str = "driver";
    let n = &s.node;
    if s.gpus.is_empty() {
        if s.nvml_status.starts_with("not used") {
            return check(
                n,
                NAME,
                Verdict::Pass,
                format!("GPUs {}", s.nvml_status),
                "",
            );
        }
        if s.nvml_status.starts_with("ok") {
            return check(
                n,
                NAME,
                Verdict::Warn,
                format!("driver {} loaded, but NVML lists no GPU: the node offers CPU ranks only", s.driver_version),
                "check `nvidia-smi`; in a container, expose the GPUs (--gpus all, or the NVIDIA device plugin)",
            );
        }
        if s.driver_loaded {
            return check(
                n,
                NAME,
                Verdict::Warn,
                format!("the NVIDIA driver is loaded but NVML cannot be used ({}): the node offers CPU ranks only", s.nvml_status),
                "make libnvidia-ml.so.1 loadable by the agent (in a container: the NVIDIA container toolkit, --gpus all)",
            );
        }
        return check(
            n,
            NAME,
            Verdict::Pass,
            "no NVIDIA driver: CPU-only host".into(),
            "",
        );
    }
    let mut detail = format!(
        "driver {}, CUDA {}",
        dash(&s.driver_version),
        dash(&s.cuda_driver_version)
    );
    let torch_cuda = s.torch.as_ref().ok().and_then(|t| t.cuda.clone());
    if let (Some(tc), Some(dc)) = (
        torch_cuda.as_deref().and_then(major_minor),
        major_minor(&s.cuda_driver_version),
    ) {
        detail.push_str(&format!("; torch is built for CUDA {}.{}", tc.0, tc.1));
        // CUDA's minor-version compatibility: the same major is enough.
        if dc.0 < tc.0 {
            return check(
                n,
                NAME,
                Verdict::Fail,
                format!("{detail}, which this driver (CUDA {}.{}) cannot run", dc.0, dc.1),
                &format!("install an NVIDIA driver that supports CUDA {}.{} (CUDA 13 needs R580 or newer), or use a torch built for CUDA {}", tc.0, tc.1, dc.0),
            );
        }
    }
    check(n, NAME, Verdict::Pass, detail, "")
}

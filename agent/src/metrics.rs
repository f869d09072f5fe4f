//! Placeholder for the agent's HTTP `/metrics` endpoint (issue 4, not built
//! yet). It will serve Prometheus text: per-GPU samples from the NVML handle
//! that `gpus::GpuInventory` keeps, and the live worker count from
//! `workers::Workers::live_workers`. `crate::run` marks where it is started.

//! gpuctl-sim: a simulated fleet (fake agents and workers speaking gpuctl.v1
//! to a real coordinator) and the coordinator's scale bench built on it
//! (docs/benchmarks.md, "Coordinator at fleet scale").

pub mod allocator;
pub mod bench;
pub mod counters;
pub mod culprits;
pub mod fleet;
pub mod host;
pub mod priority;
pub mod probe;
pub mod ranks;
pub mod search;
pub mod search_ranks;
pub mod shards;

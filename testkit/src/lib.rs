//! What gpuctl's tests share, so that each side of a connection is faked
//! once and a healthy GPU is written down once:
//!
//! - [`coordinator`]: a fake coordinator serving `AgentService` on loopback,
//!   for the agent's tests: it records what the agent sends and lets the test
//!   answer, refuse jobs, be away and end sessions.
//! - [`agent`]: a fake agent for the coordinator's tests: it registers, opens
//!   its session, heartbeats and acks, and hands the test what the
//!   coordinator sent.
//! - [`gpu`] and [`host`]: fixtures, a healthy H200 (sample, inventory) and
//!   hosts, overridden field by field with struct update syntax.
//! - [`ports`]: loopback ports for servers a test starts by number.
//!
//! Only `gpuctl-core` underneath: the crates whose tests use this one take it
//! as a dev-dependency without a cycle. `gpuctl-sim` takes it as a plain
//! dependency for the same healthy H200 its simulated agents report.

pub mod agent;
pub mod coordinator;
pub mod gpu;
pub mod host;
pub mod ports;

pub use agent::FakeAgent;
pub use coordinator::{FakeCoordinator, FakeSession};
pub use ports::free_port;

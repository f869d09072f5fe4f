//! The nodes' life. [`node`] is the pure state machine that decides a
//! node's state (Ready, Busy, Lost) from what happens to it; the scheduler
//! owns the nodes (`scheduler/state.rs`) and applies what the machine says.
//! A newcomer looking for where a node goes lost or comes back reads
//! `fleet/node.rs` alone. [`pace`] says how often the fleet's agents send
//! heartbeats and telemetry, spaced out as the fleet grows.

pub mod node;
pub mod pace;

pub use node::{transition, Effects, Life, NodeEvent};

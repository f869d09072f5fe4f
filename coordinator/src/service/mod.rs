//! The three gRPC services. Handlers are thin: they check what they can alone,
//! turn the call into a scheduler event and wait for the answer.

pub mod agent;
pub mod job;
pub mod worker;

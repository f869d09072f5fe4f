//! gpuctl coordinator: the node inventory, job planning and scheduling,
//! rendezvous for workers, results and reports, with state behind the
//! [`store::Store`] trait. `main.rs` only parses flags and calls [`server::run`].

pub mod burst;
pub mod cert;
pub mod config;
pub mod error;
pub mod fleet;
pub mod fleet_view;
pub mod history;
pub mod jobs;
pub mod judge;
pub mod logs;
pub mod metrics;
pub mod plan;
pub mod refusals;
pub mod rendezvous;
pub mod runtime;
pub mod scheduler;
pub mod server;
pub mod service;
pub mod standby;
pub mod store;

pub use config::Config;

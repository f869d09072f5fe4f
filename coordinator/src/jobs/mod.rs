//! A job's life and its time rules. [`life`] says which step may move a job
//! from which state (Pending, Running, ended). [`timing`] owns every deadline the coordinator keeps
//! for a running job (its budget from start, the grace after it, how long a
//! restarted coordinator waits for agents to hand jobs back) and which hang
//! timeout applies; [`hang`] decides which rank hung, counting silence only
//! while ranks could be heard ([`hearing`]). All are pure: the
//! scheduler (`scheduler/jobs.rs`) reads its clock once and asks them. The
//! durations themselves are the job spec's (`gpuctl_core::spec`); a node's
//! own timeout (silence) is the node machine's (`crate::fleet::node`).

pub mod hang;
pub mod hearing;
pub mod life;
pub mod timing;

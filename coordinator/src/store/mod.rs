//! State storage. [`Store`] is the small async key-value trait a backend implements
//! (redb, or etcd in [`etcd`]); [`StateStore`] is the typed layer on top that knows
//! the key space of docs/architecture.md ("Stored state") and encodes the
//! protobuf messages, so the rest of the coordinator never builds a key by hand.
//!
//! This file defines nothing: it names the modules and hands their public
//! names on, so that `crate::store::…` stays one path whichever file a name
//! lives in, and no module of `store/` imports through it.

mod backend;
mod batch;
pub mod etcd;
pub mod etcd_access;
pub mod history_log;
mod key_file;
pub mod keys;
pub mod redb;
mod sizes;
mod state;
pub mod writer;

pub use self::backend::{Entries, SharedEntries, Store, StoreError, StoreResult};
pub use self::batch::Batch;
pub use self::history_log::{HistoryWrite, Since};
pub use self::redb::RedbStore;
pub use self::state::{SharedBatch, StateStore};
pub use self::writer::Durable;
